"""The baseline: one contiguous reservation of prompt_len + max_tokens slots per sequence.

This is the vLLM paper's "Orca (Max)" baseline (Kwon et al., SOSP 2023, section 6.1); the
Pow2 and Oracle variants in :mod:`orca_baselines` only change :meth:`answer_reservation`, and
the best-fit variant only :meth:`choose_run`. Reservations are placed first fit over the slot
array at admission and never grow, move or share. The tail a sequence never reaches is allocated-but-empty (internal fragmentation);
free holes too small for the next waiting reservation are external fragmentation. Token
sources see it as a paged pool of ``num_slots`` blocks of one slot (``block_size == 1``,
``num_blocks == num_slots``) whose block table is the run of consecutive slot ids of the
reservation, so the real model runs on it unchanged. The allocator keeps its free runs and
reservations; what it changes it tells its change log (a pool view shows it per slot).
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from .changes import NoChangeLog
from .protocol import Admission, Capabilities, Growth, Usage
from ..events import ALLOCATE, Event
from ..sequence import Sequence

if TYPE_CHECKING:
    from ..config import EngineConfig
    from .changes import ChangeLog

NO_GROWTH = Growth((), ())


class ContiguousAllocator:
    """First-fit contiguous reservations of prompt + ``max_tokens`` slots over ``pool_slots`` slots."""

    name = "contiguous"
    kind = "contiguous"
    # A reservation covers its whole future: nothing ever needs preempting.
    capabilities = Capabilities(swap=False, fork=False, fragmentation=True)
    block_size = 1  # as token sources see it: a block is one slot
    num_host_slots = 0
    host_used_blocks = 0

    def __init__(self, config: EngineConfig, max_model_len: int | None = None, changes: ChangeLog | None = None):
        self.num_slots = self.num_blocks = config.pool_slots
        self.max_model_len = config.max_model_len if max_model_len is None else max_model_len
        self.free_starts: list[int] = [0]  # free runs, sorted by start, never adjacent
        self.free_lens: list[int] = [self.num_slots]
        self.reservations: dict[int, tuple[int, int]] = {}  # seq_id -> (start, length)
        self.reserved_slots = 0
        self.filled_slots = 0
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.preempted_hit_tokens = 0
        self.preempted_queried_tokens = 0
        self.changes = NoChangeLog() if changes is None else changes  # what a pool view folds
        self.fragmented_slots = 0
        self._next_need = 0
        self._layout_changed = True
        self._painted: dict[int, int] = {}  # start -> length of the free runs too small for the next reservation

    # ------------------------------------------------------------------ read access
    @property
    def allocated_slots(self) -> int:
        return self.reserved_slots

    @property
    def kv_usage(self) -> float:
        return self.reserved_slots / self.num_slots

    @property
    def largest_free_run(self) -> int:
        return max(self.free_lens, default=0)

    def usage(self) -> Usage:
        return Usage(self.reserved_slots, self.filled_slots, self.kv_usage, self.hit_tokens, self.queried_tokens,
                     self.preempted_hit_tokens, self.preempted_queried_tokens, 0, self.fragmented_slots,
                     self.largest_free_run)

    answer_words = "max_tokens"  # what the answer's share of a reservation is, in rejection messages

    def answer_reservation(self, max_tokens: int, output_len: int | None) -> int:
        """Slots reserved for the answer: ``max_tokens``, the most it may write (Orca Max)."""
        return max_tokens

    def _reservation(self, prompt_len: int, max_tokens: int, output_len: int | None) -> int:
        return min(prompt_len + self.answer_reservation(max_tokens, output_len), self.max_model_len)

    def reservation_size(self, seq: Sequence) -> int:
        r = seq.request
        return self._reservation(seq.num_prompt_tokens, r.sampling.max_tokens, r.output_len)

    admission_slots = reservation_size

    def block_table(self, seq: Sequence, context_len: int | None = None) -> list[int]:
        start, length = self.reservations[seq.seq_id]
        n = length if context_len is None else context_len
        return list(range(start, start + n))

    def seq_layout(self, seqs: list[Sequence]) -> tuple[list[int], list[int], None]:
        """For a snapshot, in one pass: reserved slots and first reserved slot per sequence."""
        get = self.reservations.get
        rows = [get(s.seq_id, (-1, 0)) for s in seqs]
        return [r[1] for r in rows], [r[0] for r in rows], None

    def table_view(self, seq: Sequence, context_len: int) -> range:
        """The block table a token source reads, without building it: a run of slot ids."""
        start = self.reservations[seq.seq_id][0]
        return range(start, start + context_len)

    def slots_for(self, seq: Sequence, start: int, count: int) -> list[int]:
        base = self.reservations[seq.seq_id][0] + start
        return list(range(base, base + count))

    # ------------------------------------------------------------------ admission
    def rejection_reason(self, prompt_len: int, max_tokens: int, output_len: int | None = None) -> str | None:
        need = self._reservation(prompt_len, max_tokens, output_len)
        if need > self.num_slots:
            return (
                f"needs a reservation of {prompt_len} prompt + {self.answer_reservation(max_tokens, output_len)} "
                f"{self.answer_words} = "
                f"{need} consecutive slots, but the pool has only {self.num_slots} slots"
            )
        return None

    def exceeds_pool(self, seq: Sequence) -> bool:
        return self.reservation_size(seq) > self.num_slots

    def try_admit(self, seq: Sequence, reserve_blocks: int = 0) -> Admission | None:
        """Reserve the sequence's whole future, first fit. None if no free run is long enough."""
        need = self.reservation_size(seq)
        i = self.choose_run(need)
        if i is None:
            return None
        start, length = self.free_starts[i], self.free_lens[i]
        if length == need:
            del self.free_starts[i]
            del self.free_lens[i]
        else:
            self.free_starts[i] = start + need
            self.free_lens[i] = length - need
        self.reservations[seq.seq_id] = (start, need)
        self.reserved_slots += need
        self.changes.reserved(start, need, seq.request.index)
        self._layout_changed = True
        return Admission(0, [Event(ALLOCATE, seq.seq_id, seq.request.request_id, {"start": start, "length": need})])

    def choose_run(self, need: int) -> int | None:
        """Index of the free run to carve ``need`` slots from: the first long enough."""
        for i, length in enumerate(self.free_lens):
            if length >= need:
                return i
        return None

    # ------------------------------------------------------------------ growth (never)
    def blocks_needed(self, seq: Sequence, num_tokens: int = 1) -> int:
        return 0  # the reservation already covers the sequence's whole future

    def try_append(self, seq: Sequence, num_tokens: int = 1) -> Growth:
        return NO_GROWTH  # the reservation already covers the sequence's whole future

    def mark_written(self, seq: Sequence, start: int, count: int) -> None:
        base = self.reservations[seq.seq_id][0] + start
        if self.changes.active:
            self.changes.written(base, seq.token_ids[start : start + count])
        self.filled_slots += count

    def decode_slot(self, seq: Sequence) -> int:
        """A decode is always plain here: its slot is in the sequence's reservation."""
        start = seq.num_computed
        if len(seq.token_ids) - start != 1:
            return -1
        return self.reservations[seq.seq_id][0] + start

    def write_decodes(self, slots, tokens, after: bool = False) -> np.ndarray | None:
        """``after``: the reservation's next slot (every decode is plain here)."""
        self.filled_slots += len(slots)
        if self.changes.active and len(slots):
            self.changes.decoded(slots, tokens)
        return slots + 1 if after else None

    def free(self, seq: Sequence) -> None:
        r = self.reservations.pop(seq.seq_id, None)
        if r is None:
            return
        start, length = r
        self.reserved_slots -= length
        self.filled_slots -= seq.num_computed
        self.changes.freed(start, length)
        i = bisect.bisect_left(self.free_starts, start)
        merge_prev = i > 0 and self.free_starts[i - 1] + self.free_lens[i - 1] == start
        merge_next = i < len(self.free_starts) and start + length == self.free_starts[i]
        if merge_prev and merge_next:
            self.free_lens[i - 1] += length + self.free_lens[i]
            del self.free_starts[i]
            del self.free_lens[i]
        elif merge_prev:
            self.free_lens[i - 1] += length
        elif merge_next:
            self.free_starts[i] = start
            self.free_lens[i] += length
        else:
            self.free_starts.insert(i, start)
            self.free_lens.insert(i, length)
        self._layout_changed = True

    # ------------------------------------------------------------------ fragmentation
    def update_fragmentation(self, next_need: int) -> None:
        """Count free runs shorter than the next waiting reservation (``next_need`` slots;
        0 when nobody waits) as fragmentation, and log the holes that became or stopped being one."""
        if not self._layout_changed and next_need == self._next_need:
            return
        self._next_need = next_need
        self._layout_changed = False
        # Log only the small runs that changed, never the big ones: the cost follows the holes,
        # not the pool.
        old = self._painted
        now = {s: n for s, n in zip(self.free_starts, self.free_lens) if n < next_need}
        for start, length in old.items():
            if now.get(start) != length:  # no longer exactly this hole: what is still free is plain free
                self.changes.unfragment(start, length)
        for start, length in now.items():
            if old.get(start) != length:
                self.changes.fragment(start, length)
        self._painted = now
        self.fragmented_slots = sum(now.values())

    # ------------------------------------------------------------------ checks
    def check_invariants(self, live: list[Sequence]) -> None:
        covered = np.zeros(self.num_slots, dtype=np.int32)
        for start, length in zip(self.free_starts, self.free_lens):
            assert length > 0
            covered[start : start + length] += 1
        for a, la, b in zip(self.free_starts, self.free_lens, self.free_starts[1:]):
            assert a + la < b, "free runs overlap or touch"
        live_ids = {s.seq_id: s for s in live}
        assert set(self.reservations) <= set(live_ids), "a reservation outlived its sequence"
        filled = 0
        for sid, (start, length) in self.reservations.items():
            seq = live_ids[sid]
            covered[start : start + length] += 1
            n = seq.num_computed
            assert n <= length
            filled += n
        assert (covered == 1).all(), "reservations and free runs do not partition the pool"
        assert filled == self.filled_slots, f"filled slots {self.filled_slots} != {filled}"
        assert sum(length for _, length in self.reservations.values()) == self.reserved_slots
