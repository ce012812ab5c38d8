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
RANGE_CHUNK = 1 << 14  # runs a chunk holds (768 KB)
_EMPTY = np.zeros(0, dtype=np.int64)


def _no_runs() -> tuple:
    """Open runs, none (see ``WasteAccumulator._open``)."""
    return _EMPTY, np.zeros(0, dtype=bool), _EMPTY, _EMPTY, _EMPTY, _EMPTY


class _Lines:
    """Per step, the sum of straight lines: ``add(first, steps, value)`` adds ``value - t`` at
    step ``first + t`` for t in [0, steps), for each line; ``total()`` the sums (int64, exact).
    O(lines) to add, O(steps) to total, in two arrays: a line's value is the running sum of its
    changes from step to step (``value`` at ``first``, then -1 a step, and back to 0 after its
    last step), and its -1s are themselves the running sum of a -1 at ``first + 1`` and a +1 at
    ``first + steps``."""

    def __init__(self, num_steps: int):
        self.n = num_steps
        self.slope = np.zeros(num_steps + 2, dtype=np.int64)  # the -1s, as changes
        self.jump = np.zeros(num_steps + 2, dtype=np.int64)  # the value at the first step, and the drop after the last

    def add(self, first: np.ndarray, steps: np.ndarray, value: np.ndarray) -> None:
        keep = steps > 0
        first, steps, value = first[keep], steps[keep], value[keep]
        end = first + steps
        np.add.at(self.slope, first + 1, -1)
        np.add.at(self.slope, end, 1)
        np.add.at(self.jump, first, value)
        np.add.at(self.jump, end, steps - 1 - value)  # back from value - (steps - 1) to 0

    def total(self) -> np.ndarray:
        """The sums, step by step (computed in place: call it once)."""
        x = np.cumsum(self.slope, out=self.slope)
        x += self.jump
        np.cumsum(x, out=x)
        return x[: self.n]


def final_written(engine, released: Mapping[int, int] | None = None) -> dict[int, int]:
    """Per sequence id: the positions whose K/V the sequence holds at its end (see the module
    docstring). Call it after the run; a sequence still unfinished counts what it holds now.
    ``released``: the same for the sequences a streamed engine forgot (:class:`Released`)."""
    return {**(released or {}), **{sid: seq.num_computed for sid, seq in engine.scheduler.seqs.items()}}


class Released(dict):
    """What each sequence a streamed engine forgot had written (``Engine.feed(on_release=...)``):
    without it their allocated empty slots could not be told reservation from internal.
    :meth:`take` hands them on (to :meth:`WasteAccumulator.release`) and forgets them, so that
    it holds only the sequences forgotten since."""

    def __call__(self, seq) -> None:
        self[seq.seq_id] = seq.num_computed

    def take(self) -> dict[int, int]:
        out = dict(self)
        self.clear()
        return out


