"""A run's steps, stored as deltas: what changed each step, plus a keyframe every K steps.

Keeping one full :class:`~pagedkv_core.record.snapshot.StepSnapshot` per step costs slots x steps
(9 bytes a slot: 2.4 MB a step at 262,144 slots, 12 GB for 5,000 steps). A
:class:`Recording` keeps instead, per step, a compact step record of only what changed (see
:mod:`pagedkv_core.record.step_codec`), the step's metrics in columns, and every K steps a
keyframe (a full copy of the arrays). ``at(step)`` starts from the nearest keyframe at or
before ``step`` and applies at most K - 1 records; it remembers where it stopped, so scrubbing
forward (``at(s)`` then ``at(s + 1)``) costs one record. The per-sequence parts are kept per
sequence id while records are applied, so a record costs what it changed, and the snapshot's
per-sequence arrays and block tables are assembled once, for the step asked for.

Memory bound. Keyframes cost (9 x slots + 19 x blocks) / K bytes a step; step records cost
about 13 bytes per changed slot, which follows the tokens a step writes, not the pool's size.
K is chosen from the pool (:func:`default_keyframe_every`): the power of two, between 32 and
512, that keeps keyframes near :data:`KEYFRAME_BYTES_PER_STEP` (16 KiB) a step. So K = 32 up
to about 50k slots, 256 at 262,144 slots (a 2.7 MB keyframe every 256 steps: 52 MB over 5,000
steps) and 512 at 1,048,576 slots (10.7 MB every 512 steps). The cap of 512 bounds the
rebuild of a random step: one keyframe copy and at most 511 records, about 60 microseconds
each at 1M slots. Measured (a generated workload, 1,000 requests, prompts ~800 and answers
~200 tokens, Poisson arrivals): 5,000 steps at 262,144 slots hold 108 MB (22 KB a step, 210 MB
peak RSS for the whole process); at 1,048,576 slots a random ``at()`` takes about 20 ms.

Idle stretches. A step that changes nothing (no pool entry, row, table, queue or event: what
``Engine(skip_idle=True)`` records for each step of an idle stretch) is no new record: it starts
or extends a *run* (one record, its metrics, the steps it covers; :meth:`Recording.idle_runs`).
``at(step)`` inside a run is the run's state at that step; a run takes no keyframes. A run
comes in step by step (the engine), or whole (:meth:`Recorder.append_idle`: a trace's idle line).

How a run gets in:

- the engine, with ``Engine(config, source, recording=rec)``: ``start(scalars, arrays)`` once
  with its pool view's live arrays, then ``record(step, changes, seqs, events, metrics)``
  each step with the ranges the view's fold touched (``PoolView.take_changes()``): O(what changed);
- ``append_delta(delta)``: a :class:`StepDelta` (values at indices; unchanged entries are
  dropped, so a delta may over-report);
- ``append(snapshot)``: a full snapshot, diffed against the last step (O(slots); version-1
  traces and tests);
- ``append_record(record)``: a step record from a version-2 trace;
- ``record_decode_run(first_step, writes)``: the steps of a decode run (``Engine(coalesce=True)``,
  a trace's run frame), each rebuilt from the step before (:mod:`~pagedkv_core.record.decode_run`).
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from itertools import chain

import numpy as np

from ..events import Event
from ..metrics import StepMetrics
from .snapshot import BLOCK_ARRAYS, SCALAR_FIELDS, SLOT_ARRAYS, StepSnapshot
from .step_codec import SEQ_STATE_ARRAYS, STEP_FIELDS, StepState, decode_events, ranges, repeat_record, repeats, unpack

KEYFRAME_BYTES_PER_STEP = 16 << 10
MIN_KEYFRAME_EVERY, MAX_KEYFRAME_EVERY = 32, 512
POOL_SCALARS = tuple(name for name in SCALAR_FIELDS if name != "step")

_METRIC_FIELDS = tuple(fields(StepMetrics))
INT_METRICS = tuple(f.name for f in _METRIC_FIELDS if isinstance(getattr(StepMetrics(), f.name), int))
FLOAT_METRICS = tuple(f.name for f in _METRIC_FIELDS if isinstance(getattr(StepMetrics(), f.name), float))
_BYTES_OBJECT = 33 + 8  # a bytes object's header plus its list slot
_STATE_OVERHEAD = 2000  # the dicts and array headers of one StepState
MAX_IDLE_RUN = 1 << 24  # steps one idle run may cover (a trace says how many)
MAX_RECORDED_STEPS = 1 << 26  # steps a recording may hold (its metric curves are a column a step)
_RECORDS_PER_KEYFRAME_COPY = 16  # at() walks on from where it is rather than copy a keyframe, up to this many records more


def pool_bytes(num_slots: int, num_blocks: int) -> int:
    """Bytes of one full copy of the per-slot and per-block arrays."""
    per_slot = sum(np.dtype(t).itemsize for t in SLOT_ARRAYS.values())
    per_block = sum(np.dtype(t).itemsize for t in BLOCK_ARRAYS.values())
    return per_slot * num_slots + per_block * num_blocks


def default_keyframe_every(num_slots: int, num_blocks: int, budget: int = KEYFRAME_BYTES_PER_STEP) -> int:
    """Keyframe interval: the power of two, between MIN_KEYFRAME_EVERY and MAX_KEYFRAME_EVERY,
    that keeps keyframes near ``budget`` bytes a step."""
    want = max(1, -(-pool_bytes(num_slots, num_blocks) // budget))
    k = 1 << (want - 1).bit_length()
    return min(max(k, MIN_KEYFRAME_EVERY), MAX_KEYFRAME_EVERY)


@dataclass(eq=False)
class StepDelta:
    """One step as the engine reports it: values of the pool arrays at the indices it may
    have changed (a superset is fine), and the small parts whole."""

    step: int
    slot_idx: np.ndarray
    slot_state: np.ndarray
    slot_owner: np.ndarray
    slot_token: np.ndarray
    block_idx: np.ndarray
    block_state: np.ndarray
    block_ref: np.ndarray
    block_fill: np.ndarray
    block_hash: np.ndarray
    seqs: dict  # SEQ_ARRAYS and TABLE_ARRAYS of the snapshot, whole
    waiting: tuple[int, ...] = ()
    running: tuple[int, ...] = ()
    swapped: tuple[int, ...] = ()
    events: tuple[Event, ...] = ()
    metrics: StepMetrics = field(default_factory=StepMetrics)
    table_ids: np.ndarray | None = None  # seq ids whose block table may have changed (None: unknown, compare all)
    table_source: Mapping | None = None  # with ``seqs`` that hold no tables: seq id -> table, of every table that changed


_SORT_INDICES = 4096  # up to this many indices in all, range_indices sorts them rather than the spans


def range_indices(spans) -> np.ndarray:
    """int32 indices covered by half-open spans, merged (each index once, sorted). ``spans`` is
    flat, ``[lo0, hi0, lo1, hi1, ...]`` (a list, or the int64 array a PoolView hands over), or
    ``(lo, hi)`` pairs."""
    if not len(spans):
        return np.zeros(0, dtype=np.int32)
    if isinstance(spans, np.ndarray):
        flat = spans.astype(np.int64, copy=False)
    elif isinstance(spans[0], (tuple, list)):
        flat = np.fromiter(chain.from_iterable(spans), dtype=np.int64, count=2 * len(spans))
    else:
        flat = np.array(spans, dtype=np.int64)
    lo, hi = flat[0::2], flat[1::2]
    if (lo[1:] >= hi[:-1]).all() and (hi > lo).all():  # sorted and disjoint already
        return ranges(lo, hi - lo).astype(np.int32)
    length = np.maximum(hi - lo, 0)
    ends = np.cumsum(length)
    total = int(ends[-1])
    if total <= _SORT_INDICES:  # a step's few hundred slots: every index, sorted, each kept once
        if not total:
            return np.zeros(0, dtype=np.int32)
        idx = np.repeat(lo - (ends - length), length) + np.arange(total)
        idx.sort()
        first = np.empty(total, dtype=bool)
        first[0] = True
        np.not_equal(idx[1:], idx[:-1], out=first[1:])
        return idx[first].astype(np.int32)
    keep = hi > lo  # many indices: merge the spans first (their count, not the indices', is sorted)
    lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return np.zeros(0, dtype=np.int32)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    opens = np.concatenate([[True], lo[1:] > hi[:-1]])  # a range that starts past every earlier end
    closes = np.concatenate([opens[1:], [True]])
    starts, ends = lo[opens], hi[closes]
    return ranges(starts, ends - starts).astype(np.int32)


def delta_from_ranges(step: int, allocator_arrays: dict, slot_ranges, block_ranges, small: dict,
                      table_ids=None, table_source: Mapping | None = None) -> StepDelta:
    """A StepDelta from a pool view's dirty ranges: the values of ``allocator_arrays`` (its
    live slot_* and block_* arrays) at those ranges, and ``small`` = the snapshot's per-sequence
    arrays and tables, ``waiting``/``running``/``swapped``, ``events`` and ``metrics``.
    ``table_ids``: the seq ids whose block tables changed, when the allocator knows them.
    ``table_source``: when ``small`` holds no tables, those tables themselves (seq id -> table)."""
    slot_idx = range_indices(slot_ranges)
    block_idx = range_indices(block_ranges)
    values = {name: allocator_arrays[name][slot_idx] for name in SLOT_ARRAYS}
    values.update({name: allocator_arrays[name][block_idx] for name in BLOCK_ARRAYS})
    return StepDelta(
        step=step,
        slot_idx=slot_idx,
        block_idx=block_idx,
        **values,
        seqs={name: small[name] for name in SEQ_STATE_ARRAYS if name in small},
        waiting=tuple(small["waiting"]),
        running=tuple(small["running"]),
        swapped=tuple(small["swapped"]),
        events=tuple(small.get("events", ())),
        metrics=small.get("metrics", StepMetrics()),
        table_ids=None if table_ids is None else np.fromiter(table_ids, dtype=np.int64, count=len(table_ids)),
        table_source=table_source,
    )


def engine_step_delta(step: int, live: dict, changes, seqs: dict, events, metrics: StepMetrics) -> StepDelta:
    """The StepDelta of an engine's step (what :meth:`Recorder.record` takes): the values of the
    pool view's ``live`` arrays at ``changes``' slot and block ranges, gathered now (they move on
    with the next step), and the step's per-sequence arrays, queues, events and metrics.
    ``seqs`` without the block tables needs ``changes.tables`` as a mapping of seq id -> table
    of every table that changed."""
    small = {**seqs, "events": events, "metrics": metrics}
    tables = changes[2] if len(changes) > 2 else None
    source = None
    if "seq_tables" not in seqs:  # the engine's recording-only step: the changed tables come whole
        if not isinstance(tables, Mapping):
            raise ValueError("seqs without block tables need changes.tables as seq id -> table")
        source = tables
    return delta_from_ranges(step, live, changes[0], changes[1], small, tables, source)


def snapshot_delta(snap: StepSnapshot, state: StepState) -> StepDelta:
    """The delta from ``state`` to a full snapshot: np.flatnonzero over the arrays (O(slots))."""
    def changed(names) -> np.ndarray:
        mask = None
        for name in names:
            diff = state.pool[name] != getattr(snap, name)
            mask = diff if mask is None else mask | diff
        return np.flatnonzero(mask).astype(np.int32)

    slot_idx, block_idx = changed(SLOT_ARRAYS), changed(BLOCK_ARRAYS)
    return StepDelta(
        step=snap.step,
        slot_idx=slot_idx,
        block_idx=block_idx,
        **{name: getattr(snap, name)[slot_idx] for name in SLOT_ARRAYS},
        **{name: getattr(snap, name)[block_idx] for name in BLOCK_ARRAYS},
        seqs={name: getattr(snap, name) for name in SEQ_STATE_ARRAYS},
        waiting=snap.waiting,
        running=snap.running,
        swapped=snap.swapped,
        events=snap.events,
        metrics=snap.metrics,
    )


class _MetricColumns:
    """StepMetrics of every step as two growing 2-D arrays (int64 and float64 fields)."""

    def __init__(self):
        self.n = 0
        self.ints = np.zeros((64, len(INT_METRICS)), dtype=np.int64)
        self.floats = np.zeros((64, len(FLOAT_METRICS)), dtype=np.float64)

    def add(self, m: StepMetrics) -> None:
        if self.n == len(self.ints):
            self.ints = np.concatenate([self.ints, np.zeros_like(self.ints)])
            self.floats = np.concatenate([self.floats, np.zeros_like(self.floats)])
        self.ints[self.n] = [getattr(m, name) for name in INT_METRICS]
        self.floats[self.n] = [getattr(m, name) for name in FLOAT_METRICS]
        self.n += 1

    def row(self, i: int) -> StepMetrics:
        values = dict(zip(INT_METRICS, self.ints[i].tolist()))
        values.update(zip(FLOAT_METRICS, self.floats[i].tolist()))
        return StepMetrics(**values)

    def column(self, name: str) -> np.ndarray:
        if name in INT_METRICS:
            return self.ints[: self.n, INT_METRICS.index(name)].copy()
        if name in FLOAT_METRICS:
            return self.floats[: self.n, FLOAT_METRICS.index(name)].copy()
        raise KeyError(f"no metric named {name!r}")

    @property
    def nbytes(self) -> int:
        return self.ints.nbytes + self.floats.nbytes


class Recorder:
    """What takes a run's steps in, whatever keeps them: the engine calls ``start`` once and
    ``record`` each step (see the module docstring for the other ways in). Subclasses say
    what to do with each step record in :meth:`_keep`."""

    def __init__(self, keyframe_every: int | None = None):
        if keyframe_every is not None and (isinstance(keyframe_every, bool) or not isinstance(keyframe_every, int) or keyframe_every < 1):
            raise ValueError(f"keyframe_every must be an integer >= 1, got {keyframe_every!r}")
        self._k_wanted = keyframe_every
        self.keyframe_every = keyframe_every or 0
        self.scalars: dict | None = None
        self.first_step = 0
        self.num_steps = 0
        self._live: dict | None = None  # the pool view's arrays, for record()
        self._head: StepState | None = None  # the last step's arrays
        self._last: tuple[bytes, StepMetrics] | None = None  # the last step's record and metrics
        self._before: dict | None = None  # with wants_before: the pool values the last record's entries had before it
        self._in_run = False  # whether the last step belongs to a run of repeated steps

    wants_before = False  # whether _keep needs the pool values the record's entries had before (self._before)

    def _default_keyframe_every(self, num_slots: int, num_blocks: int) -> int:
        return default_keyframe_every(num_slots, num_blocks)

    def start(self, scalars: dict, arrays: dict | None = None, step: int = -1) -> None:
        """The pool's sizes, and its arrays before the first step (None: a blank pool) as of
        ``step`` (the first recorded step is then ``step + 1``). When the arrays are a
        pool view's live ones, :meth:`record` reads them each step."""
        if self.scalars is not None:
            raise ValueError("this recording has already started")
        self.scalars = {name: scalars[name] for name in POOL_SCALARS}
        slots, blocks = int(self.scalars["num_slots"]), int(self.scalars["num_blocks"])
        self.keyframe_every = self._k_wanted or self._default_keyframe_every(slots, blocks)
        self._live = arrays
        self._head = StepState(slots, blocks, pool=arrays, step=step)

    def record(self, step: int, changes, seqs: dict, events, metrics: StepMetrics) -> None:
        """The engine's per-step call: ``changes`` = its pool view's ``take_changes()``
        (slot ranges, block ranges and, if it has them, the seq ids whose tables changed);
        gathers the live arrays there. ``seqs`` without the block tables (``seq_arrays(...,
        tables=False)``) needs ``changes.tables`` as a mapping of seq id -> table of every
        table that changed: then the step costs what changed, not every table."""
        self.append_delta(engine_step_delta(step, self._live, changes, seqs, events, metrics))

    def record_decode_run(self, first_step: int, writes) -> None:
        """The engine's call for a decode run (``Engine(coalesce=True)``): the steps from
        ``first_step`` in which every running sequence decoded one token plainly, as
        :class:`~pagedkv_core.record.decode_run.DecodeWrites`. Kept here step by step, each
        step's delta rebuilt from the one before (a trace writer keeps the run as one frame).
        ValueError (one line) for a run the last step cannot go on with."""
        from .decode_run import run_deltas  # that module builds on StepDelta, defined here

        block_size = self._check_run(first_step, writes)
        for delta in run_deltas(self._head, first_step, writes, self._last[1], block_size):
            self.append_delta(delta)

    def _check_run(self, first_step: int, writes) -> int:
        """ValueError (one line) unless the last step can go on with the decode run ``writes``
        from ``first_step``; the pool's block size."""
        from .decode_run import check_run

        self._require_started()
        if not self.num_steps:
            raise ValueError("a decode run cannot be the first step")
        self._check_next(first_step)
        block_size = int(self.scalars["block_size"])
        check_run(self._head, self._last[1], writes, block_size)
        return block_size

    def append_delta(self, delta: StepDelta) -> None:
        self._require_started()
        self._check_next(delta.step)
        if self.num_steps == 0:
            self._head.step = delta.step - 1
        before = {} if self.wants_before and self.num_steps else None
        self._before = before
        self._store(self._head.encode(delta, before), delta.metrics)

    def append(self, snapshot: StepSnapshot) -> None:
        """Add a full snapshot (the first one also starts the recording, from a blank pool)."""
        if self.scalars is None:
            self.start({name: getattr(snapshot, name) for name in POOL_SCALARS})
        else:
            for name in POOL_SCALARS:
                if getattr(snapshot, name) != self.scalars[name]:
                    raise ValueError(f"step {snapshot.step}: {name} is {getattr(snapshot, name)!r}, the recording has {self.scalars[name]!r}")
        self._check_next(snapshot.step)
        self.append_delta(snapshot_delta(snapshot, self._head))

    def append_record(self, record: bytes, metrics: StepMetrics, state: StepState | None = None, validate: bool = True) -> None:
        """Add a step record (from a trace or another recording). ``state``: the arrays of the
        record's own step, required for the first step (whose record is relative to a pool
        the reader never saw). ValueError (one line) when it is bad."""
        self._require_started()
        if state is not None:
            state.check_record(record)
            self._head = state.copy()
            self._before = None
        elif self.num_steps == 0:
            raise ValueError("the first step record needs the state of its step")
        else:
            self._before = self._head.before(record) if self.wants_before else None
            self._head.apply(record, validate=validate)
        self._store(bytes(record), metrics)

    def append_idle(self, count: int, metrics: StepMetrics) -> None:
        """Add ``count`` steps that repeat the last step's arrays and queues, with no events and
        ``metrics`` each (an idle stretch, from a trace or another recording): one run."""
        self._require_started()
        if not self.num_steps:
            raise ValueError("an idle run cannot be the first step")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_IDLE_RUN:
            raise ValueError(f"an idle run covers 1..{MAX_IDLE_RUN:,} steps, got {count!r}")
        if self.num_steps + count > MAX_RECORDED_STEPS:
            raise ValueError(f"a recording holds at most {MAX_RECORDED_STEPS:,} steps")
        step = self._head.step + 1
        record = repeat_record(self._last[0], step)
        self._head.apply(record)
        self._head.idle_to(step + count - 1)
        i = self.num_steps
        self.num_steps += count
        self._keep_idle(i, count, record, metrics, extend=self._in_run and metrics == self._last[1])
        self._last, self._in_run = (record, metrics), True

    @property
    def head_state(self) -> StepState | None:
        """The last step's arrays (read them, never write)."""
        return self._head

    def holds(self, state: StepState) -> bool:
        """Whether the last step's arrays are ``state``'s (a trace's keyframes are checked so)."""
        return self._head is not None and self._head.step == state.step and self._head.equals(state)

    def _require_started(self) -> None:
        if self._head is None:
            raise ValueError("start() the recording (or append a full snapshot) first")

    def _check_next(self, step: int) -> None:
        if self.num_steps and step != self.first_step + self.num_steps:
            raise ValueError(f"step {step} does not follow step {self.first_step + self.num_steps - 1}")

    def _store(self, record: bytes, metrics: StepMetrics) -> None:
        if not self.num_steps:
            self.first_step = self._head.step
        i = self.num_steps
        self.num_steps += 1
        if i and repeats(record, self._last[0]):  # an idle step: a run, extended while its metrics stay
            self._keep_idle(i, 1, record, metrics, extend=self._in_run and metrics == self._last[1])
            self._in_run = True
        else:
            self._keep(i, record, metrics)
            self._in_run = False
        self._last = (record, metrics)

    def _keep(self, i: int, record: bytes, metrics: StepMetrics) -> None:
        """Keep the record of step index ``i``."""
        raise NotImplementedError

    def _keep_idle(self, i: int, count: int, record: bytes, metrics: StepMetrics, extend: bool) -> None:
        """Keep ``count`` steps from index ``i`` that repeat the step before, each with
        ``metrics`` (``record``: the first one's record): a new run, or (``extend``) more of
        the run before."""
        raise NotImplementedError


