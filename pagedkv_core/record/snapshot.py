"""``StepSnapshot``: the whole engine state after one step, as compact numpy arrays.

Per slot (both allocators; one heatmap cell each):
    ``slot_state`` int8 (codes in :class:`~pagedkv_core.record.slot_state.SlotState`),
    ``slot_owner`` int32 (request index, -1 = none; a shared block shows one holder),
    ``slot_token`` int32 (token id whose K/V the slot holds, -1 = none).
Per block (paged only; zero-length for the contiguous baseline, which works per slot):
    ``block_state`` int8, ``block_ref`` int32, ``block_fill`` int16 (tokens written; blocks hold at most 1,024),
    ``block_hash`` int64 (prefix-cache hash, 0 = not cached). ``block_owners(b)`` lists
    every sequence referencing block ``b``.
Per live sequence (waiting, running, swapped), aligned arrays:
    ``seq_id``, ``seq_request`` (request index), ``seq_sample``, ``seq_status`` (codes in
    :class:`~pagedkv_core.sequence.SequenceStatus`), ``seq_num_tokens``, ``seq_num_computed``
    (tokens whose K/V is in the pool), ``seq_num_blocks`` (blocks; reserved slots for the
    contiguous baseline), ``seq_reserved_start`` (contiguous: first reserved slot, else -1),
    and the block tables in CSR form: the table of sequence ``i`` is
    ``seq_tables[seq_table_offsets[i]:seq_table_offsets[i + 1]]`` (paged only).
Plus the queues (seq ids: waiting and swapped in FCFS order, running in admission order),
the step's events and :class:`StepMetrics`.

A :class:`~pagedkv_core.record.pool_view.PoolView` folds the allocator's change log into the
pool arrays; a snapshot copies them, and a :class:`~pagedkv_core.record.recording.Recording`
stores only what changed from step to step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import attrgetter

import numpy as np

from ..events import Event
from ..metrics import StepMetrics
from ..running import listed_state
from ..sequence import SequenceStatus

SLOT_ARRAYS = {"slot_state": np.int8, "slot_owner": np.int32, "slot_token": np.int32}
BLOCK_ARRAYS = {"block_state": np.int8, "block_ref": np.int32, "block_fill": np.int16, "block_hash": np.int64}
SEQ_ARRAYS = {
    "seq_id": np.int32,
    "seq_request": np.int32,
    "seq_sample": np.int32,
    "seq_status": np.int8,
    "seq_num_tokens": np.int32,
    "seq_num_computed": np.int32,
    "seq_num_blocks": np.int32,
    "seq_reserved_start": np.int32,
}
TABLE_ARRAYS = {"seq_table_offsets": np.int32, "seq_tables": np.int32}
ARRAY_FIELDS = {**SLOT_ARRAYS, **BLOCK_ARRAYS, **SEQ_ARRAYS, **TABLE_ARRAYS}
SCALAR_FIELDS = ("step", "allocator", "block_size", "num_slots", "num_blocks", "num_host_blocks")
QUEUE_FIELDS = ("waiting", "running", "swapped")


def _empty(dtype) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass(eq=False)
class StepSnapshot:
    step: int
    allocator: str  # the allocator's registry name (see pagedkv_core.kv.registry.ALLOCATORS)
    block_size: int  # as presented to token sources (1 for contiguous)
    num_slots: int
    num_blocks: int  # 0 for contiguous
    num_host_blocks: int
    slot_state: np.ndarray
    slot_owner: np.ndarray
    slot_token: np.ndarray
    block_state: np.ndarray = field(default_factory=lambda: _empty(np.int8))
    block_ref: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    block_fill: np.ndarray = field(default_factory=lambda: _empty(np.int16))
    block_hash: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    seq_id: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_request: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_sample: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_status: np.ndarray = field(default_factory=lambda: _empty(np.int8))
    seq_num_tokens: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_num_computed: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_num_blocks: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_reserved_start: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    seq_table_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int32))
    seq_tables: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    waiting: tuple[int, ...] = ()
    running: tuple[int, ...] = ()
    swapped: tuple[int, ...] = ()
    events: tuple[Event, ...] = ()
    metrics: StepMetrics = field(default_factory=StepMetrics)

    # ------------------------------------------------------------------ queries
    @property
    def kind(self) -> str:
        """"paged" (block tables) or "contiguous" (one run of slots per sequence)."""
        from ..kv.registry import allocator_kind

        return allocator_kind(self.allocator)

    def seq_index(self, seq_id: int) -> int:
        hits = np.flatnonzero(self.seq_id == seq_id)
        if not len(hits):
            raise KeyError(f"sequence {seq_id} is not live at step {self.step}")
        return int(hits[0])

    def block_table(self, seq_id: int) -> list[int]:
        """Physical blocks of a sequence (contiguous: its reserved slot ids)."""
        i = self.seq_index(seq_id)
        if self.kind == "contiguous":
            start = int(self.seq_reserved_start[i])
            return list(range(start, start + int(self.seq_num_blocks[i]))) if start >= 0 else []
        lo, hi = self.seq_table_offsets[i], self.seq_table_offsets[i + 1]
        return self.seq_tables[lo:hi].tolist()

    def block_owners(self, block_id: int) -> list[int]:
        """Seq ids whose block table references ``block_id`` (paged)."""
        rows = np.searchsorted(self.seq_table_offsets, np.flatnonzero(self.seq_tables == block_id), side="right") - 1
        return sorted({int(self.seq_id[r]) for r in rows})

    @property
    def block_owner(self) -> np.ndarray:
        """Per block: request index of one holder (-1 = none)."""
        return self.slot_owner[:: self.block_size][: self.num_blocks] if self.num_blocks else _empty(np.int32)

    # ------------------------------------------------------------------ equality / JSON
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepSnapshot):
            return NotImplemented
        for name in SCALAR_FIELDS + QUEUE_FIELDS + ("events", "metrics"):
            if getattr(self, name) != getattr(other, name):
                return False
        for name, dtype in ARRAY_FIELDS.items():
            a, b = getattr(self, name), getattr(other, name)
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                return False
        return True

    def to_json(self) -> dict:
        out: dict = {name: getattr(self, name) for name in SCALAR_FIELDS}
        for name in ARRAY_FIELDS:
            out[name] = getattr(self, name).tolist()
        for name in QUEUE_FIELDS:
            out[name] = list(getattr(self, name))
        out["events"] = [e.to_json() for e in self.events]
        out["metrics"] = self.metrics.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "StepSnapshot":
        """Inverse of :meth:`to_json`. Raises ValueError (one line) on anything malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"a step must be a JSON object, got {type(data).__name__}")
        missing = [k for k in SCALAR_FIELDS + tuple(ARRAY_FIELDS) + QUEUE_FIELDS + ("events", "metrics") if k not in data]
        if missing:
            raise ValueError(f"step is missing field(s): {', '.join(missing)}")
        kwargs: dict = {}
        for name in SCALAR_FIELDS:
            value = data[name]
            if name == "allocator":
                from ..kv.registry import ALLOCATORS

                if not isinstance(value, str) or value not in ALLOCATORS:
                    raise ValueError(f"unknown allocator {value!r}")
                kwargs[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"field {name} must be an integer, got {value!r}")
                kwargs[name] = value
        for name, dtype in ARRAY_FIELDS.items():
            value = data[name]
            if not isinstance(value, list):
                raise ValueError(f"field {name} must be a list")
            try:
                kwargs[name] = np.array(value, dtype=dtype).reshape(-1)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"field {name}: {exc}") from None
        for name in QUEUE_FIELDS:
            value = data[name]
            if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
                raise ValueError(f"field {name} must be a list of sequence ids (integers), got {_short(value)}")
            kwargs[name] = tuple(value)
        try:
            kwargs["events"] = tuple(Event.from_json(e) for e in data["events"])
            kwargs["metrics"] = StepMetrics.from_json(data["metrics"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed events or metrics: {exc!r}") from None
        snap = cls(**kwargs)
        snap._check_shapes()
        return snap

    def _check_shapes(self) -> None:
        for name in SLOT_ARRAYS:
            if len(getattr(self, name)) != self.num_slots:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, expected num_slots={self.num_slots}")
        for name in BLOCK_ARRAYS:
            if len(getattr(self, name)) != self.num_blocks:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, expected num_blocks={self.num_blocks}")
        n = len(self.seq_id)
        for name in SEQ_ARRAYS:
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, expected {n} sequences")
        if len(self.seq_table_offsets) != n + 1 or int(self.seq_table_offsets[-1]) != len(self.seq_tables):
            raise ValueError("seq_table_offsets do not match seq_tables")


def _short(value, limit: int = 40) -> str:
    """A JSON value for an error line, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ROW = attrgetter("seq_id", "request.index", "sample_index", "status", "num_computed")
_TOKENS = attrgetter("token_ids")
_STATUS = attrgetter("status")
_RUNNING = int(SequenceStatus.RUNNING)


def seq_arrays(allocator, scheduler, tables: bool = True) -> dict:
    """The per-sequence arrays, the block tables (CSR) and the queues of the live sequences.
    With ``tables`` (a full snapshot, which lists every entry of every table anyway), or after a
    step the scheduler took one sequence at a time: one pass over the sequences through the
    allocator's public layout methods. Otherwise (``tables=False``, for a caller that draws
    nothing, such as a recording, after a step taken by columns): the running sequences from the
    scheduler's columns, where only what changed since the last step is read again
    (:meth:`~pagedkv_core.scheduler.Scheduler.running_rows`), the waiting and swapped ones one
    at a time."""
    if tables or not scheduler.keeps_columns:
        return _listed_one_by_one(allocator, scheduler, tables)
    running, waiting, swapped = scheduler.running, scheduler.waiting, scheduler.swapped
    rows = scheduler.running_rows()  # tokens, computed, id, request, sample, blocks, reserved start
    queued = waiting + swapped
    m = len(queued)
    if m:
        q_blocks, q_reserved, _ = allocator.seq_layout(queued)
        q = np.empty((7, m), dtype=np.int64)
        q[:5] = listed_state(queued)
        q[5] = q_blocks
        q[6] = q_reserved if q_reserved is not None else -1
        rows = np.concatenate([rows, q], axis=1).astype(np.int32)
        status = np.full(len(running) + m, _RUNNING, dtype=np.int8)
        status[len(running):] = np.fromiter(map(_STATUS, queued), np.int8, m)
    else:
        rows = rows.astype(np.int32)
        status = np.full(len(running), _RUNNING, dtype=np.int8)
    return {
        "seq_id": rows[2],
        "seq_request": rows[3],
        "seq_sample": rows[4],
        "seq_status": status,
        "seq_num_tokens": rows[0],
        "seq_num_computed": rows[1],
        "seq_num_blocks": rows[5],
        "seq_reserved_start": rows[6],
        "waiting": tuple(s.seq_id for s in waiting),
        "running": tuple(rows[2, : len(running)].tolist()),
        "swapped": tuple(s.seq_id for s in swapped),
    }


def _listed_one_by_one(allocator, scheduler, tables: bool) -> dict:
    """:func:`seq_arrays` read from each sequence: O(live sequences + table entries)."""
    running, waiting, swapped = scheduler.running, scheduler.waiting, scheduler.swapped
    seqs = running + waiting + swapped
    n = len(seqs)
    num_blocks, reserved, block_tables = allocator.seq_layout(seqs)
    # Five columns in one pass (a C-level getter a sequence), the token counts in another.
    rows = np.fromiter(chain.from_iterable(map(_ROW, seqs)), np.int32, 5 * n).reshape(n, 5).T.copy()
    i32 = np.int32
    out = {
        "seq_id": rows[0],
        "seq_request": rows[1],
        "seq_sample": rows[2],
        "seq_status": rows[3].astype(np.int8),
        "seq_num_tokens": np.fromiter(map(len, map(_TOKENS, seqs)), i32, n),
        "seq_num_computed": rows[4],
        "seq_num_blocks": np.array(num_blocks, dtype=i32),
        "seq_reserved_start": np.array(reserved, dtype=i32) if reserved is not None else np.full(n, -1, i32),
    }
    if tables:
        if block_tables is not None and n:
            offsets = np.fromiter(accumulate(num_blocks, initial=0), np.int32, n + 1)
            flat = np.fromiter(chain.from_iterable(block_tables), dtype=np.int32, count=int(offsets[-1]))
        else:
            offsets = np.zeros(n + 1, dtype=np.int32)
            flat = _empty(np.int32)
        out["seq_table_offsets"] = offsets
        out["seq_tables"] = flat
    out["waiting"] = tuple(s.seq_id for s in waiting)
    out["running"] = tuple(s.seq_id for s in running)
    out["swapped"] = tuple(s.seq_id for s in swapped)
    return out


def pool_scalars(view) -> dict:
    """The sizes a snapshot states once (a recording keeps them once for the whole run), from a
    :class:`~pagedkv_core.record.pool_view.PoolView`."""
    return view.scalars()


def pool_arrays(view) -> dict[str, np.ndarray]:
    """The view's live per-slot and per-block arrays (not copies)."""
    return view.arrays


def take_snapshot(step: int, view, seqs: dict, events: tuple[Event, ...], metrics: StepMetrics) -> StepSnapshot:
    """A full copy: the pool view's arrays, plus ``seqs`` from :func:`seq_arrays`."""
    arrays = {name: a.copy() for name, a in view.arrays.items()}
    return StepSnapshot(step=step, **view.scalars(), **arrays, **seqs, events=events, metrics=metrics)
