"""Continuous batching over either allocator.

One step, in order:

1. **Running sequences**, in admission order (the running list is kept in the order the
   sequences were admitted or resumed, as vLLM v1 keeps it), each get room for the tokens
   they compute this step: one for a decode, a chunk for an unfinished prefill. When the pool
   cannot give a sequence its slot, the tail of the running list, the most recently admitted
   sequence, is preempted (swap or recompute), possibly the one asking; repeat until the slot
   is there. A request submitted first but admitted later is evicted first.
2. **Swapped sequences** resume first (in submission order) when their blocks fit above the
   watermark; a resumed sequence joins the tail of the running list.
3. **Waiting sequences** are admitted FCFS, with prefix-cache hits, while the pool minus the
   watermark allows and nothing is still swapped out. The first that does not fit blocks
   the queue (head-of-line). Steps that preempted resume and admit nothing.

The watermark is waived when nothing is running: there is nobody to protect. A per-step
token budget (``max_batch_tokens``) limits decodes and chunks prefills. After the token
source ran, :meth:`Scheduler.complete` marks K/V written, appends sampled tokens (forking
``n`` samples), checks stop conditions and frees finished sequences.

Plain decodes (a running sequence's one new token written into a block it holds alone, without
filling it: ``Allocator.decode_slot``) go in the step's :class:`~.batch.DecodeLane`: nothing to
grow, no SeqWork unless the token source wants one, and one ``write_decodes`` call for all of
them. They keep their place in the step's order (the batch's, and the finish events'). The
running list is a :class:`~.running.RunningSet`: a sequence that decoded plainly keeps a column
saying where its next plain decode goes. From ``Scheduler.columns_from`` running sequences on, a
step takes those sequences by whole columns (choosing, writing, checking their stops, listing
them for a recording) and works one at a time only on the sequences that cross a block
boundary, finish, are preempted or admitted; below it, one at a time is cheaper, and the
columns are not kept.

Decode runs: :meth:`Scheduler.quiet_ahead` says how many of the next steps can be nothing but
a plain decode of every running sequence, and :meth:`Scheduler.run_decodes` takes that many at
once, each sequence's tokens from one call of the source (``Engine(coalesce=True)``).

Values, not shared state: :meth:`Scheduler.schedule` returns a :class:`StepPlan` (the batch,
the per-sequence work, the step's counts and its events so far) and :meth:`Scheduler.complete`
takes that plan and returns the rest of the step's events. The allocator returns its events
too (:class:`~.kv.protocol.Admission`, :class:`~.kv.protocol.Growth`); the scheduler alone
writes ``seq.num_computed``.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from .kv.protocol import Allocator
from .batch import DecodeLane, ScheduledBatch, SeqWork
from .config import EngineConfig
from .events import ADMIT, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN, Event
from .metrics import StepCounts
from .running import LAST, NUM_OUT, SLOT, RunningSet
from .sequence import FINISH_LENGTH, FINISH_STOP, Request, Sequence, SequenceStatus

_ORDER = lambda s: s.order  # noqa: E731  (FCFS key: request index, sample index)
_PLACE = lambda pair: pair[0]  # noqa: E731  (finished sequences: their place in the step)
_AT = itemgetter(0)


@dataclass(slots=True)
class Work:
    """One sequence's share of a step: ``count`` tokens from position ``start``; ``num_samples``
    tokens to sample at its end (0: a prefill chunk that samples nothing); ``at``: its place
    among the step's sequences."""

    seq: Sequence
    start: int
    count: int
    num_samples: int
    at: int


