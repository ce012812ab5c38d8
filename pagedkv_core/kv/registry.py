"""The registry that maps allocator names to classes (the contract is :mod:`.protocol`).

Adding an allocator is one file and one line in :data:`ALLOCATORS` below.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .protocol import Allocator

if TYPE_CHECKING:
    from ..config import EngineConfig
    from .changes import ChangeLog

from .paged import BlockManager  # noqa: E402  (the implementations; none imports the engine)
from .contiguous import ContiguousAllocator  # noqa: E402
from .orca_baselines import OrcaOracleAllocator, OrcaPow2Allocator  # noqa: E402
from .contiguous_best_fit import BestFitContiguousAllocator  # noqa: E402

ALLOCATORS: dict[str, type] = {
    "paged": BlockManager,
    "contiguous": ContiguousAllocator,  # Orca (Max): prompt + max_tokens, first fit
    "contiguous-pow2": OrcaPow2Allocator,  # Orca (Pow2): prompt + the answer rounded up to a power of two
    "contiguous-oracle": OrcaOracleAllocator,  # Orca (Oracle): prompt + exactly the answer
    "contiguous-best-fit": BestFitContiguousAllocator,  # Orca (Max) placed best fit
}

# The contiguous variants of the vLLM paper's baselines (Kwon et al., SOSP 2023, section 6.1).
CONTIGUOUS_POLICIES = {"max": "contiguous", "pow2": "contiguous-pow2", "oracle": "contiguous-oracle"}


def allocator_class(name: str) -> type:
    from ..config import ConfigError

    if name not in ALLOCATORS:
        raise ConfigError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {name!r}")
    return ALLOCATORS[name]


def allocator_kind(name: str) -> str:
    """"paged" or "contiguous": how the named allocator lays sequences out."""
    return allocator_class(name).kind


def build_allocator(config: EngineConfig, max_model_len: int, changes: ChangeLog | None = None,
                    kv_event_sink=None) -> Allocator:
    """``changes``: the change log a pool view folds (None: nothing records or snapshots, nothing
    is logged). ``kv_event_sink``: told of prefix-cache blocks stored and evicted (paged only)."""
    cls = allocator_class(config.allocator)
    if kv_event_sink is None:
        return cls(config, max_model_len, changes)
    if allocator_kind(config.allocator) != "paged":
        from ..config import ConfigError

        raise ConfigError(f"KV events come from the prefix cache of a paged allocator; {config.allocator} has none")
    return cls(config, max_model_len, changes, kv_event_sink=kv_event_sink)
