"""What ``Engine.step`` returns for each request that changed in a step."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One sample of a request."""

    index: int  # sample index (0 .. n-1)
    token_ids: list[int]  # all output tokens so far (a copy)
    new_token_ids: list[int]  # the tokens this step added
    finish_reason: str | None  # "stop" | "length" | "rejected" | None while running


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # request level: "rejected", "length" if any sample, else "stop"
    reject_reason: str | None = None  # words, with the numbers
