"""The allocator contract: what the scheduler and the engine call on a KV allocator.

The scheduler and the engine talk to a KV allocator only through :class:`Allocator`. An
allocator hides how it lays sequences out (block tables over a shared pool, or one contiguous
run of slots each); what it exposes is:

- **sizes** as token sources see them (``block_size``, ``num_blocks``, ``num_slots``,
  ``num_host_slots``): a contiguous layout is ``num_slots`` blocks of one slot;
- **capabilities**, stated, never guessed, in one :class:`Capabilities` value: ``swap``
  (preemption by swap or recompute; an allocator without it never preempts), ``fork`` (``n``
  samples share the prompt's blocks), ``fragmentation`` (free holes too small for the next
  reservation are external fragmentation, counted by ``update_fragmentation``);
- **admission**: ``rejection_reason``, ``exceeds_pool``, ``admission_slots``, ``try_admit``;
- **growth and release**: ``try_append``, ``mark_written``, ``free``;
- **preemption hooks** (only called when the flags say so): ``fork``, ``swap_out``, ``swap_in``;
- **where tokens go**: ``slots_for``, ``table_view`` (the batch), ``seq_layout`` (metrics and
  snapshots);
- ``usage()``, the counters metrics read, in one value;
- ``changes``, the change log it tells what it changed (see :mod:`.changes`): what a view of the
  pool shows is folded from it (:class:`~pagedkv_core.record.pool_view.PoolView`), never read
  from the allocator;
- ``check_invariants``, which every allocator has and the tests call after every step.

Allocators return values rather than append to shared lists: :class:`Admission` and
:class:`Growth` carry their events; the scheduler alone writes ``seq.num_computed``.

Collaborators come in through the constructor: ``cls(config, max_model_len, changes)``, where
``changes`` is the engine's :class:`~.changes.ChangeLog` (None: nothing records or snapshots the
run, so nothing is logged). Adding an allocator is one file and one line in
:data:`~.registry.ALLOCATORS`.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import numpy as np

    from .changes import ChangeLog, NoChangeLog
    from ..events import Event
    from ..sequence import Sequence


class Capabilities(NamedTuple):
    """What an allocator can do; the scheduler and the engine ask, never guess."""

    swap: bool  # preempts (by swap or recompute); False: a reservation covers its whole future
    fork: bool  # ``n`` samples share the prompt's blocks (False: each sample is its own sequence)
    fragmentation: bool  # free holes too small for the next reservation count as external fragmentation


class Admission(NamedTuple):
    """What :meth:`Allocator.try_admit` did: tokens found in the prefix cache (the scheduler
    sets ``num_computed`` from it) and the events, in order."""

    cached_tokens: int
    events: list[Event]


class Growth(NamedTuple):
    """What :meth:`Allocator.try_append` did: copy-on-write (src, dst) pairs and the events."""

    copies: Seq[tuple[int, int]]
    events: Seq[Event]


class Usage(NamedTuple):
    """The counters a step's metrics read."""

    allocated_slots: int  # slots taken by sequences (blocks in use x block size, or reserved slots)
    filled_slots: int  # slots holding a token's K/V
    kv_usage: float
    hit_tokens: int  # prefix cache, cumulative, first admissions
    queried_tokens: int
    preempted_hit_tokens: int  # re-admissions after recompute, counted apart as vLLM does
    preempted_queried_tokens: int
    host_used_blocks: int
    fragmented_slots: int  # free slots in holes too small for the next reservation
    largest_free_run: int  # contiguous: the longest free run (0 for paged)


class Allocator(Protocol):
    name: str  # the registry name
    kind: str  # "paged" (block tables) or "contiguous" (one run of slots per sequence)
    capabilities: Capabilities
    block_size: int  # as token sources see it (1 for contiguous layouts)
    num_blocks: int  # blocks of block_size (contiguous: num_slots)
    num_slots: int
    num_host_slots: int
    changes: ChangeLog | NoChangeLog

    def usage(self) -> Usage: ...

    # admission ------------------------------------------------------------------------
    def rejection_reason(self, prompt_len: int, max_tokens: int, output_len: int | None = None) -> str | None:
        """Why such a request could never be admitted even into an empty pool (None: it could)."""

    def exceeds_pool(self, seq: Sequence) -> bool:
        """True when the sequence's tokens could not fit even in an empty pool."""

    def admission_slots(self, seq: Sequence) -> int:
        """Slots ``seq`` would take at admission (the next reservation, for fragmentation)."""

    def try_admit(self, seq: Sequence, reserve_blocks: int) -> Admission | None:
        """Allocate for ``seq``, leaving ``reserve_blocks`` free; None: no room now."""

    # growth and release ---------------------------------------------------------------
    def try_append(self, seq: Sequence, num_tokens: int = 1) -> Growth | None:
        """Room for ``num_tokens`` more tokens of a running sequence; None: no free block for it."""

    def mark_written(self, seq: Sequence, start: int, count: int) -> None: ...
    def free(self, seq: Sequence) -> None: ...

    # plain decodes, in bulk -------------------------------------------------------------
    def decode_slot(self, seq: Sequence) -> int:
        """The slot a running sequence's next token goes to when writing it is a *plain decode*:
        its one uncomputed token fits in what it already holds, alone there (no growth, no copy
        on write, no block completed); -1 otherwise (then ``try_append``/``mark_written``)."""

    def write_decodes(self, slots, tokens, after: bool = False) -> np.ndarray | None:
        """The K/V of ``tokens[i]`` written at ``slots[i]``, each a slot ``decode_slot`` gave for
        this step: what ``mark_written(seq, pos, 1)`` does for each, in one call. ``after``
        (``slots`` an array): also return where each sequence's next token goes if that is a
        plain decode too (what ``decode_slot`` will answer while the sequence keeps running and
        decoding: nothing else changes a block a sequence holds alone), else -1."""

    # preemption hooks and capabilities (only called when the flag says so) -------------
    def fork(self, parent: Sequence, child: Sequence) -> list[Event]: ...
    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None: ...
    def swap_in(self, seq: Sequence, reserve_blocks: int = 0) -> list[tuple[int, int]] | None: ...
    def update_fragmentation(self, next_need: int) -> None: ...

    # layout -----------------------------------------------------------------------------
    def slots_for(self, seq: Sequence, start: int, count: int) -> list[int]: ...
    def table_view(self, seq: Sequence, context_len: int) -> Seq[int]:
        """The block table of ``[0, context_len)`` as a token source reads it: cheap to make
        every step (contiguous layouts give a ``range``, never a list of every slot)."""

    def seq_layout(self, seqs: list[Sequence]) -> tuple[list[int], list[int] | None, list | None]:
        """In one pass over ``seqs``: blocks (contiguous: reserved slots) per sequence, the
        first reserved slots (None: not a contiguous layout) and the block tables (None: none)."""

    def check_invariants(self, live: list[Sequence]) -> None: ...