class WasteAccumulator:
    """Collects what the breakdown needs, one step at a time, and splits it at the end.

    Per step it keeps the slot counters and, for each sequence that has allocated but empty
    slots, the range of positions they cover: ``lo`` its ``num_computed`` to ``hi``, the
    positions its allocation covers. A range inside a block that several sequences share
    (forked samples before copy-on-write) is kept once per holder with the block's id, and
    counted once.

    The ranges are kept as **runs**, not one a step: while a sequence decodes into the same
    allocation, its range at each step is the last one moved on by one position (``lo`` one
    more, ``hi`` the same), so consecutive steps extend one run ``(first step, steps, seq_id,
    lo at the first step, hi, block)`` and only a run that ends is stored. A paged sequence
    stores about one run a block it fills, a contiguous one about one a reservation: the memory
    follows what changed, not the steps times the sequences (the work a step stays a few numpy
    calls over the live sequences). A shared block's range is a run of one step.

    What is kept till the end. ``per_step=True`` (the default) keeps every step's counters and
    every run, for :meth:`series`, the classes step by step. ``per_step=False`` keeps what
    :meth:`breakdown` needs and no more: the counters summed over the steps in which anything is
    allocated, and the runs of sequences that have not ended. A run's reservation summed over
    its steps is a closed form of its range and its sequence's final length, so once the
    sequences it covers have ended and said what they wrote (:meth:`release`, from a streamed
    engine's ``on_release``), it is added to one sum and dropped. The memory then follows the
    sequences alive, not the log (``simulate`` of a 200,000-request log: 300 MB at its peak
    before, 98 MB so). :func:`measure_run` works so; both give the same breakdown, to the bit.
    """

    def __init__(self, per_step: bool = True, resolve_at: int = RANGE_CHUNK) -> None:
        """``resolve_at`` (``per_step=False``): the ended runs kept before those whose sequences
        all ended are summed and dropped (next, at twice the runs left, or ``resolve_at``)."""
        self.per_step = per_step
        self._steps = 0
        self._last = (0, 0, 0, 0)  # the last step's num_slots, allocated, token, external
        # per_step: those counters, step by step
        self._num_slots: list[int] = []
        self._allocated: list[int] = []
        self._token: list[int] = []
        self._external: list[int] = []
        # else: the pool's size (one a run), the steps with anything allocated, and allocated,
        # token and external summed over them; the reservation of the runs summed and dropped;
        # the final lengths of released sequences of which runs are still kept.
        self._pool: int | None = None
        self._busy = 0
        self._sums = [0, 0, 0]
        self._reserved = 0
        self._written: dict[int, int] = {}
        self._resolve_every = self._resolve_at = max(1, int(resolve_at))
        # Ended runs, in int64 chunks of RANGE_CHUNK runs (rows: first step, steps, seq_id, lo,
        # hi, block; block -1: the range is the sequence's own): 48 bytes a run.
        self._chunks: list[np.ndarray] = []
        self._used: list[int] = []  # rows used in each chunk
        # The last step's live sequences, in its order: seq_id, whether a run of its own range
        # is open (bool), and that run's first step, its lo then, and lo and hi at the last step.
        self._open = _no_runs()
        self._open_step = -1  # the step the open runs reached

    @property
    def num_steps(self) -> int:
        return self._steps

    @property
    def num_runs(self) -> int:
        """Runs kept, ended or open (what the accumulator's memory grows with, 48 bytes each)."""
        return sum(self._used) + int(np.count_nonzero(self._open[1]))

    @property
    def num_lengths(self) -> int:
        """Final lengths of released sequences held for runs not yet summed."""
        return len(self._written)

    # ------------------------------------------------------------------ feeding
    def add_snapshot(self, snap) -> None:
        """One :class:`~pagedkv_core.record.snapshot.StepSnapshot`."""
        self.add_step(snap.kind, snap.num_slots, snap.block_size, snap.metrics, snap, snap.block_ref)

    def add_engine(self, engine, steps: int = 1) -> None:
        """The engine's state after a step (``engine.step(snapshot=False)`` is enough, and no pool
        view is needed): the allocator's counters, the live sequences' arrays the step built, and
        for a paged allocator the sequences' current blocks and their reference counts, read from
        it. No per-slot copy. ``steps``: that many steps of this state (an idle stretch the engine
        skipped in one call): with no live sequence they cost O(1) here, not one add each. A
        decode run the call took after its step (``engine.decode_run``, ``Engine(coalesce=True)``)
        is among those steps: its steps are added as one (:meth:`add_decode_run`)."""
        if steps < 1:
            return
        run = getattr(engine, "decode_run", None)
        self._add_engine(engine, run)
        if run is not None:
            self.add_decode_run(run.steps, run.num_seqs)
            steps -= run.steps
        if steps > 1 and not len(self._open[0]):  # nothing live: the steps repeat the counters alone
            self._count(*self._last, times=steps - 1)
            self._open_step += steps - 1
            return
        for _ in range(steps - 1):
            self._add_engine(engine)

    def _add_engine(self, engine, run=None) -> None:
        """The engine's step; with ``run`` (its decode run after the step) the state before the run."""
        from .snapshot import seq_arrays

        alloc = engine.allocator
        seqs = getattr(engine, "last_seqs", None)  # the step already built them (before any decode run)
        if seqs is None:
            seqs = seq_arrays(alloc, engine.scheduler, tables=False)
        usage = alloc.usage()
        if run is not None:  # the run filled a slot a sequence a step
            usage = usage._replace(filled_slots=usage.filled_slots - run.steps * run.num_seqs)
        paged = alloc.kind == "paged"
        tails = paged and alloc.num_forks > 0  # before any fork no block with room is shared
        self.add_step(alloc.kind, alloc.num_slots, alloc.block_size, usage, seqs,
                      alloc.ref_counts if tails else None, block_at=alloc.blocks_at if tails else None)

    def add_step(self, kind: str, num_slots: int, block_size: int, metrics, seqs, block_ref, block_at=None) -> None:
        """One step from its parts: ``kind`` ("paged" | "contiguous"), the pool's slots, the
        block size as snapshots state it (1 for contiguous), the step's
        :class:`~pagedkv_core.metrics.StepMetrics` or anything with its ``allocated_slots``,
        ``filled_slots`` and ``fragmented_slots``, ``seqs`` (a mapping or an object with the arrays ``seq_id``,
        ``seq_num_computed``, ``seq_num_blocks`` and, unless ``block_at`` is given, ``seq_table_offsets``
        and ``seq_tables``) and the blocks' reference counts (paged; read only at the sequences'
        current blocks): an array indexed by block id, or a function that takes block ids and
        returns theirs; None where no block with room left is shared (a paged allocator before its
        first fork: nothing is looked up). ``block_at(seq_ids, block_indices)``: those blocks of those sequences'
        tables, instead of the tables."""
        get = seqs.__getitem__ if isinstance(seqs, Mapping) else lambda name: getattr(seqs, name)
        step = self._steps
        self._count(int(num_slots), int(metrics.allocated_slots), int(metrics.filled_slots),
                    int(metrics.fragmented_slots))
        ids = np.array(get("seq_id"), dtype=np.int64)  # copies: the open runs keep them past this step
        lo = np.array(get("seq_num_computed"), dtype=np.int64)
        hi = np.asarray(get("seq_num_blocks"), dtype=np.int64) * block_size
        has = hi > lo
        own = has
        if kind == "paged" and block_ref is not None and has.any():
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
                srows, stail = rows[shared], tail[shared].astype(np.int64)
                end = (lo[srows] // block_size + 1) * block_size
                beyond = hi[srows] > end  # private blocks past the shared one (not seen in practice)
                extra = srows[beyond]
                self._store(step, 1, ids[extra], end[beyond], hi[extra], -1)
                self._store(step, 1, ids[srows], lo[srows], np.minimum(hi[srows], end), stail)
                own = has.copy()
                own[srows] = False
        self._extend(step, ids, lo, hi, own)

    def add_decode_run(self, steps: int, num_seqs: int) -> None:
        """``steps`` more steps in which each of the last step's ``num_seqs`` live sequences (all
        of them, with ranges of their own) wrote one more position into what it holds: one more
        filled slot each a step (the counters, a step at a time), every open run moved on
        ``steps`` positions at once."""
        o_ids, o_own, o_first, o_lo0, o_lo, o_hi = self._open
        if steps < 1:
            return
        if len(o_ids) != num_seqs or not o_own.all() or (o_lo + steps >= o_hi).any():
            raise ValueError(f"a decode run of {num_seqs} sequence(s) over {len(o_ids)} live, not all with room left")
        num_slots, allocated, token, external = self._last
        for j in range(1, steps + 1):
            self._count(num_slots, allocated, token + j * num_seqs, external)
        self._open = (o_ids, o_own, o_first, o_lo0, o_lo + steps, o_hi)
        self._open_step += steps

    def _extend(self, step: int, ids, lo, hi, own) -> None:
        """Move the open runs on to ``step``, at which the live sequences ``ids`` have the ranges
        [``lo``, ``hi``), their own where ``own``: a range that is its sequence's range of the step
        before moved on by one position extends that run; every other one opens a run, and a
        run not extended ends (it is stored)."""
        o_ids, o_own, o_first, o_lo0, o_lo, o_hi = self._open
        first, lo0, ended = np.full(len(ids), step, dtype=np.int64), lo, o_own
        if self._open_step == step - 1 and len(o_ids) and len(ids):
            if len(ids) == len(o_ids) and (ids == o_ids).all():  # the same sequences in the same order: the usual step
                goes_on = own & o_own & (lo == o_lo + 1) & (hi == o_hi)
                ended = o_own & ~goes_on
                first = np.where(goes_on, o_first, step)
                lo0 = np.where(goes_on, o_lo0, lo)
            else:  # each sequence's place the step before (a place holding another id: none)
                order = np.argsort(o_ids, kind="stable")
                at = order[np.minimum(np.searchsorted(o_ids, ids, sorter=order), len(o_ids) - 1)]
                goes_on = own & (o_ids[at] == ids) & o_own[at] & (lo == o_lo[at] + 1) & (hi == o_hi[at])
                ended = o_own.copy()
                ended[at[goes_on]] = False
                first = np.where(goes_on, o_first[at], step)
                lo0 = np.where(goes_on, o_lo0[at], lo)
        if ended.any():
            e = np.flatnonzero(ended)
            self._store(o_first[e], self._open_step + 1 - o_first[e], o_ids[e], o_lo0[e], o_hi[e], -1)
        self._open = (ids, own, first, lo0, lo, hi)
        self._open_step = step

    def release(self, written: Mapping[int, int]) -> None:
        """What sequences that ended and were forgotten wrote (seq id -> final written, as
        :class:`Released` takes them): with ``per_step=False`` their runs are summed and dropped."""
        self._written.update(written)

    def _count(self, num_slots: int, allocated: int, token: int, external: int, times: int = 1) -> None:
        """The slot counters of ``times`` steps alike."""
        self._steps += times
        self._last = (num_slots, allocated, token, external)
        if self.per_step:
            for counter, value in zip((self._num_slots, self._allocated, self._token, self._external), self._last):
                counter.extend([value] * times)
            return
        if self._pool is None:
            self._pool = num_slots
        elif num_slots != self._pool:
            raise ValueError(f"a pool of {num_slots:,} slots after one of {self._pool:,}: one pool a run")
        if allocated > 0:
            self._busy += times
            for i, value in enumerate((allocated, token, external)):
                self._sums[i] += value * times

    def _store(self, first, steps, ids, lo, hi, block) -> None:
        """Ended runs (first step, steps, seq_id, lo at the first step, hi, block); scalars
        stand for every run. With ``per_step=False``, past ``resolve_at`` runs kept, those whose
        sequences have all ended are summed and dropped."""
        self._put(first, steps, ids, lo, hi, block)
        if not self.per_step and self._written and sum(self._used) >= self._resolve_at:
            self._resolve()

    def _put(self, first, steps, ids, lo, hi, block) -> None:
        n = len(ids)
        if not n:
            return
        if not self._chunks or self._used[-1] + n > self._chunks[-1].shape[1]:
            self._chunks.append(np.empty((6, max(RANGE_CHUNK, n)), dtype=np.int64))
            self._used.append(0)
        at = self._used[-1]
        rows = self._chunks[-1][:, at : at + n]
        rows[0], rows[1], rows[2], rows[3], rows[4], rows[5] = first, steps, ids, lo, hi, block
        self._used[-1] = at + n

    def _resolve(self) -> None:
        """Add the reservation of the ended runs whose sequences all said what they wrote to the
        sum, and keep the others (and the final lengths they need) alone."""
        runs = _joined(list(self._runs(open_ones=False)))
        reserved, done = _reservation(runs, self._written, final=False)
        self._reserved += reserved
        kept = tuple(a[~done] for a in runs)
        self._chunks, self._used = [], []
        self._put(*kept)
        needed = set(np.unique(kept[2]).tolist()) | set(self._open[0].tolist())  # open runs end later
        self._written = {sid: w for sid, w in self._written.items() if sid in needed}
        self._resolve_at = max(self._resolve_every, 2 * len(kept[0]))

    def _runs(self, open_ones: bool = True):
        """(first, steps, ids, lo, hi, block) int64 arrays of each chunk's runs, then of the
        runs still open (as if they ended at the last step)."""
        for chunk, used in zip(self._chunks, self._used):
            yield tuple(chunk[:, :used])
        ids, own, first, lo0, _, hi = self._open
        if open_ones and own.any():
            first, ids, lo0, hi = first[own], ids[own], lo0[own], hi[own]
            yield first, self._open_step + 1 - first, ids, lo0, hi, np.full(len(ids), -1, dtype=np.int64)

    # ------------------------------------------------------------------ results
    def series(self, final_written: Mapping[int, int]) -> dict[str, np.ndarray]:
        """Per step, slot counts of every class (int64 arrays) and ``num_slots``; the classes
        of a step sum to its ``num_slots``. Also ``empty``: allocated-but-empty slots as the
        per-sequence ranges cover them (equal to allocated - token when the layout is sound).
        Only with ``per_step=True``."""
        if not self.per_step:
            raise ValueError("this accumulator keeps sums, not steps (per_step=False): ask for its breakdown")
        final_written = {**self._written, **final_written}
        n = self.num_steps
        num_slots = np.asarray(self._num_slots, dtype=np.int64)
        allocated = np.asarray(self._allocated, dtype=np.int64)
        token = np.asarray(self._token, dtype=np.int64)
        external = np.asarray(self._external, dtype=np.int64)
        reservation = np.zeros(n, dtype=np.int64)
        empty = np.zeros(n, dtype=np.int64)
        runs = list(self._runs())
        if runs:
            top = max(int(r[2].max()) for r in runs) + 1
            written = np.zeros(top, dtype=np.int64)
            known = [(sid, w) for sid, w in final_written.items() if 0 <= sid < top]
            if known:
                sid, w = np.array(known, dtype=np.int64).T
                written[sid] = w
        # An own run's range at its t-th step is [lo + t, hi): hi - lo - t empty slots, of which
        # max(min(w - lo, hi - lo) - t, 0) reservation (w: the sequence's final written). Such
        # straight lines over a run's steps are summed per step by _Lines, one class at a time.
        for out, reserved in ((empty, False), (reservation, True)):
            lines = _Lines(n)
            for first, steps, ids, lo, hi, block in runs:  # chunk by chunk: no copy of them all
                own = block < 0
                if own.any():
                    f, size = first[own], hi[own] - lo[own]
                    if reserved:
                        reach = np.minimum(written[ids[own]] - lo[own], size)
                        lines.add(f, np.clip(reach, 0, steps[own]), reach)
                    else:
                        lines.add(f, steps[own], size)
            out += lines.total()
            del lines
        for first, steps, ids, lo, hi, block in runs:
            shared = block >= 0
            if shared.any():
                # A shared block's empty tail once per (step, block): reservation where any
                # holder will still write (the holders' ranges are the same). These runs are one
                # step each, and a step's are stored at once (in one chunk).
                at_step, blk, size = first[shared], block[shared], hi[shared] - lo[shared]
                res = np.clip(written[ids[shared]] - lo[shared], 0, size)
                key = at_step * (int(blk.max()) + 1) + blk
                uniq, first_of, inverse = np.unique(key, return_index=True, return_inverse=True)
                best = np.zeros(len(uniq), dtype=np.int64)
                np.maximum.at(best, inverse, res)
                group_steps = at_step[first_of]
                np.add.at(reservation, group_steps, best)
                np.add.at(empty, group_steps, size[first_of])
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
        allocated (they sum to 1), plus ``token_share`` = token / (1 - free). ``final_written``:
        the sequences' final lengths (:func:`final_written`; those :meth:`release` gave need
        not be in it)."""
        if not self.per_step:
            written = {**self._written, **final_written}
            runs = _joined(list(self._runs()))
            reserved = self._reserved + _reservation(runs, written, final=True)[0]
            return _shares(self._busy, self._pool or 0, *self._sums, reserved)
        s = self.series(final_written)
        allocated = s["num_slots"] - s["free"] - s["external"]
        busy = allocated > 0
        slots = s["num_slots"][busy]
        if len(slots) and (slots != slots[0]).any():
            raise ValueError("a breakdown is of one pool: the steps' num_slots differ")
        pool = int(slots[0]) if len(slots) else 0  # the sums per_step=False keeps, the same
        return _shares(int(busy.sum()), pool, int(allocated[busy].sum()), int(s["token"][busy].sum()),
                       int(s["external"][busy].sum()), int(s["reservation"][busy].sum()))


def _shares(busy: int, pool: int, allocated: int, token: int, external: int, reservation: int) -> dict[str, float]:
    """The breakdown from sums over ``busy`` steps of a ``pool``-slot pool (slot-steps)."""
    if busy <= 0:
        return {**{c: 0.0 for c in CLASSES}, "free": 1.0, "token_share": 0.0}
    total = busy * pool
    out = {"token": token / total, "reservation": reservation / total,
           "internal": (allocated - token - reservation) / total, "external": external / total,
           "free": (total - allocated - external) / total}
    used = 1.0 - out["free"]
    out["token_share"] = out["token"] / used if used > 0 else 0.0
    return out


def _joined(parts: list[tuple]) -> tuple:
    """Runs from :meth:`WasteAccumulator._runs`, as one tuple of six arrays."""
    if not parts:
        return tuple(_EMPTY for _ in range(6))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(6))


def _lookup(ids: np.ndarray, written: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each id's final written in ``written`` (0 if it has none), and whether it has one."""
    if not written or not len(ids):
        return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
    keys = np.fromiter(written.keys(), np.int64, len(written))
    values = np.fromiter(written.values(), np.int64, len(written))
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    at = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
    known = keys[at] == ids
    return np.where(known, values[at], 0), known


