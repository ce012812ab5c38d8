"""What happened in one step, one event per allocator or scheduler decision."""
from __future__ import annotations

from dataclasses import dataclass, field

ADMIT = "admit"  # a waiting sequence starts running (detail: cached_tokens, recompute)
ALLOCATE = "allocate"  # blocks (or a contiguous reservation) taken at admission
APPEND = "append"  # a running sequence took a new block for its next tokens
COW = "cow"  # copy-on-write of a shared block (detail: src, dst)
CACHE_HIT = "cache_hit"  # prefix-cache hit at admission (detail: blocks, tokens)
FORK = "fork"  # a prefilled sequence split into n samples sharing every block
PREEMPT_SWAP = "preempt_swap"  # blocks copied to the host pool (detail: blocks, host_blocks)
PREEMPT_RECOMPUTE = "preempt_recompute"  # blocks freed; re-prefilled later (detail: reason)
SWAP_IN = "swap_in"  # host blocks copied back to fresh device blocks
FINISH = "finish"  # detail: reason ("stop" | "length"), why
REJECT = "reject"  # detail: reason (words, with the numbers)

EVENT_KINDS = (
    ADMIT,
    ALLOCATE,
    APPEND,
    COW,
    CACHE_HIT,
    FORK,
    PREEMPT_SWAP,
    PREEMPT_RECOMPUTE,
    SWAP_IN,
    FINISH,
    REJECT,
)


@dataclass
class Event:
    """One decision. ``detail`` holds JSON-native values only (ints, strs, lists)."""

    kind: str
    seq_id: int  # -1 when the request never got a sequence (a rejection)
    request_id: str
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "seq": self.seq_id, "request": self.request_id, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> "Event":
        return cls(kind=data["kind"], seq_id=int(data["seq"]), request_id=str(data["request"]), detail=dict(data["detail"]))
