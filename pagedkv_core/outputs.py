"""What a request produced: one pair of classes for ``Engine.step`` and for ``LLM``.

The engine works in token ids only, so it leaves the text fields unset (None). ``LLM`` returns
the same classes with the text filled in: the prompt as given and each sample's decoded answer.
Keeping one pair means a page or a test can hand an engine output and an LLM output to the same
code, and a field added here reaches both.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field


class TokenIds(Sequence):
    """A read-only view of tokens ``[start, stop)`` of a sequence's token list, as it was at one
    step. The list only ever grows, so the view stays true without copying it: an engine step
    that adds one token per request costs one token per request, not the whole answer again."""

    __slots__ = ("_tokens", "_start", "_stop")

    def __init__(self, tokens: list[int], start: int, stop: int):
        self._tokens, self._start, self._stop = tokens, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._tokens[self._start : self._stop][i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        return self._tokens[self._start + i]

    def __iter__(self):
        return iter(self._tokens[self._start : self._stop])

    def __eq__(self, other) -> bool:
        if isinstance(other, (TokenIds, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a request."""

    index: int  # sample index (0 .. n-1)
    token_ids: Sequence[int]  # all output tokens so far (a view; list(...) copies)
    new_token_ids: list[int] = field(default_factory=list)  # the tokens this step added
    finish_reason: str | None = None  # "stop" | "length" | "rejected" | None while running
    text: str | None = None  # decoded answer (LLM: once the request finishes, "" before); None from the engine


@dataclass(slots=True)
class RequestOutput:
    """The result of one prompt so far: its ``n`` samples in ``outputs``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # request level: "rejected", "length" if any sample, else "stop"
    reject_reason: str | None = None  # why the engine refused it, in words with the numbers
    prompt: str | None = None  # the prompt text as given to LLM (None for token-id prompts and the engine)

    def to_json(self) -> dict:
        return {
            "id": self.request_id,
            "prompt": self.prompt,
            "prompt_token_ids": self.prompt_token_ids,
            "outputs": [{**dataclasses.asdict(o), "token_ids": list(o.token_ids)} for o in self.outputs],
            "finish_reason": self.finish_reason,
            "reject_reason": self.reject_reason,
        }


@dataclass
class StreamDelta:
    """What one engine step added to one sample (``LLM.stream``)."""

    request_id: str
    index: int  # sample index
    text: str  # new text since the previous delta of this sample (may be "")
    token_ids: list[int]  # new token ids
    finished: bool
    finish_reason: str | None
    step: int