@dataclass
class StepPlan:
    """What :meth:`Scheduler.schedule` decided for one step; :meth:`Scheduler.complete` takes it."""

    step: int
    batch: ScheduledBatch
    counts: StepCounts = field(default_factory=StepCounts)
    events: list[Event] = field(default_factory=list)  # chronological, allocator's and scheduler's
    # (place, seq, tokens this step, the slot of a plain decode or -1) of the sequences taken one at a
    # time, in the order the step takes them; a sequence's place is its index in the running list
    chosen: list[tuple[int, Sequence, int, int]] = field(default_factory=list)
    lane_spans: list[list[int]] = field(default_factory=list)  # [a, b): places of plain decodes by their columns
    by_columns: bool = False  # plain decodes taken by whole columns (else in ``chosen``, each with its slot)
    work: list[Work] = field(default_factory=list)  # the step's sequences but the lane's, once built
    lane: DecodeLane = field(default_factory=DecodeLane)  # its plain decodes, once built
    lane_cols: np.ndarray | None = None  # their columns (RunningSet.lane), as the step found them
    budget: int = 1 << 62  # tokens left this step


class Completion(NamedTuple):
    """What :meth:`Scheduler.complete` did: the step's counts and its events after the forward."""

    counts: StepCounts
    events: list[Event]


