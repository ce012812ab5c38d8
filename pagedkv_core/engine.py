"""The engine: requests in, one scheduled step at a time, outputs and snapshots out.

``Engine(config, source)`` works the same with the real model or the scripted source::

    engine = Engine(EngineConfig(), ScriptedSource())
    engine.add_request("r0", prompt_ids, SamplingParams(max_tokens=64), output_len=20)
    while engine.has_unfinished():
        outputs, snapshot = engine.step()

Invalid or never-fitting requests are not exceptions: they end as rejected, with a reason
in their output and a ``reject`` event in the snapshot of the step they arrived in.
"""
from __future__ import annotations

import heapq
import operator
import time

from .batch import ScheduledBatch, TokenSource
from .block_manager import BlockManager
from .config import EngineConfig
from .contiguous import ContiguousAllocator
from .events import REJECT, Event
from .metrics import RunStats, RunSummary, StepMetrics
from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import FINISH_REJECTED, Request, Sequence, SequenceStatus
from .snapshot import StepSnapshot, take_snapshot


class Engine:
    def __init__(self, config: EngineConfig, source: TokenSource):
        self.config = config
        self.source = source
        self.max_model_len = min(config.max_model_len, int(getattr(source, "max_model_len", config.max_model_len)))
        if config.paged:
            self.allocator = BlockManager(config)
        else:
            self.allocator = ContiguousAllocator(config)
            self.allocator.max_model_len = self.max_model_len
        self.scheduler = Scheduler(config, self.allocator, getattr(source, "eos_token_id", None), self.max_model_len)
        self.allocator.events = self.scheduler.events  # one chronological list per step
        self.requests: dict[str, Request] = {}
        self._pending: list[tuple[int, int, Request]] = []  # heap of (arrival_step, index, request)
        self.step_index = 0
        self.stats = RunStats()
        self.num_finished = 0
        self.num_rejected = 0
        self._rejected: list[dict] = []
        source.bind(self.allocator.num_slots, self.allocator.num_host_slots)

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams | None = None,
        arrival_step: int | None = None,
        output_len: int | None = None,
        *,
        extra_keys: tuple = (),
    ) -> None:
        """Queue a request; it becomes visible at ``arrival_step`` (default: the next step).
        ``output_len`` (scripted sources): the answer's intended length. ``extra_keys`` are
        mixed into its prefix-cache hashes (e.g. an adapter id). Raises ValueError only for
        a duplicate ``request_id``."""
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        sampling = sampling if sampling is not None else SamplingParams()
        arrival = self.step_index if arrival_step is None else max(int(arrival_step), 0)
        request = Request(
            request_id,
            len(self.requests),
            list(prompt_token_ids),
            sampling,
            arrival,
            output_len,
            tuple(extra_keys),
        )
        self.requests[request_id] = request
        heapq.heappush(self._pending, (arrival, request.index, request))

    def get_request(self, request_id: str) -> Request:
        return self.requests[request_id]

    def sequence(self, seq_id: int) -> Sequence:
        return self.scheduler.seqs[seq_id]

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.scheduler.has_work()

    def _invalid_reason(self, request: Request) -> str | None:
        prompt = request.prompt_token_ids
        if not prompt:
            return "empty prompt"
        try:
            if any(isinstance(t, bool) for t in prompt):
                raise TypeError
            prompt = [operator.index(t) for t in prompt]  # numpy ints are fine, floats are not
        except TypeError:
            return "prompt token ids must be non-negative integers"
        if min(prompt) < 0:
            return "prompt token ids must be non-negative integers"
        request.prompt_token_ids = prompt
        if request.output_len is not None and (
            isinstance(request.output_len, bool) or not isinstance(request.output_len, int) or request.output_len < 1
        ):
            return f"output_len must be an integer >= 1, got {request.output_len!r}"
        if len(prompt) >= self.max_model_len:
            return f"prompt of {len(prompt)} tokens leaves no room for output under max_model_len={self.max_model_len}"
        return self.allocator.rejection_reason(len(prompt), request.sampling.max_tokens)

    def _arrive(self, request: Request) -> None:
        request.arrived = True
        reason = self._invalid_reason(request)
        if reason is not None:
            request.reject_reason = reason
            self.num_rejected += 1
            self._rejected.append({"id": request.request_id, "reason": reason})
            self.scheduler.events.append(Event(REJECT, -1, request.request_id, {"reason": reason}))
            self.scheduler.touched.add(request)
            return
        n = request.sampling.n
        if n > 1 and not self.allocator.supports_fork:
            for i in range(n):  # contiguous: every sample is its own sequence from the start
                self.scheduler.add(self.scheduler.new_sequence(request, i, list(request.prompt_token_ids)))
        else:
            self.scheduler.add(self.scheduler.new_sequence(request, 0, list(request.prompt_token_ids), fork_into=n))

    # ------------------------------------------------------------------ stepping
    def step(self) -> tuple[list[RequestOutput], StepSnapshot]:
        step = self.step_index
        sched = self.scheduler
        sched.touched.clear()
        sched.sampled.clear()
        while self._pending and self._pending[0][0] <= step:
            self._arrive(heapq.heappop(self._pending)[2])
        batch = sched.schedule(step)
        execute_s = 0.0
        results: dict[int, list[int]] = {}
        if batch.seqs or batch.swap_out or batch.swap_in or batch.copies:
            t0 = time.perf_counter()
            results = self.source.execute(batch)
            execute_s = time.perf_counter() - t0
        sched.complete(results)
        if not batch.seqs and not sched.touched and sched.has_work() and not self._pending:
            raise RuntimeError(f"engine made no progress at step {step}: {sched.waiting[:3]} {sched.swapped[:3]}")
        outputs = self._outputs()
        if not self.allocator.supports_preemption:
            self.allocator.update_fragmentation(sched.next_reservation())
        metrics = self._metrics(batch, execute_s)
        self.stats.add(metrics)
        events = tuple(sched.events)
        sched.events.clear()
        snapshot = take_snapshot(step, self.allocator, sched, events, metrics)
        self.step_index += 1
        return outputs, snapshot

    def run(self, max_steps: int | None = None, on_step=None) -> RunSummary:
        """Step until every request is finished or rejected (or ``max_steps`` steps);
        ``on_step(outputs, snapshot)`` sees each step."""
        steps = 0
        while self.has_unfinished() and (max_steps is None or steps < max_steps):
            outputs, snapshot = self.step()
            steps += 1
            if on_step is not None:
                on_step(outputs, snapshot)
        return self.summary()

    # ------------------------------------------------------------------ reporting
    def _outputs(self) -> list[RequestOutput]:
        sampled = self.scheduler.sampled
        outputs = []
        for request in sorted(self.scheduler.touched, key=lambda r: r.index):
            if request.reject_reason is not None:
                outs = [CompletionOutput(i, [], [], FINISH_REJECTED) for i in range(request.n)]
                outputs.append(
                    RequestOutput(request.request_id, request.prompt_token_ids, outs, True, FINISH_REJECTED, request.reject_reason)
                )
                continue
            outs = []
            for s in request.seqs:
                tokens = s.token_ids
                new = [tokens[-1]] if s.seq_id in sampled else []
                outs.append(CompletionOutput(s.sample_index, tokens[s.num_prompt_tokens :], new, s.finish_reason))
            finished = request.finished
            if finished:
                self.num_finished += 1
            outputs.append(
                RequestOutput(
                    request.request_id,
                    request.prompt_token_ids,
                    outs,
                    finished,
                    request.finish_reason if finished else None,
                )
            )
        return outputs

    def _metrics(self, batch: ScheduledBatch, execute_s: float) -> StepMetrics:
        alloc, sched, c = self.allocator, self.scheduler, self.scheduler.counters
        allocated = alloc.allocated_slots
        filled = alloc.filled_slots
        queried = alloc.queried_tokens
        return StepMetrics(
            kv_usage=alloc.kv_usage,
            token_utilization=filled / allocated if allocated else 0.0,
            allocated_slots=allocated,
            filled_slots=filled,
            num_running=sched.step_num_running,
            num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped),
            num_preemptions=c.preemptions,
            step_preemptions=sched.step_preemptions,
            num_swaps_out=c.swaps_out,
            num_swaps_in=c.swaps_in,
            num_recomputes=c.recomputes,
            prefix_cache_hit_rate=alloc.hit_tokens / queried if queried else 0.0,
            prefix_hit_tokens=alloc.hit_tokens,
            prefix_queried_tokens=queried,
            step_tokens=batch.num_tokens,
            step_prefill_tokens=sched.step_prefill_tokens,
            step_decode_tokens=sched.step_decode_tokens,
            step_tokens_generated=sched.step_tokens_generated,
            tokens_generated=c.tokens_generated,
            host_used_blocks=alloc.host.num_used_blocks if alloc.supports_preemption else 0,
            fragmented_slots=getattr(alloc, "fragmented_slots", 0),
            largest_free_run=getattr(alloc, "largest_free_run", 0),
            num_finished=self.num_finished,
            num_rejected=self.num_rejected,
            execute_s=execute_s,
        )

    def summary(self) -> RunSummary:
        s, c, cfg = self.stats, self.scheduler.counters, self.config
        queried = self.allocator.queried_tokens
        return RunSummary(
            allocator=cfg.allocator,
            block_size=cfg.block_size,
            pool_slots=cfg.pool_slots,
            preemption=cfg.preemption,
            watermark=cfg.watermark,
            prefix_caching=cfg.prefix_caching,
            steps=s.steps,
            requests=len(self.requests),
            finished=self.num_finished,
            rejected=list(self._rejected),
            preemptions=c.preemptions,
            swaps_out=c.swaps_out,
            swaps_in=c.swaps_in,
            recomputes=c.recomputes,
            peak_running=s.peak_running,
            mean_running=s.mean_running,
            mean_kv_usage=s.mean_kv_usage,
            mean_token_utilization=s.mean_token_utilization,
            prefix_cache_hit_rate=self.allocator.hit_tokens / queried if queried else 0.0,
            tokens_generated=c.tokens_generated,
            mean_execute_s=s.sum_execute_s / s.steps if s.steps else 0.0,
        )

    def trace_header(self) -> dict:
        """Config and request list for :func:`pagedkv_core.trace.write_trace`."""
        return {
            "config": self.config.to_dict(),
            "requests": [
                {
                    "id": r.request_id,
                    "index": r.index,
                    "prompt": list(r.prompt_token_ids),
                    "output_len": r.output_len,
                    "max_tokens": r.sampling.max_tokens,
                    "n": r.sampling.n,
                    "arrival_step": r.arrival_step,
                }
                for r in self.requests.values()
            ],
        }

    def check_invariants(self) -> None:
        """Assert the allocator's bookkeeping (tests call this after every step)."""
        sched = self.scheduler
        live = sched.live
        for seq in live:
            assert not seq.is_finished, f"{seq} is finished but still queued"
        for seq in sched.running:
            assert seq.status == SequenceStatus.RUNNING
        for seq in sched.swapped:
            assert seq.status == SequenceStatus.SWAPPED
        self.allocator.check_invariants(live)
