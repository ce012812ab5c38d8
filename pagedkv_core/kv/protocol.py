"""The allocator contract: what the scheduler and the engine may call on a KV allocator.

The scheduler, the engine and the snapshot talk to a KV allocator only through
:class:`Allocator`. An allocator hides how it lays sequences out (block tables over a shared
pool, or one contiguous run of slots each); what it exposes is:

- **sizes** (``num_slots``, ``num_blocks``, ``block_size`` as token sources see it);
- **capabilities**, stated, never guessed: ``supports_swap`` (preemption by swap or
  recompute; an allocator without it never preempts), ``supports_fork`` (``n`` samples share
  the prompt's blocks), ``reports_fragmentation`` (free holes too small for the next
  reservation are external fragmentation);
- **admission and growth**: ``rejection_reason``, ``admission_slots``, ``exceeds_pool``,
  ``try_admit``, ``blocks_needed``, ``append_slots``, ``mark_written``, ``free``;
- **where tokens go**: ``slots_for``, ``block_table``, ``num_blocks_of``, ``reserved_start``;
- **counters** for metrics, and the per-slot / per-block display arrays a snapshot copies,
  with ``take_changes`` naming what changed since the last call (recordings store only that);
- ``check_invariants``, which every allocator has and the tests call after every step.

Collaborators come in through the constructor: ``cls(config, events, max_model_len,
track_changes)``, where ``events`` is the engine's one chronological event list for the step and
``track_changes`` says whether anyone records the run (a change log costs a little every write).

Adding an allocator is one file and one line in :data:`~.registry.ALLOCATORS`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:
    from .changes import Changes
    from ..config import EngineConfig
    from ..events import Event
    from ..sequence import Sequence


class Admission(NamedTuple):
    """What :meth:`Allocator.try_admit` did: tokens found in the prefix cache (the scheduler
    sets ``num_computed`` from it) and the events, in order."""

    cached_tokens: int
    events: list[Event]


class Growth(NamedTuple):
    """What :meth:`Allocator.append_slots` did: copy-on-write (src, dst) pairs and the events."""

    copies: list[tuple[int, int]]
    events: list[Event]


class Allocator(Protocol):
    name: str  # the registry name
    kind: str  # "paged" (block tables) or "contiguous" (one run of slots per sequence)
    supports_swap: bool
    supports_fork: bool
    reports_fragmentation: bool
    block_size: int  # as token sources see it (1 for contiguous layouts)
    num_slots: int
    num_blocks: int  # 0 for contiguous layouts (snapshots show them per slot)
    num_host_slots: int

    # counters -----------------------------------------------------------------------
    allocated_slots: int  # slots taken by sequences (blocks in use x block size, or reserved slots)
    filled_slots: int  # slots holding a token's K/V
    kv_usage: float
    num_free_blocks: int  # free blocks (units of block_size) for growth; 0 when growth never allocates
    hit_tokens: int  # prefix cache, cumulative
    queried_tokens: int
    host_used_blocks: int
    fragmented_slots: int
    largest_free_run: int

    # display arrays (see snapshot.py) -------------------------------------------------
    slot_state: np.ndarray
    slot_owner: np.ndarray
    slot_token: np.ndarray
    block_state: np.ndarray
    block_ref: np.ndarray
    block_fill: np.ndarray
    block_hash: np.ndarray

    def __init__(self, config: EngineConfig, events: list[Event] | None = None, max_model_len: int | None = None,
                 track_changes: bool = True) -> None: ...

    # admission ------------------------------------------------------------------------
    def rejection_reason(self, prompt_len: int, max_tokens: int, output_len: int | None = None) -> str | None:
        """Why such a request could never be admitted even into an empty pool (None: it could)."""

    def admission_slots(self, seq: Sequence) -> int:
        """Slots ``seq`` would take at admission (the next reservation, for fragmentation)."""

    def exceeds_pool(self, seq: Sequence) -> bool:
        """True when the sequence's tokens could not fit even in an empty pool."""

    def try_admit(self, seq: Sequence, reserve_blocks: int) -> int | None:
        """Allocate for ``seq``; returns tokens found in the prefix cache, or None (no room)."""

    # growth ---------------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_tokens: int = 1) -> int: ...
    def append_slots(self, seq: Sequence, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Room for ``num_tokens`` more tokens; returns copy-on-write (src, dst) pairs."""

    def mark_written(self, seq: Sequence, start: int, count: int) -> None: ...
    def free(self, seq: Sequence) -> None: ...

    # optional capabilities (only called when the flag says so) --------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None: ...
    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None: ...
    def can_swap_in(self, seq: Sequence, reserve_blocks: int) -> bool: ...
    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]: ...
    def update_fragmentation(self, next_need: int) -> None: ...

    # layout -----------------------------------------------------------------------------
    def slots_for(self, seq: Sequence, start: int, count: int) -> list[int]: ...
    def block_table(self, seq: Sequence, context_len: int | None = None) -> list[int]: ...
    def table_view(self, seq: Sequence, context_len: int) -> range | list[int]:
        """What a token source reads as the block table of ``[0, context_len)``: cheap to
        make every step (contiguous layouts give a ``range``, never a list of every slot)."""

    def seq_layout(self, seqs: list[Sequence]) -> tuple[list[int], list[int] | None, list | None]:
        """For snapshots, in one pass over ``seqs``: what :meth:`num_blocks_of`,
        :meth:`reserved_start` (None: -1 for all) and :meth:`block_table` (None: no tables) give."""

    def num_blocks_of(self, seq: Sequence) -> int:
        """Blocks in the sequence's table (contiguous: its reserved slots)."""

    def reserved_start(self, seq: Sequence) -> int:
        """Contiguous: the first reserved slot (-1 when none); paged: -1."""

    # recordings and checks -----------------------------------------------------------------
    def take_changes(self) -> Changes:
        """The slot ranges, block ranges and block tables that may have changed since the last
        call; a superset is fine, nothing that changed may be missing."""

    def check_invariants(self, live: list[Sequence]) -> None: ...
