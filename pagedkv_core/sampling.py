"""Per-request sampling parameters (the knobs a client sends with a prompt)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_SAMPLES = 256  # parallel samples per request (n)
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    temperature == 0 means greedy. ``seed`` makes sampling reproducible: the random draw for
    sample ``i`` at output position ``p`` depends only on (seed, i, p), so a sequence that is
    preempted and recomputed draws exactly the same tokens again.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1  # parallel samples that share the prompt's blocks (fork + copy-on-write)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def whole(name: str, lo: int, hi: int | None = None) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be a whole number, got {v!r}")
            if v < lo or (hi is not None and v > hi):
                raise ValueError(f"{name} must be >= {lo}" + (f" and <= {hi:,}" if hi is not None else "") + f", got {v:,}")

        whole("max_tokens", 1)
        whole("top_k", 0)
        whole("n", 1, MAX_SAMPLES)
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a whole number >= 0, got {self.seed!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
