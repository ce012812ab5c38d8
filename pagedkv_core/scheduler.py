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
"""
from __future__ import annotations

import bisect
import itertools

from .kv.protocol import Allocator
from .batch import ScheduledBatch, SeqWork
from .config import EngineConfig
from .events import ADMIT, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN, Event
from .metrics import StepCounts
from .sequence import FINISH_LENGTH, FINISH_STOP, Request, Sequence, SequenceStatus

_ORDER = lambda s: s.order  # noqa: E731  (FCFS key: request index, sample index)


class Scheduler:
    """``schedule(step)`` plans a step; ``complete(new_tokens)`` applies it and returns what the
    step did as :class:`StepCounts` (``totals`` sums them over the run)."""

    def __init__(self, config: EngineConfig, allocator: Allocator, events: list[Event], eos_token_id: int | None,
                 max_model_len: int):
        self.config = config
        self.allocator = allocator
        self.events = events  # the engine's chronological list for the step (the allocator appends too)
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.budget_per_step = config.max_batch_tokens
        self.watermark_blocks = config.watermark_blocks if allocator.supports_swap else 0
        self.swap_enabled = config.preemption == "swap" and allocator.supports_swap
        self.waiting: list[Sequence] = []  # sorted by order
        self.running: list[Sequence] = []  # in admission order: the last is the most recently admitted
        self.swapped: list[Sequence] = []  # sorted by order
        self.totals = StepCounts()
        self._step = StepCounts()
        self._seq_ids = itertools.count()
        self.seqs: dict[int, Sequence] = {}  # every sequence ever made, by id
        self.touched: set[Request] = set()  # requests that changed this step
        self.sampled: set[int] = set()  # seq ids that got a token this step
        self._work: list[tuple[Sequence, int, int, int]] = []  # (seq, start, count, num_samples)

    # ------------------------------------------------------------------ queues
    def new_sequence(self, request: Request, sample_index: int, token_ids: list[int], fork_into: int = 1) -> Sequence:
        seq = Sequence(next(self._seq_ids), request, sample_index, token_ids, fork_into)
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

    def next_reservation(self) -> int:
        """Slots the head of the waiting queue would reserve (contiguous; 0 when none waits)."""
        if not self.waiting:
            return 0
        return self.allocator.admission_slots(self.waiting[0])

    # ------------------------------------------------------------------ one step
    def schedule(self, step: int) -> ScheduledBatch:
        alloc = self.allocator
        budget = self.budget_per_step if self.budget_per_step is not None else 1 << 62
        work: list[tuple[Sequence, int]] = []
        batch = ScheduledBatch(step=step, block_size=alloc.block_size)
        counts = self._step = StepCounts()

        # 1. Running sequences: room for this step's tokens, preempting the youngest.
        running = self.running
        blocks_needed = alloc.blocks_needed
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            count = len(seq.token_ids) - seq.num_computed
            if count > budget:
                count = budget
            need = blocks_needed(seq, count)
            if need:
                gone = False
                while need > alloc.num_free_blocks:
                    if len(running) == 1:
                        # Alone and still no room: the sequence has outgrown the whole pool.
                        running.pop()
                        self._finish(seq, FINISH_LENGTH, "kv pool exhausted")
                        gone = True
                        break
                    victim = running.pop()
                    self._preempt(victim, batch)
                    if victim is seq:
                        gone = True
                        break
                    need = blocks_needed(seq, count)
                if gone:
                    continue
                if need:
                    batch.copies.extend(alloc.append_slots(seq, count))
            work.append((seq, count))
            budget -= count
            i += 1

        # 2. Swapped sequences resume first.
        if counts.preemptions == 0:
            while self.swapped and budget > 0:
                seq = self.swapped[0]
                if alloc.exceeds_pool(seq):
                    self.swapped.pop(0)
                    self._finish(seq, FINISH_LENGTH, "kv pool exhausted")
                    continue
                reserve = self.watermark_blocks if self.running else 0
                if not alloc.can_swap_in(seq, reserve):
                    break
                self.swapped.pop(0)
                pairs = alloc.swap_in(seq)
                batch.swap_in.extend(pairs)
                counts.swaps_in += 1
                seq.status = SequenceStatus.RUNNING
                running.append(seq)
                self.events.append(
                    Event(
                        SWAP_IN,
                        seq.seq_id,
                        seq.request.request_id,
                        {"host_blocks": [h for h, _ in pairs], "blocks": alloc.block_table(seq)},
                    )
                )
                count = min(seq.num_tokens - seq.num_computed, budget)
                work.append((seq, count))
                budget -= count

        # 3. Waiting sequences, FCFS, while the pool (minus the watermark) allows.
        if counts.preemptions == 0 and not self.swapped:
            while self.waiting and budget > 0:
                seq = self.waiting[0]
                if alloc.exceeds_pool(seq):
                    self.waiting.pop(0)
                    self._finish(seq, FINISH_LENGTH, "kv pool exhausted")
                    continue
                reserve = self.watermark_blocks if self.running else 0
                recompute = seq.status == SequenceStatus.PREEMPTED
                cached = alloc.try_admit(seq, reserve)
                if cached is None:
                    break
                self.waiting.pop(0)
                seq.status = SequenceStatus.RUNNING
                running.append(seq)
                self.events.append(
                    Event(ADMIT, seq.seq_id, seq.request.request_id, {"cached_tokens": cached, "recompute": recompute})
                )
                count = min(seq.num_tokens - seq.num_computed, budget)
                work.append((seq, count))
                budget -= count

        # 4. The batch.
        planned = []
        prefill = decode = 0
        seqs = batch.seqs
        slots_for, block_table = alloc.slots_for, alloc.table_view
        for seq, count in work:
            start = seq.num_computed
            end = start + count
            tokens = seq.token_ids
            num_tokens = len(tokens)
            num_samples = seq.fork_into if end == num_tokens else 0
            request = seq.request
            num_out = num_tokens - seq.num_prompt_tokens
            seqs.append(
                SeqWork(
                    seq.seq_id,
                    request.request_id,
                    seq.sample_index,
                    tokens[start:end],
                    start,
                    slots_for(seq, start, count),
                    block_table(seq, end),
                    num_samples,
                    request.sampling,
                    num_out,
                    request.output_len,
                )
            )
            planned.append((seq, start, count, num_samples))
            if count == 1 and num_out > 0 and end == num_tokens:
                decode += 1
            else:
                prefill += count
        self._work = planned
        counts.prefill_tokens = prefill
        counts.decode_tokens = decode
        counts.tokens = prefill + decode
        return batch

    def complete(self, new_tokens: dict[int, list[int]]) -> StepCounts:
        """Apply a step's results (requests that changed go to ``touched``); returns the step's counts."""
        alloc = self.allocator
        finished: list[Sequence] = []
        generated = 0
        for seq, start, count, num_samples in self._work:
            alloc.mark_written(seq, start, count)
            seq.num_computed = start + count
            if num_samples == 0:
                continue
            tokens = new_tokens.get(seq.seq_id)
            if tokens is None or len(tokens) != num_samples:
                raise RuntimeError(
                    f"token source returned {tokens!r} for sequence {seq.seq_id}; expected {num_samples} token(s)"
                )
            self.touched.add(seq.request)
            samples = [seq]
            if num_samples > 1:
                seq.fork_into = 1
                for i in range(1, num_samples):
                    child = self.new_sequence(seq.request, i, list(seq.token_ids))
                    child.status = SequenceStatus.RUNNING
                    alloc.fork(seq, child)
                    self.running.append(child)  # admitted with its parent, after it
                    samples.append(child)
            for sample, token in zip(samples, tokens):
                sample.token_ids.append(int(token))
                self.sampled.add(sample.seq_id)
                generated += 1
                reason = self._stop_reason(sample, int(token))
                if reason is not None:
                    finished.append(sample)
                    sample.finish_reason = reason
        for seq in finished:
            self.running.remove(seq)
            self._finish(seq, seq.finish_reason, None)
        self._work = []
        counts = self._step
        counts.num_running = len(self.running)  # after the step: its finished are gone, its forks counted
        counts.tokens_generated = generated
        self.totals.add(counts)
        return counts

    # ------------------------------------------------------------------ helpers
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

    def _finish(self, seq: Sequence, reason: str, why: str | None) -> None:
        self.touched.add(seq.request)
        self.allocator.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        detail = {"reason": reason, "output_tokens": seq.num_output_tokens}
        if why:
            detail["why"] = why
        self.events.append(Event(FINISH, seq.seq_id, seq.request.request_id, detail))

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self._step.preemptions += 1
        rid = seq.request.request_id
        reason = "preemption mode is recompute"
        if self.swap_enabled:
            device_blocks = self.allocator.block_table(seq)
            pairs = self.allocator.swap_out(seq)
            if pairs is not None:
                batch.swap_out.extend(pairs)
                self._step.swaps_out += 1
                seq.status = SequenceStatus.SWAPPED
                bisect.insort(self.swapped, seq, key=_ORDER)
                self.events.append(
                    Event(
                        PREEMPT_SWAP,
                        seq.seq_id,
                        rid,
                        {"blocks": device_blocks, "host_blocks": [h for _, h in pairs]},
                    )
                )
                return
            reason = "host pool full"
        blocks = self.allocator.block_table(seq)
        self.allocator.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.PREEMPTED
        self._step.recomputes += 1
        bisect.insort(self.waiting, seq, key=_ORDER)
        self.events.append(Event(PREEMPT_RECOMPUTE, seq.seq_id, rid, {"reason": reason, "blocks": blocks}))