def _reservation(runs: tuple, written: Mapping[int, int], final: bool) -> tuple[int, np.ndarray]:
    """The reservation, in slot-steps, of the ``runs`` (first, steps, ids, lo, hi, block arrays)
    whose sequences ``written`` gives the final lengths of, and which runs those are. ``final``:
    every run (a sequence missing from ``written`` writes nothing more).

    An own run's range at its t-th step is [lo + t, hi), of which max(reach - t, 0) slots are
    reservation, reach = min(w, hi) - lo: summed over its steps, k * reach - k (k - 1) / 2 with
    k = clip(reach, 0, steps). A shared block's tail counts once a step, as reservation where any
    of its holders will still write: its group (the step and the block) is summed once every
    holder's length is known."""
    first, steps, ids, lo, hi, block = runs
    w, known = _lookup(ids, written)
    if final:
        known[:] = True
    own = block < 0
    done = own & known
    reach = np.minimum(w[done], hi[done]) - lo[done]
    k = np.clip(reach, 0, steps[done])
    total = int((k * reach - k * (k - 1) // 2).sum())
    shared = np.flatnonzero(~own)
    if len(shared):
        size = hi[shared] - lo[shared]
        res = np.clip(w[shared] - lo[shared], 0, size)
        key = first[shared] * (int(block[shared].max()) + 1) + block[shared]
        _, inverse = np.unique(key, return_inverse=True)
        groups = int(inverse.max()) + 1
        complete = np.ones(groups, dtype=bool)
        np.logical_and.at(complete, inverse, known[shared])
        best = np.zeros(groups, dtype=np.int64)
        np.maximum.at(best, inverse, res)
        total += int(best[complete].sum())
        done[shared] = complete[inverse]
    return total, done


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
    that passed in one call (``skip_idle``) counts each of its steps, added at once. ``released``: as for
    :func:`final_written` (a streamed run's forgotten sequences); a :class:`Released` is taken from as
    the run goes (it ends empty), so that neither it nor the split holds what ended long ago.
    ``on_step(engine)``: called after each call of its ``step`` (a progress line)."""
    acc = WasteAccumulator(per_step=False)  # sums: the memory follows the sequences alive
    calls = 0
    while engine.has_unfinished() and (max_steps is None or calls < max_steps):
        before = engine.step_index
        engine.step(snapshot=False, outputs=False)
        calls += 1
        if isinstance(released, Released) and released:  # handed on, not kept twice
            acc.release(released.take())
        acc.add_engine(engine, steps=engine.step_index - before)
        if on_step is not None:
            on_step(engine)
    return engine.summary(), acc.breakdown(final_written(engine, released))
