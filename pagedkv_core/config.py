"""Engine settings, validated once at construction.

Every invalid value raises :class:`ConfigError` with a one-line message that names the
setting and the bad value, so that the CLI can print it as is and exit with code 2.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

ALLOCATORS = ("paged", "contiguous")
PREEMPTION_MODES = ("recompute", "swap")
DEFAULT_MAX_MODEL_LEN = 1 << 20


class ConfigError(ValueError):
    """An invalid engine setting or workload. The message is one line."""


def _require_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class EngineConfig:
    """How the KV pool is carved up and how the scheduler behaves under pressure.

    pool_slots: device KV slots (one slot holds one token's K and V in every layer).
    block_size: slots per block (paged allocator; the contiguous baseline works per slot).
    watermark: fraction of the paged pool's blocks that admissions may not take, so that
        running sequences can always append. Waived when nothing is running.
    preemption: what happens to a sequence evicted to make room: "recompute" (free its
        blocks; it is re-prefilled later with prompt + tokens so far) or "swap" (copy its
        blocks to the host pool; falls back to recompute when the host pool is full).
    swap_slots: host slots for swapped-out blocks (None: as many as pool_slots).
    prefix_caching: reuse full blocks whose chained hash matches (paged only).
    max_batch_tokens: tokens one step may compute (None: unlimited); long prefills are chunked.
    """

    block_size: int = 16
    pool_slots: int = 2048
    watermark: float = 0.01
    preemption: str = "recompute"
    swap_slots: int | None = None
    prefix_caching: bool = True
    max_batch_tokens: int | None = None
    allocator: str = "paged"
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    seed: int = 0

    def __post_init__(self) -> None:
        block_size = _require_int("block_size", self.block_size)
        if block_size <= 0:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        pool_slots = _require_int("pool_slots", self.pool_slots)
        if pool_slots < block_size:
            raise ConfigError(
                f"pool_slots must hold at least one block of {block_size} slots, got {pool_slots}"
            )
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)):
            raise ConfigError(f"watermark must be a number in [0, 1), got {self.watermark!r}")
        if not 0.0 <= float(self.watermark) < 1.0:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark}")
        object.__setattr__(self, "watermark", float(self.watermark))
        if self.preemption not in PREEMPTION_MODES:
            raise ConfigError(
                f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption!r}"
            )
        if self.allocator not in ALLOCATORS:
            raise ConfigError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        if self.swap_slots is None:
            object.__setattr__(self, "swap_slots", pool_slots)
        elif _require_int("swap_slots", self.swap_slots) < 0:
            raise ConfigError(f"swap_slots must be >= 0, got {self.swap_slots}")
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"prefix_caching must be true or false, got {self.prefix_caching!r}")
        if self.max_batch_tokens is not None and _require_int("max_batch_tokens", self.max_batch_tokens) < 1:
            raise ConfigError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if _require_int("max_model_len", self.max_model_len) < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        _require_int("seed", self.seed)

    # Derived sizes -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """Device blocks of the paged pool (slots beyond the last whole block are unused)."""
        return self.pool_slots // self.block_size

    @property
    def num_host_blocks(self) -> int:
        return int(self.swap_slots) // self.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def paged(self) -> bool:
        return self.allocator == "paged"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EngineConfig":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)