class Recording(Recorder):
    """Every step of one run in memory, delta-encoded (see the module docstring). A run of
    repeated steps (an idle stretch) is one record that covers them all."""

    def __init__(self, keyframe_every: int | None = None):
        super().__init__(keyframe_every)
        self._cursor: StepState | None = None  # the last step at() rebuilt
        self._records: list[bytes] = []  # one a step, or one a run of repeated steps
        self._starts = np.zeros(64, dtype=np.int64)  # the step index each record starts at
        self._keyframes: list[StepState] = []  # a copy of the state every K steps (runs of repeated steps take none)
        self._keyframe_at: list[int] = []  # the step index of each keyframe
        self._metrics = _MetricColumns()  # one row a record
        self._record_bytes = 0

    def _add(self, i: int, record: bytes, metrics: StepMetrics) -> None:
        n = len(self._records)
        if n == len(self._starts):
            self._starts = np.concatenate([self._starts, np.zeros_like(self._starts)])
        self._starts[n] = i
        self._records.append(record)
        self._record_bytes += len(record) + _BYTES_OBJECT + 8
        self._metrics.add(metrics)

    def _keep(self, i: int, record: bytes, metrics: StepMetrics) -> None:
        self._add(i, record, metrics)
        if i % self.keyframe_every == 0:
            self._keyframes.append(self._head.copy())
            self._keyframe_at.append(i)

    def _keep_idle(self, i: int, count: int, record: bytes, metrics: StepMetrics, extend: bool) -> None:
        """A run needs no keyframe: a step inside it is one record after the keyframe before it."""
        if not extend:
            self._add(i, record, metrics)

    def replay_into(self, target: Recorder) -> Recorder:
        """Feed every step into another recorder (a trace writer, say); returns it."""
        target.start(self.scalars, step=self.first_step - 1)
        ends = self._record_ends()
        for r, record in enumerate(self._records):
            count = int(ends[r] - self._starts[r])
            if count > 1:
                target.append_idle(count, self._metrics.row(r))
            else:
                target.append_record(record, self._metrics.row(r), state=self._keyframes[0] if r == 0 else None, validate=False)
        return target

    # ------------------------------------------------------------------ reading
    @property
    def num_keyframes(self) -> int:
        return len(self._keyframes)

    @property
    def num_records(self) -> int:
        """Records held: one a step, but one for each run of repeated steps."""
        return len(self._records)

    def idle_runs(self) -> list[tuple[int, int]]:
        """(first step, steps) of each run of two or more repeated steps (idle stretches)."""
        ends = self._record_ends()
        starts = self._starts[: len(self._records)]
        long = np.flatnonzero(ends - starts > 1)
        return [(self.first_step + int(starts[r]), int(ends[r] - starts[r])) for r in long]

    @property
    def last_step(self) -> int:
        return self.first_step + self.num_steps - 1

    @property
    def steps(self) -> range:
        return range(self.first_step, self.first_step + self.num_steps)

    def _index(self, step: int) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be an integer, got {step!r}")
        i = int(step) - self.first_step
        if not 0 <= i < self.num_steps:
            span = f"steps {self.first_step}..{self.last_step}" if self.num_steps else "no steps"
            raise IndexError(f"step {step} is not recorded (the recording has {span})")
        return i

    def _record_of(self, i: int) -> int:
        """The record that holds step index ``i``."""
        n = len(self._records)
        if n == self.num_steps:  # no runs
            return i
        return int(np.searchsorted(self._starts[:n], i, side="right")) - 1

    def _record_ends(self) -> np.ndarray:
        n = len(self._records)
        return np.append(self._starts[1:n], self.num_steps) if n else np.zeros(0, dtype=np.int64)

    def at(self, step: int, copy: bool = True) -> StepSnapshot:
        """The snapshot of ``step``, equal to the one the engine would have taken.
        ``copy=False`` skips copying the arrays (9 bytes a slot): they are then the
        recording's own, read-only, and change at the next ``at()``."""
        i = self._index(step)
        rec, r = self._seek(i)
        cur = self._cursor
        arrays = cur.arrays(copy=copy)
        if not copy:
            arrays = {name: a.view() for name, a in arrays.items()}
            for a in arrays.values():
                a.flags.writeable = False  # the view only: the cursor's own arrays stay writeable
        return StepSnapshot(
            step=cur.step,
            **self.scalars,
            **arrays,
            **cur.queues(rec),
            events=decode_events(rec["events"]),
            metrics=self._metrics.row(r),
        )

    def last(self) -> StepSnapshot:
        if not self.num_steps:
            raise IndexError("the recording has no steps")
        return self.at(self.last_step)

    def metrics(self, step: int) -> StepMetrics:
        return self._metrics.row(self._record_of(self._index(step)))

    def metrics_series(self, name: str) -> np.ndarray:
        """One metric over every step (int64 or float64), for curves."""
        column = self._metrics.column(name)
        if len(self._records) == self.num_steps:
            return column
        return np.repeat(column, self._record_ends() - self._starts[: len(self._records)])

    def events(self, step: int) -> tuple[Event, ...]:
        record = self._records[self._record_of(self._index(step))]
        return decode_events(unpack(STEP_FIELDS, record)["events"])

    def records(self):
        """The records in order: one a step, one a run of repeated steps."""
        return iter(self._records)

    def _seek(self, i: int) -> tuple[dict, int]:
        """Move the cursor to step index ``i``; returns that step's record fields and record index."""
        r = self._record_of(i)
        kf = i // self.keyframe_every
        if kf >= len(self._keyframe_at) or self._keyframe_at[kf] != kf * self.keyframe_every:  # runs took some
            kf = bisect_right(self._keyframe_at, i) - 1
        base = self._keyframe_at[kf]
        cur = self._cursor
        at = None if cur is None else cur.step - self.first_step
        if at is None or at > i or i - at > i - base + _RECORDS_PER_KEYFRAME_COPY:
            keyframe = self._keyframes[kf]
            if cur is None:
                self._cursor = cur = keyframe.copy()
            else:
                cur.copy_from(keyframe)
            at = base
        rec = None
        for j in range(self._record_of(at) + 1, r + 1):
            rec = cur.apply(self._records[j])
        if cur.step != self.first_step + i:  # inside a run
            cur.idle_to(self.first_step + i)
        return (rec if rec is not None else unpack(STEP_FIELDS, self._records[r])), r

    @property
    def nbytes(self) -> int:
        """Bytes this recording holds: step records, keyframes, metric columns and the two
        working states (the last step, and the step at() last rebuilt)."""
        states = len(self._keyframes) + (self._head is not None) + (self._cursor is not None)
        per_state = self._keyframes[0].nbytes if self._keyframes else (self._head.nbytes if self._head else 0)
        return (self._record_bytes + self._metrics.nbytes + self._starts.nbytes + 36 * len(self._keyframe_at)
                + states * (per_state + _STATE_OVERHEAD))