class Scheduler:
    """``schedule(step)`` plans a step; ``complete(plan, new_tokens)`` applies it and returns what
    the step did as :class:`Completion` (``totals`` sums the counts over the run)."""

    # Running sequences from which a step takes its plain decodes by whole columns. Below, a loop
    # over them costs less than numpy's fixed cost a call: measured side by side on the scripted
    # source, the two ways cross between 48 and 64 running sequences.
    columns_from = 56

    def __init__(self, config: EngineConfig, allocator: Allocator, eos_token_id: int | None, max_model_len: int,
                 lane_source: bool = False, slot_source: bool = True):
        """``lane_source``: the token source reads plain decodes as ``batch.lane`` (else each is
        also a SeqWork in ``batch.seqs``). ``slot_source=False``: it reads no K/V places (the
        SeqWorks' ``slots`` and ``block_table`` are left empty; a prefill chunk's slots would be
        a list as long as the chunk)."""
        self.config = config
        self.lane_source = lane_source
        self.slot_source = slot_source
        self.allocator = allocator
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.budget_per_step = config.max_batch_tokens
        self.watermark_blocks = config.watermark_blocks if allocator.capabilities.swap else 0
        self.swap_enabled = config.preemption == "swap" and allocator.capabilities.swap
        self.waiting: list[Sequence] = []  # sorted by order
        self._run = RunningSet()  # the running list with its sequences' columns (running.py)
        self.keeps_columns = False  # the last step kept the columns up to date (it took them by columns)
        self.running: list[Sequence] = self._run.seqs  # in admission order: the last is the most recently admitted
        self.swapped: list[Sequence] = []  # sorted by order
        self.totals = StepCounts()
        self._seq_ids = itertools.count()
        self.seqs: dict[int, Sequence] = {}  # every sequence ever made, by id
        self.touched: set[Request] = set()  # requests that changed this step
        self.ended: set[Request] = set()  # of them, those a sequence of which finished this step
        self.sampled: set[int] = set()  # seq ids that got a token this step, but the lane's:
        self.lane_sampled: list[Sequence] = []  # the step's plain decodes (each got a token, and touched its request)
        self._stop_ids: frozenset[int] = frozenset()  # every token that can stop some sequence
        self._stop_array = np.zeros(0, dtype=np.int64)  # the same, for the lane's check

    # ------------------------------------------------------------------ queues
    def new_sequence(self, request: Request, sample_index: int, token_ids: list[int], fork_into: int = 1) -> Sequence:
        seq = Sequence(next(self._seq_ids), request, sample_index, token_ids, fork_into)
        seq.stop_at, seq.stop_ids = self._stop_bounds(seq)
        if not seq.stop_ids <= self._stop_ids:
            self._stop_ids |= seq.stop_ids
            self._stop_array = np.array(sorted(self._stop_ids), dtype=np.int64)
        request.seqs.append(seq)
        self.seqs[seq.seq_id] = seq
        return seq

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_ORDER)

    @property
    def live(self) -> list[Sequence]:
        return self.waiting + self.running + self.swapped

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def new_step(self) -> None:
        """Forget which requests and sequences the last step touched."""
        self.touched.clear()
        self.ended.clear()
        self.sampled.clear()
        self.lane_sampled = []

    # ------------------------------------------------------------------ one step
    def schedule(self, step: int) -> StepPlan:
        """Plan one step: the three phases in order, then the batch."""
        plan = StepPlan(step, ScheduledBatch(step=step, block_size=self.allocator.block_size))
        if self.budget_per_step is not None:
            plan.budget = self.budget_per_step
        self._schedule_running(plan)
        if plan.counts.preemptions == 0:
            self._resume_swapped(plan)
            if not self.swapped:
                self._admit_waiting(plan)
        self._build_batch(plan)
        return plan

    def _schedule_running(self, plan: StepPlan) -> None:
        """1. Running sequences: room for this step's tokens, preempting the youngest. From
        ``columns_from`` running sequences on, a stretch of sequences whose columns know their
        plain decode is taken whole, the others one at a time; below it, every one alone (a loop
        costs less than numpy's fixed cost a call there)."""
        run = self._run
        by_columns = plan.by_columns = len(self.running) >= self.columns_from
        if not by_columns:
            if self.keeps_columns:  # from here on, what the steps do is not kept in the columns
                run.forget()
                self.keeps_columns = False
            self._running_one_by_one(plan, self.running, 0, len(self.running), plan.budget)
            return
        self.keeps_columns = True
        running = self.running
        budget = plan.budget
        unknown = (run.slot < 0).nonzero()[0].tolist()  # places to look at one at a time, in order
        k = 0
        i = 0
        while i < len(running) and budget > 0:
            j = unknown[k] if k < len(unknown) else len(running)
            if j > i:  # i .. j-1 decode plainly, where their columns say
                j = min(j, len(running), i + budget)
                self._lane_span(plan, i, j)
                budget -= j - i
                i = j
                continue
            k += 1
            i, budget = self._running_one_by_one(plan, running, i, i + 1, budget)
        plan.budget = budget

    def _running_one_by_one(self, plan: StepPlan, running: list[Sequence], i: int, stop: int, budget: int) -> tuple[int, int]:
        """Running sequences ``i`` to ``stop`` (or the list's end, if it gets shorter) one at a time,
        from ``budget`` tokens; returns where it stopped and the tokens left (also in ``plan.budget``).
        A plain decode goes to the columns (``plan.by_columns``) or into ``plan.chosen`` with its slot."""
        chosen, by_columns, run = plan.chosen, plan.by_columns, self._run
        try_append, decode_slot = self.allocator.try_append, self.allocator.decode_slot
        while i < stop and i < len(running) and budget > 0:
            seq = running[i]
            decoding = len(seq.token_ids) > seq.num_prompt_tokens
            slot = decode_slot(seq) if decoding else -1  # a plain decode needs nothing more
            count = 1
            if slot < 0:
                count = len(seq.token_ids) - seq.num_computed
                if count > budget:
                    count = budget
                growth = try_append(seq, count)
                if growth is None or growth.copies or growth.events:  # short of blocks, or growth to note
                    if not self._make_room(seq, count, plan, growth):
                        continue  # seq itself left the running list
                    if count == 1 and decoding:  # a decode into the block it just got may be plain now
                        slot = decode_slot(seq)
            if slot >= 0 and by_columns:
                run.set_plain(i, slot, seq)
                self._lane_span(plan, i, i + 1)
            else:
                if by_columns:
                    run.touch(i)
                chosen.append((i, seq, count, slot))
            budget -= count
            i += 1
        plan.budget = budget
        return i, budget

    @staticmethod
    def _lane_span(plan: StepPlan, start: int, stop: int) -> None:
        spans = plan.lane_spans
        if spans and spans[-1][1] == start:
            spans[-1][1] = stop
        else:
            spans.append([start, stop])

    def _make_room(self, seq: Sequence, count: int, plan: StepPlan, growth) -> bool:
        """Room for ``count`` more tokens of running ``seq`` (``growth``: what ``try_append`` just
        answered), preempting from the running list's tail while the pool is short. False when
        ``seq`` itself had to go."""
        alloc, running = self.allocator, self.running
        while growth is None:
            if len(running) == 1:
                # Alone and still no room: the sequence has outgrown the whole pool.
                self._run.pop()
                plan.events.append(self._finish(seq, FINISH_LENGTH, "kv pool exhausted"))
                return False
            victim = self._run.pop()
            self._preempt(victim, plan)
            if victim is seq:
                return False
            growth = alloc.try_append(seq, count)
        plan.batch.copies.extend(growth.copies)
        plan.events.extend(growth.events)
        return True

    def _resume_swapped(self, plan: StepPlan) -> None:
        """2. Swapped sequences resume first, in submission order, above the watermark."""
        alloc = self.allocator
        while self.swapped and plan.budget > 0:
            seq = self.swapped[0]
            if alloc.exceeds_pool(seq):
                self.swapped.pop(0)
                plan.events.append(self._finish(seq, FINISH_LENGTH, "kv pool exhausted"))
                continue
            pairs = alloc.swap_in(seq, self.watermark_blocks if self.running else 0)
            if pairs is None:
                break
            self.swapped.pop(0)
            plan.batch.swap_in.extend(pairs)
            plan.counts.swaps_in += 1
            seq.status = SequenceStatus.RUNNING
            self._run.append(seq)
            detail = {"host_blocks": [h for h, _ in pairs], "blocks": alloc.block_table(seq)}
            plan.events.append(Event(SWAP_IN, seq.seq_id, seq.request.request_id, detail))
            self._choose(seq, plan)

    def _admit_waiting(self, plan: StepPlan) -> None:
        """3. Waiting sequences, FCFS, while the pool (minus the watermark) allows; the first
        that does not fit blocks the queue (head-of-line)."""
        alloc = self.allocator
        while self.waiting and plan.budget > 0:
            seq = self.waiting[0]
            if alloc.exceeds_pool(seq):
                self.waiting.pop(0)
                plan.events.append(self._finish(seq, FINISH_LENGTH, "kv pool exhausted"))
                continue
            reserve = self.watermark_blocks if self.running else 0
            recompute = seq.status == SequenceStatus.PREEMPTED
            admission = alloc.try_admit(seq, reserve)
            if admission is None:
                break
            self.waiting.pop(0)
            seq.num_computed = admission.cached_tokens
            seq.status = SequenceStatus.RUNNING
            self._run.append(seq)
            plan.events.extend(admission.events)
            detail = {"cached_tokens": admission.cached_tokens, "recompute": recompute}
            plan.events.append(Event(ADMIT, seq.seq_id, seq.request.request_id, detail))
            self._choose(seq, plan)

    def _choose(self, seq: Sequence, plan: StepPlan) -> None:
        """``seq`` just joined the running list's tail: its tokens this step."""
        count = min(seq.num_tokens - seq.num_computed, plan.budget)
        plan.chosen.append((len(self.running) - 1, seq, count, -1))
        plan.budget -= count

    def _build_batch(self, plan: StepPlan) -> None:
        """4. The batch: what the token source computes for each chosen sequence (plain
        decodes: the lane, and a SeqWork too unless the source reads the lane)."""
        alloc, counts = self.allocator, plan.counts
        prefill = decode = 0
        add_seq, add_work = plan.batch.seqs.append, plan.work.append
        slots_for, block_table = alloc.slots_for, alloc.table_view
        works, places = not self.lane_source, self.slot_source
        taken = plan.chosen
        picks = []  # plain decodes taken one at a time: (place, seq, slot)
        if plan.lane_spans:
            plan.lane = lane = self._lane(plan)
            decode += len(lane)
            if works:  # every plain decode is a SeqWork too, in its place
                taken = sorted(taken + list(zip(lane.at.tolist(), lane.seqs, [1] * len(lane), lane.slots.tolist())),
                               key=_AT)
        for at, seq, count, slot in taken:
            if slot >= 0:  # a plain decode
                if not plan.by_columns:
                    picks.append((at, seq, slot))
                if not works:  # for the lane alone
                    continue
            start = seq.num_computed
            end = start + count
            tokens = seq.token_ids
            num_tokens = len(tokens)
            num_samples = seq.fork_into if end == num_tokens else 0
            request = seq.request
            num_out = num_tokens - seq.num_prompt_tokens
            add_seq(
                SeqWork(
                    seq.seq_id,
                    request.request_id,
                    seq.sample_index,
                    tokens[start:end],
                    start,
                    ([slot] if slot >= 0 else slots_for(seq, start, count)) if places else [],
                    block_table(seq, end) if places else [],
                    num_samples,
                    request.sampling,
                    num_out,
                    request.output_len,
                )
            )
            if slot >= 0:  # a plain decode, in the lane as well
                continue
            add_work(Work(seq, start, count, num_samples, at))
            if count == 1 and num_out > 0 and end == num_tokens:
                decode += 1
            else:
                prefill += count
        if picks:
            plan.lane = self._lane_of(picks)
            decode += len(picks)
        if not works:
            plan.batch.lane = plan.lane
        counts.prefill_tokens = prefill
        counts.decode_tokens = decode
        counts.tokens = prefill + decode

    @staticmethod
    def _lane_of(picks: list[tuple[int, Sequence, int]]) -> DecodeLane:
        """The plain decodes taken one at a time (``(place, seq, slot)`` each), as a lane."""
        seqs = [seq for _, seq, _ in picks]
        return DecodeLane(seqs=seqs, slots=[slot for _, _, slot in picks],
                          at=[at for at, _, _ in picks], num_out=[len(s.token_ids) - s.num_prompt_tokens for s in seqs],
                          last=[s.token_ids[-1] for s in seqs])

    def _lane(self, plan: StepPlan) -> DecodeLane:
        """The plain decodes at the running list's places ``plan.lane_spans``, by their columns."""
        running = self.running
        spans = plan.lane_spans
        at, plan.lane_cols = self._run.lane(spans)
        cols = plan.lane_cols
        if len(spans) == 1:
            a, b = spans[0]
            seqs = running[a:b]
        else:
            seqs = []
            for a, b in spans:
                seqs += running[a:b]
        return DecodeLane(seqs=seqs, slots=cols[SLOT], at=at, num_out=cols[NUM_OUT], last=cols[LAST])

    def complete(self, plan: StepPlan, new_tokens: dict[int, list[int]]) -> Completion:
        """Apply a step's results (requests that changed go to ``touched``, the lane's sequences to
        ``lane_sampled``); returns the step's
        counts and the events after the forward (forks, finishes)."""
        alloc = self.allocator
        events: list[Event] = []
        finished: list[tuple[int, Sequence]] = []  # (place in the step, seq)
        generated = 0
        mark_written, get = alloc.mark_written, new_tokens.get
        touched, sampled, stop_reason = self.touched.add, self.sampled.add, self._stop_reason
        for w in plan.work:
            seq = w.seq
            mark_written(seq, w.start, w.count)
            seq.num_computed = w.start + w.count
            if w.num_samples == 0:
                continue
            tokens = get(seq.seq_id)
            if tokens is None or len(tokens) != w.num_samples:
                raise RuntimeError(
                    f"token source returned {tokens!r} for sequence {seq.seq_id}; expected {w.num_samples} token(s)"
                )
            touched(seq.request)
            if w.num_samples == 1:  # the usual case: one token, no fork
                token = int(tokens[0])
                seq.token_ids.append(token)
                sampled(seq.seq_id)
                generated += 1
                if token in seq.stop_ids or len(seq.token_ids) >= seq.stop_at:
                    reason = stop_reason(seq, token)
                    if reason is not None:
                        finished.append((w.at, seq))
                        seq.finish_reason = reason
                continue
            samples = [seq] + self._fork(seq, w.num_samples, events)
            for sample, token in zip(samples, tokens):
                sample.token_ids.append(int(token))
                self.sampled.add(sample.seq_id)
                generated += 1
                reason = self._stop_reason(sample, int(token))
                if reason is not None:
                    finished.append((w.at, sample))
                    sample.finish_reason = reason
        lane = plan.lane
        if lane.seqs and plan.by_columns:
            seqs, at = lane.seqs, lane.at
            tokens = self._lane_tokens(lane, new_tokens)
            after = alloc.write_decodes(lane.slots, lane.last, after=True)  # each one's last token, before its new one
            for seq, token in zip(seqs, tokens):
                seq.token_ids.append(token)
                seq.num_computed += 1
            new = np.array(tokens, dtype=np.int64)
            over = self._run.advance(at, plan.lane_cols, new, after)
            check = over >= 0  # a length limit may end them; or a token that can stop some sequence:
            if len(self._stop_array):
                check |= self.stop_hits(new)
            for i in check.nonzero()[0].tolist():
                seq = seqs[i]
                reason = stop_reason(seq, tokens[i])
                if reason is not None:
                    finished.append((int(at[i]), seq))
                    seq.finish_reason = reason
        elif lane.seqs:
            seqs = lane.seqs
            alloc.write_decodes(lane.slots, lane.last)  # each one's last token, before its new one
            for at, seq, token in zip(lane.at, seqs, self._lane_tokens(lane, new_tokens)):
                seq.num_computed += 1
                ids = seq.token_ids
                ids.append(token)
                if token in seq.stop_ids or len(ids) >= seq.stop_at:
                    reason = stop_reason(seq, token)
                    if reason is not None:
                        finished.append((at, seq))
                        seq.finish_reason = reason
        if lane.seqs:
            self.lane_sampled = lane.seqs
            generated += len(lane.seqs)
            finished.sort(key=_PLACE)
        for _, seq in finished:
            self._run.remove(seq)
            events.append(self._finish(seq, seq.finish_reason, None))
        counts = plan.counts
        counts.num_running = len(self.running)  # after the step: its finished are gone, its forks counted
        counts.tokens_generated = generated
        self.totals.add(counts)
        return Completion(counts, events)

    def _lane_tokens(self, lane: DecodeLane, new_tokens: dict[int, list[int]]) -> list[int]:
        """The lane's new tokens, in its order: ``lane.tokens`` from a source that reads the lane,
        else each sequence's one token from ``new_tokens``."""
        if self.lane_source:
            tokens = lane.tokens
            if tokens is None or len(tokens) != len(lane.seqs):
                got = "no tokens" if tokens is None else f"{len(tokens)} token(s)"
                raise RuntimeError(f"token source answered {got} for a lane of {len(lane.seqs)} plain decodes")
            return tokens
        out = []
        for seq in lane.seqs:
            tokens = new_tokens.get(seq.seq_id)
            if tokens is None or len(tokens) != 1:
                raise RuntimeError(f"token source returned {tokens!r} for sequence {seq.seq_id}; expected 1 token(s)")
            out.append(int(tokens[0]))
        return out

    def _fork(self, seq: Sequence, num_samples: int, events: list[Event]) -> list[Sequence]:
        """The ``num_samples - 1`` children of a prefilled ``seq``, sharing its blocks."""
        if num_samples <= 1:
            return []
        seq.fork_into = 1
        children = []
        for i in range(1, num_samples):
            child = self.new_sequence(seq.request, i, list(seq.token_ids))
            child.status = SequenceStatus.RUNNING
            child.block_hashes = list(seq.block_hashes)
            events.extend(self.allocator.fork(seq, child))
            child.num_computed = seq.num_computed
            self._run.append(child)  # admitted with its parent, after it
            children.append(child)
        return children

    # ------------------------------------------------------------------ decode runs
    @property
    def stop_tokens(self) -> np.ndarray:
        """Every token that can stop some sequence (sorted int64)."""
        return self._stop_array

    def stop_hits(self, tokens: np.ndarray) -> np.ndarray:
        """Where ``tokens`` (any shape) holds a token that can stop some sequence. A few stop
        tokens (the usual eos alone) are compared one by one: ``np.isin`` costs ~20 µs a call."""
        stops = self._stop_array
        if len(stops) > 8:
            return np.isin(tokens, stops)
        hit = tokens == stops[0] if len(stops) else np.zeros(tokens.shape, dtype=bool)
        for stop in stops[1:].tolist():
            hit |= tokens == stop
        return hit

    def quiet_ahead(self, limit: int) -> int:
        """How many of the next steps, at most ``limit``, can do nothing but a plain decode of
        every running sequence: nothing waits or is swapped out, the token budget takes them
        all, and none crosses a block boundary or reaches a length that may end it (a stop
        token among their tokens is the caller's to look for). 0: the next step may do more.

        A plain decode's block is the sequence's alone and not full, and nothing else changes it:
        the next ones go to the slots after it, up to the block's last but one (a decode that
        fills the block is not plain). An allocator that never preempts reserves each
        sequence's whole future (``capabilities.swap``): there only the length bounds a run."""
        running = self.running
        if limit <= 0 or not running or self.waiting or self.swapped:
            return 0
        if self.budget_per_step is not None and self.budget_per_step < len(running):
            return 0
        alloc = self.allocator
        decode_slot, bs, blocks_bound = alloc.decode_slot, alloc.block_size, alloc.capabilities.swap
        if blocks_bound:  # first, from the counts alone: a decode at a block's last slot fills it, and one at a
            # block's first slot needs a block the allocator takes only then (neither is plain)
            last = bs - 1
            for seq in running:
                at = seq.num_computed % bs
                if at == 0 or at == last:
                    return 0
        k = limit
        for seq in running:
            ids = seq.token_ids
            slot = decode_slot(seq) if len(ids) > seq.num_prompt_tokens else -1
            if slot < 0:
                return 0
            left = seq.stop_at - len(ids) - 1
            if blocks_bound and bs - 1 - slot % bs < left:
                left = bs - 1 - slot % bs
            if left < k:
                if left <= 0:
                    return 0
                k = left
        return k

    def run_decodes(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``tokens.shape[1]`` steps at once, each a plain decode of every running sequence
        (``tokens[i]``: sequence ``i``'s tokens, in the running order; at most what
        :meth:`quiet_ahead` allowed), counted in :attr:`totals` as those steps. The allocator
        writes them in one ``write_decodes`` call (each token's K/V at the slot after the last).
        Returns what was written, for a recording: each sequence's first slot, and the ``(n, k)``
        tokens whose K/V went there and into the slots after it, step by step."""
        running = self.running
        n, k = tokens.shape
        if n != len(running) or k < 1:
            raise ValueError(f"a decode run of {k} step(s) for {n} sequence(s), with {len(running)} running")
        alloc = self.allocator
        first = np.array([alloc.decode_slot(seq) for seq in running], dtype=np.int64)
        written = np.empty((n, k), dtype=np.int64)  # the K/V each step writes: the token before its new one
        written[:, 0] = [seq.token_ids[-1] for seq in running]
        written[:, 1:] = tokens[:, :-1]
        alloc.write_decodes((first[:, None] + np.arange(k)).ravel(), written.ravel())
        for seq, row in zip(running, tokens.tolist()):
            seq.token_ids.extend(row)
            seq.num_computed += k
        if self.keeps_columns:
            self._run.advance_run(k, tokens[:, -1], alloc.decode_slot)
        counts = StepCounts(num_running=n, tokens=n, decode_tokens=n, tokens_generated=n)
        for _ in range(k):
            self.totals.add(counts)
        return first, written

    def running_rows(self):
        """The running sequences' listed state, ``(7, len(running))``: see :meth:`.running.RunningSet.rows`
        (read from the columns where the last step kept them; from each sequence otherwise)."""
        rows = self._run.rows(self.allocator)
        if not self.keeps_columns:  # what the next steps do will not be kept: read them all again next time
            self._run.forget()
        return rows

    def check_invariants(self) -> None:
        """Assert the running list's rows say what the sequences and the allocator say."""
        assert self.running is self._run.seqs, "the running list was replaced"
        self._run.check(self.allocator)

    # ------------------------------------------------------------------ helpers
    def _stop_bounds(self, seq: Sequence) -> tuple[int, frozenset[int]]:
        """(the fewest tokens at which a length rule of :meth:`_stop_reason` can end ``seq``, the
        tokens that can stop it): a token outside the set, short of that length, ends nothing."""
        sampling, prompt = seq.request.sampling, seq.num_prompt_tokens
        at = min(prompt + sampling.max_tokens, self.max_model_len)
        output_len = seq.request.output_len
        if output_len is not None and output_len < sampling.max_tokens:
            at = min(at, prompt + output_len)
        stops = set(sampling.stop_token_ids or ())
        if self.eos_token_id is not None and not sampling.ignore_eos:
            stops.add(self.eos_token_id)
        return at, frozenset(stops)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        request = seq.request
        sampling = request.sampling
        if token == self.eos_token_id and not sampling.ignore_eos:
            return FINISH_STOP
        if sampling.stop_token_ids and token in sampling.stop_token_ids:
            return FINISH_STOP
        num_tokens = len(seq.token_ids)
        n_out = num_tokens - seq.num_prompt_tokens
        output_len = request.output_len
        if output_len is not None and n_out >= output_len and output_len < sampling.max_tokens:
            return FINISH_STOP
        if n_out >= sampling.max_tokens or num_tokens >= self.max_model_len:
            return FINISH_LENGTH
        return None

    def _finish(self, seq: Sequence, reason: str, why: str | None) -> Event:
        self.touched.add(seq.request)
        self.ended.add(seq.request)
        self.allocator.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        detail = {"reason": reason, "output_tokens": seq.num_output_tokens}
        if why:
            detail["why"] = why
        return Event(FINISH, seq.seq_id, seq.request.request_id, detail)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        counts = plan.counts
        counts.preemptions += 1
        rid = seq.request.request_id
        reason = "preemption mode is recompute"
        if self.swap_enabled:
            device_blocks = self.allocator.block_table(seq)
            pairs = self.allocator.swap_out(seq)
            if pairs is not None:
                plan.batch.swap_out.extend(pairs)
                counts.swaps_out += 1
                seq.status = SequenceStatus.SWAPPED
                bisect.insort(self.swapped, seq, key=_ORDER)
                detail = {"blocks": device_blocks, "host_blocks": [h for _, h in pairs]}
                plan.events.append(Event(PREEMPT_SWAP, seq.seq_id, rid, detail))
                return
            reason = "host pool full"
        blocks = self.allocator.block_table(seq)
        self.allocator.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.PREEMPTED
        counts.recomputes += 1
        bisect.insort(self.waiting, seq, key=_ORDER)
        plan.events.append(Event(PREEMPT_RECOMPUTE, seq.seq_id, rid, {"reason": reason, "blocks": blocks}))
