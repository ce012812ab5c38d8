"""Where the KV pool's slots go: the memory-waste breakdown of the vLLM paper's Figure 2, measured.

At every step each slot of the pool is exactly one of

- **token**: it holds a token's K/V (slot states FILLED and SHARED; a shared block counts once);
- **reservation**: allocated, and the request will still write a token's K/V at that position
  before it finishes;
- **internal**: allocated, but nothing will ever be written there (the unreached tail of a
  contiguous reservation, or the unfilled end of a sequence's last block);
- **external**: free, but in a hole too small for the next waiting reservation (FRAGMENT);
- **free**: everything else, cached-free blocks included (they are reusable at once).

The shares are averaged over the steps in which anything is allocated, and ``token_share`` is
``token / (1 - free)``: the part of the memory in use that holds K/V (Kwon et al., SOSP 2023,
Figure 2: Orca Max 20.4 %, Pow2 26.8 %, Oracle 38.2 %, vLLM 96.3 %, on OPT-13B and ShareGPT).

Which empty allocated slots are reservation and which are internal depends on how long each
sequence ends up, so the split is made after the run from a little per-step data (O(live
sequences) per step, never O(slots)) and each sequence's final length, ``final_written``: the
number of positions whose K/V the sequence holds when it ends (its ``num_computed`` then; for a
sequence that finished normally that is its token count minus one, because the last sampled
token's K/V is never computed). An empty slot at position ``p`` of a sequence is reservation iff
``p < final_written``. "Will still write" is about the position, not the physical slot: a
sequence preempted by recompute drops its slots and later writes those positions again
elsewhere, and until its preemption the slots it held for them count as reservation (that is
what they were reserved for). A block shared by the samples of a forked request is counted
once, as reservation where any of its holders will still write.

Usage, with or without snapshots::

    acc = WasteAccumulator()
    engine.run(on_step=lambda outputs, snap: acc.add_snapshot(snap))
    acc.breakdown(final_written(engine))  # {"token": ..., ..., "free": ..., "token_share": ...}

    summary, breakdown = measure_run(engine)  # the same in one call, without snapshots

:meth:`WasteAccumulator.add_step` takes the parts directly (the per-sequence arrays of
:func:`pagedkv_core.record.snapshot.seq_arrays`, the step's metrics and the blocks' reference
counts), for an engine that records deltas instead of snapshots.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

CLASSES = ("token", "reservation", "internal", "external", "free")
RANGE_CHUNK = 1 << 16  # ranges a chunk holds (1.3 MB)
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def final_written(engine, released: Mapping[int, int] | None = None) -> dict[int, int]:
    """Per sequence id: the positions whose K/V the sequence holds at its end (see the module
    docstring). Call it after the run; a sequence still unfinished counts what it holds now.
    ``released``: the same for the sequences a streamed engine forgot (:class:`Released`)."""
    return {**(released or {}), **{sid: seq.num_computed for sid, seq in engine.scheduler.seqs.items()}}


class Released(dict):
    """What each sequence a streamed engine forgot had written (``Engine.feed(on_release=...)``):
    without it their allocated empty slots could not be told reservation from internal."""

    def __call__(self, seq) -> None:
        self[seq.seq_id] = seq.num_computed


class WasteAccumulator:
    """Collects what the breakdown needs, one step at a time, and splits it at the end.

    Per step it keeps the slot counters and, for each sequence that has allocated but empty
    slots, the range of positions they cover: ``(seq_id, lo, hi)`` with ``lo`` its
    ``num_computed`` and ``hi`` the positions its allocation covers. A range inside a block that
    several sequences share (forked samples before copy-on-write) is kept once per holder with
    the block's id, and counted once.
    """

    def __init__(self) -> None:
        self._num_slots: list[int] = []
        self._allocated: list[int] = []
        self._token: list[int] = []
        self._external: list[int] = []
        # The ranges, in int32 chunks of RANGE_CHUNK rows (columns: step, seq_id, lo, hi, block;
        # block -1: the range is the sequence's own): 20 bytes a range, no object per step. A
        # step's ranges are never split between chunks.
        self._chunks: list[np.ndarray] = []
        self._used: list[int] = []  # rows used in each chunk

    @property
    def num_steps(self) -> int:
        return len(self._num_slots)

    # ------------------------------------------------------------------ feeding
    def add_snapshot(self, snap) -> None:
        """One :class:`~pagedkv_core.record.snapshot.StepSnapshot`."""
        self.add_step(snap.kind, snap.num_slots, snap.block_size, snap.metrics, snap, snap.block_ref)

    def add_engine(self, engine) -> None:
        """The engine's state after a step (``engine.step(snapshot=False)`` is enough, and no pool
        view is needed): the allocator's counters, the live sequences' arrays the step built, and
        for a paged allocator the sequences' current blocks and their reference counts, read from
        it. No per-slot copy."""
        from .snapshot import seq_arrays

        alloc = engine.allocator
        seqs = getattr(engine, "last_seqs", None)  # the step already built them
        if seqs is None:
            seqs = seq_arrays(alloc, engine.scheduler, tables=False)
        paged = alloc.kind == "paged"
        self.add_step(alloc.kind, alloc.num_slots, alloc.block_size, alloc.usage(), seqs,
                      alloc.ref_counts if paged else None, block_at=alloc.blocks_at if paged else None)

    def add_step(self, kind: str, num_slots: int, block_size: int, metrics, seqs, block_ref, block_at=None) -> None:
        """One step from its parts: ``kind`` ("paged" | "contiguous"), the pool's slots, the
        block size as snapshots state it (1 for contiguous), the step's
        :class:`~pagedkv_core.metrics.StepMetrics` or anything with its ``allocated_slots``,
        ``filled_slots`` and ``fragmented_slots``, ``seqs`` (a mapping or an object with the arrays ``seq_id``,
        ``seq_num_computed``, ``seq_num_blocks`` and, unless ``block_at`` is given, ``seq_table_offsets``
        and ``seq_tables``) and the blocks' reference counts (paged; read only at the sequences'
        current blocks): an array indexed by block id, or a function that takes block ids and
        returns theirs. ``block_at(seq_ids, block_indices)``: those blocks of those sequences'
        tables, instead of the tables."""
        get = seqs.__getitem__ if isinstance(seqs, Mapping) else lambda name: getattr(seqs, name)
        step = len(self._num_slots)
        self._num_slots.append(int(num_slots))
        self._allocated.append(int(metrics.allocated_slots))
        self._token.append(int(metrics.filled_slots))
        self._external.append(int(metrics.fragmented_slots))
        ids = np.asarray(get("seq_id"), dtype=np.int64)
        lo = np.asarray(get("seq_num_computed"), dtype=np.int64)
        hi = np.asarray(get("seq_num_blocks"), dtype=np.int64) * block_size
        has = hi > lo
        if not has.any():
            return
        block = np.full(len(ids), -1, dtype=np.int64)
        if kind == "paged":
            # Only the block holding position num_computed can be shared and still have room:
            # blocks before it are full, blocks after it are fresh and private, and prefix-cache
            # hits are full blocks. Its holders (forked samples) share lo and the block's end.
            rows = np.flatnonzero(has)
            if block_at is not None:
                tail = np.asarray(block_at(ids[rows].tolist(), (lo[rows] // block_size).tolist()), dtype=np.int64)
            else:
                offsets = np.asarray(get("seq_table_offsets"), dtype=np.int64)
                tail = np.asarray(get("seq_tables"))[offsets[rows] + lo[rows] // block_size]
            refs = block_ref(tail.tolist()) if callable(block_ref) else np.asarray(block_ref)[tail]
            shared = np.asarray(refs) > 1
            if shared.any():
                rows, tail = rows[shared], tail[shared].astype(np.int64)
                end = (lo[rows] // block_size + 1) * block_size
                beyond = hi[rows] > end  # private blocks past the shared one (not seen in practice)
                extra = rows[beyond]
                self._append(step, ids[extra], end[beyond], hi[extra], np.full(len(extra), -1, dtype=np.int64))
                hi = hi.copy()
                hi[rows] = np.minimum(hi[rows], end)
                block[rows] = tail
        keep = np.flatnonzero(has)
        self._append(step, ids[keep], lo[keep], hi[keep], block[keep])

    def _append(self, step: int, ids, lo, hi, block) -> None:
        n = len(ids)
        if not n:
            return
        if not self._chunks or self._used[-1] + n > len(self._chunks[-1]):
            self._chunks.append(np.empty((max(RANGE_CHUNK, n), 5), dtype=np.int32))
            self._used.append(0)
        rows = np.column_stack([np.full(n, step, dtype=np.int64), ids, lo, hi, block])
        if rows.min() < INT32_MIN or rows.max() > INT32_MAX:
            raise ValueError(f"step {step}: a range does not fit 32 bits")
        at = self._used[-1]
        self._chunks[-1][at : at + n] = rows
        self._used[-1] = at + n

    def _ranges(self):
        """(steps, ids, lo, hi, block) int64 arrays of each chunk's used rows."""
        for chunk, used in zip(self._chunks, self._used):
            yield tuple(chunk[:used, c].astype(np.int64) for c in range(5))

    # ------------------------------------------------------------------ results
    def series(self, final_written: Mapping[int, int]) -> dict[str, np.ndarray]:
        """Per step, slot counts of every class (int64 arrays) and ``num_slots``; the classes
        of a step sum to its ``num_slots``. Also ``empty``: allocated-but-empty slots as the
        per-sequence ranges cover them (equal to allocated - token when the layout is sound)."""
        n = self.num_steps
        num_slots = np.asarray(self._num_slots, dtype=np.int64)
        allocated = np.asarray(self._allocated, dtype=np.int64)
        token = np.asarray(self._token, dtype=np.int64)
        external = np.asarray(self._external, dtype=np.int64)
        reservation = np.zeros(n, dtype=np.int64)
        empty = np.zeros(n, dtype=np.int64)
        if self._chunks:
            top = max(int(chunk[:used, 1].max()) for chunk, used in zip(self._chunks, self._used)) + 1
            written = np.zeros(top, dtype=np.int64)
            known = [(sid, w) for sid, w in final_written.items() if 0 <= sid < top]
            if known:
                sid, w = np.array(known, dtype=np.int64).T
                written[sid] = w
        for steps, ids, lo, hi, block in self._ranges():  # chunk by chunk: no copy of them all
            res = np.clip(written[ids] - lo, 0, hi - lo)
            size = hi - lo
            own = block < 0
            np.add.at(reservation, steps[own], res[own])
            np.add.at(empty, steps[own], size[own])
            if not own.all():
                # A shared block's empty tail once per (step, block): reservation where any
                # holder will still write (the holders' ranges are the same).
                key = steps[~own] * (int(block.max()) + 1) + block[~own]
                uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
                best = np.zeros(len(uniq), dtype=np.int64)
                np.maximum.at(best, inverse, res[~own])
                group_steps = steps[~own][first]
                np.add.at(reservation, group_steps, best)
                np.add.at(empty, group_steps, size[~own][first])
        internal = allocated - token - reservation
        free = num_slots - allocated - external
        return {
            "token": token,
            "reservation": reservation,
            "internal": internal,
            "external": external,
            "free": free,
            "num_slots": num_slots,
            "empty": empty,
        }

    def breakdown(self, final_written: Mapping[int, int]) -> dict[str, float]:
        """The class shares of the pool averaged over the steps in which anything is
        allocated (they sum to 1), plus ``token_share`` = token / (1 - free)."""
        s = self.series(final_written)
        busy = s["num_slots"] - s["free"] - s["external"] > 0  # something is allocated
        if not busy.any():
            return {**{c: 0.0 for c in CLASSES}, "free": 1.0, "token_share": 0.0}
        slots = s["num_slots"][busy].astype(np.float64)
        out = {c: float(np.mean(s[c][busy] / slots)) for c in CLASSES}
        used = 1.0 - out["free"]
        out["token_share"] = out["token"] / used if used > 0 else 0.0
        return out


