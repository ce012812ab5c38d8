"""Engine settings, validated once at construction, and the one place their rules live.

Every field of :class:`EngineConfig` carries its default, its bounds (or choices) and a line of
help in its dataclass metadata. The CLI flags, the app's sidebar and ``LLM`` all read them
through :func:`setting_spec`, so a default or a bound is written exactly once.

Every invalid value raises :class:`ConfigError` with a one-line message that names the
setting and the bad value, so that the CLI can print it as is and exit with code 2.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

PREEMPTION_MODES = ("recompute", "swap")
EVICTION_POLICIES = ("lru", "belady")  # pagedkv_core.kv.eviction implements them
DEFAULT_MAX_MODEL_LEN = 1 << 20
MAX_POOL_SLOTS = 1 << 20  # 1,048,576 token slots: a large GPU's pool (Llama 3 8B fp16 on 80 GB: ~450k)
MAX_SWAP_SLOTS = 1 << 20
MAX_BLOCK_SIZE = 1024
MAX_SEED = 2**31 - 1
MAX_TOKEN_ID = 2**31 - 2  # token ids live in int32 arrays (-1 = none); a real model's vocabulary is smaller
MAX_ARRIVAL_STEP = 1_000_000  # horizon: a request may arrive at most this many steps ahead


class ConfigError(ValueError):
    """An invalid engine setting or workload. The message is one line."""


@dataclass(frozen=True)
class SettingSpec:
    """The rule for one setting: its default, its inclusive bounds or its choices, and help."""

    name: str
    default: object
    help: str
    lo: float | None = None
    hi: float | None = None
    hi_open: bool = False  # the upper bound itself is not allowed
    choices: tuple = ()

    def describe_range(self) -> str:
        if self.choices:
            return " | ".join(map(str, self.choices))
        close = ")" if self.hi_open else "]"
        return f"[{self.lo:g}, {self.hi:g}{close}"

    def check(self, value: object) -> object:
        """``value`` if it obeys the rule (ints as int, floats as float); ConfigError otherwise."""
        name = self.name
        if self.choices:
            if value not in self.choices:
                raise ConfigError(f"{name} must be one of {', '.join(map(str, self.choices))}, got {value!r}")
            return value
        if isinstance(self.default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
            return value
        if isinstance(self.default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a number in {self.describe_range()}, got {value!r}")
            value = float(value)
            if value < self.lo or value > self.hi or (self.hi_open and value == self.hi):
                raise ConfigError(f"{name} must be in {self.describe_range()}, got {value}")
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.lo is not None and value < self.lo:
            raise ConfigError(f"{name} must be >= {self.lo:g}, got {value}")
        if self.hi is not None and value > self.hi:
            raise ConfigError(f"{name} must be <= {self.hi:,.0f}, got {value:,}")
        return value


def _setting(default, help: str, lo=None, hi=None, *, hi_open=False, choices=()):
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "hi_open": hi_open, "choices": choices})


@dataclass(frozen=True)
class EngineConfig:
    """How the KV pool is carved up and how the scheduler behaves under pressure.

    ``swap_slots=None`` means as many host slots as the pool has device slots (capped at
    ``MAX_SWAP_SLOTS``); ``max_batch_tokens=None`` means no per-step token budget.
    """

    block_size: int = _setting(16, "token slots per block (paged; the contiguous baseline works per slot)", 1, MAX_BLOCK_SIZE)
    pool_slots: int = _setting(2048, "device KV slots: one slot holds one token's K and V in every layer", 1, MAX_POOL_SLOTS)
    watermark: float = _setting(0.01, "share of the paged pool's blocks that admissions leave free, so running "
                                "sequences can always grow (waived when nothing runs)", 0.0, 1.0, hi_open=True)
    preemption: str = _setting("recompute", "what happens to an evicted sequence: recompute (free its blocks, "
                               "re-prefill later) or swap (copy its blocks to the host pool)", choices=PREEMPTION_MODES)
    swap_slots: int | None = _setting(None, "host slots for swapped-out blocks (default: the pool size)", 0, MAX_SWAP_SLOTS)
    prefix_caching: bool = _setting(True, "reuse full blocks whose chained hash matches (paged only)")
    eviction: str = _setting("lru", "which cached block the paged pool evicts when nothing else is free: lru (the "
                             "least recently used, vLLM's rule) or belady (the offline optimum, the block whose next "
                             "use lies furthest ahead, planned from every request the engine holds at its first "
                             "step: a teaching yardstick, not a serving policy)", choices=EVICTION_POLICIES)
    max_batch_tokens: int | None = _setting(None, "tokens one step may compute (default unlimited); long prefills "
                                            "are chunked", 1, 1 << 24)
    allocator: str = _setting("paged", "KV allocator")
    max_model_len: int = _setting(DEFAULT_MAX_MODEL_LEN, "longest sequence (prompt + output) in tokens", 2, DEFAULT_MAX_MODEL_LEN)
    seed: int = _setting(0, "workload and sampling seed", 0, MAX_SEED)

    def __post_init__(self) -> None:
        from .kv.registry import ALLOCATORS  # the registry (imports the allocator modules, not the engine)

        check = lambda name: object.__setattr__(self, name, setting_spec(name).check(getattr(self, name)))  # noqa: E731
        for name in ("block_size", "pool_slots", "watermark", "preemption", "prefix_caching", "eviction", "max_model_len",
                     "seed"):
            check(name)
        if self.allocator not in ALLOCATORS:
            raise ConfigError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        if self.pool_slots < self.block_size:
            raise ConfigError(
                f"pool_slots must hold at least one block of {self.block_size} slots, got {self.pool_slots}"
            )
        if self.swap_slots is None:
            object.__setattr__(self, "swap_slots", min(self.pool_slots, MAX_SWAP_SLOTS))
        else:
            check("swap_slots")
        if self.max_batch_tokens is not None:
            check("max_batch_tokens")

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EngineConfig":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def setting_spec(name: str) -> SettingSpec:
    """The rule of one EngineConfig field (KeyError for an unknown name)."""
    for f in fields(EngineConfig):
        if f.name == name:
            m = f.metadata
            return SettingSpec(name, f.default, m["help"], m["lo"], m["hi"], m["hi_open"], tuple(m["choices"]))
    raise KeyError(name)


def setting_specs() -> dict[str, SettingSpec]:
    return {f.name: setting_spec(f.name) for f in fields(EngineConfig)}