def waste_breakdown(snapshots: Iterable, final_written: Mapping[int, int]) -> dict[str, float]:
    """:meth:`WasteAccumulator.breakdown` over a run's snapshots (any iterable of them)."""
    acc = WasteAccumulator()
    for snap in snapshots:
        acc.add_snapshot(snap)
    return acc.breakdown(final_written)


def measure_run(engine, max_steps: int | None = None, released: Mapping[int, int] | None = None,
                on_step=None) -> tuple[object, dict[str, float]]:
    """Run ``engine`` to the end (or ``max_steps`` calls of its ``step``) and return its
    :class:`~pagedkv_core.metrics.RunSummary` and its breakdown. Each step is read from the
    engine (:meth:`WasteAccumulator.add_engine`), with no snapshot and no outputs; an idle stretch
    that passed in one call (``skip_idle``) counts each of its steps. ``released``: as for
    :func:`final_written` (a streamed run's forgotten sequences). ``on_step(engine)``: called after
    each call of its ``step`` (a progress line)."""
    acc = WasteAccumulator()
    calls = 0
    while engine.has_unfinished() and (max_steps is None or calls < max_steps):
        before = engine.step_index
        engine.step(snapshot=False, outputs=False)
        calls += 1
        for _ in range(engine.step_index - before):
            acc.add_engine(engine)
        if on_step is not None:
            on_step(engine)
    return engine.summary(), acc.breakdown(final_written(engine, released))
