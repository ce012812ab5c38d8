"""The engine: requests in, one scheduled step at a time, outputs and snapshots out.

``Engine(config, source)`` works the same with the real model or the scripted source::

    engine = Engine(EngineConfig(), ScriptedSource())
    engine.add_request("r0", prompt_ids, SamplingParams(max_tokens=64), output_len=20)
    while engine.has_unfinished():
        outputs, snapshot = engine.step()

Invalid or never-fitting requests are not exceptions: they end as rejected, with a reason
in their output and a ``reject`` event in the snapshot of the step they arrived in.

With a :class:`~pagedkv_core.record.recording.Recording` (``Engine(config, source, recording=rec)``)
every step is stored in it as a delta of what changed; ``step(snapshot=False)`` then skips the
full copy and lists no block tables (the recording gets the tables that changed, whole), so a
step's cost follows what it changed, not the pool's size nor every table's length.

The engine owns the pool view (:attr:`Engine.view`, a
:class:`~pagedkv_core.record.pool_view.PoolView`): the allocator logs what it changes, and the
view folds that log after every step into the arrays snapshots and recordings read. With
``Engine(..., snapshots=False)`` and no recording there is no view and nothing is logged.

Long request logs are fed rather than added (:meth:`Engine.feed`): the engine pulls each request
from an iterator shortly before it arrives and forgets it once its last output is returned, so
memory follows the requests alive, not the log. With ``Engine(..., skip_idle=True)`` an idle
stretch (nothing waiting, running or swapped, the next arrival steps ahead) passes in one
``step()`` call: its metrics say how many steps it skipped (``idle_skipped``), a recording still
holds every step (each a copy of the first, which changed nothing; handed over in one
``append_idle`` call), and arrival steps keep their meaning.

With ``Engine(..., coalesce=True)`` (no snapshots, a source that answers decode runs: the
scripted one) a *decode run* passes in one ``step()`` call that reads no outputs: when,
after a step, nothing waits or is swapped out, no request arrives for a while, and every running
sequence has its next tokens' slots in a block it holds alone and is far from any length that
may end it, the next steps can do nothing but one plain decode each. They are taken at once
(:meth:`Scheduler.run_decodes`: the tokens in one call of the source, their slots in one
``write_decodes`` call of the allocator) and counted as the steps they are: the run's statistics and summary are those of the same
steps one by one, to the bit, but for the token source's time (``mean_execute_s``).
:attr:`Engine.decode_run` says what the last call took so (:class:`DecodeRun`), for a reader of
its steps (the waste split). A recording gets the run in one call
(``record_decode_run``: what it wrote, :class:`~pagedkv_core.record.decode_run.DecodeWrites`),
and a trace keeps it as one frame.
"""
from __future__ import annotations

import dataclasses
import heapq
import operator
import time
from typing import NamedTuple

import numpy as np

from .kv.changes import ChangeLog
from .kv.registry import build_allocator
from .batch import TokenSource
from .config import MAX_ARRIVAL_STEP, EngineConfig
from .events import REJECT, Event
from .kv.eviction import plan_eviction
from .metrics import RunStats, RunSummary, StepCounts, StepMetrics
from .outputs import CompletionOutput, RequestOutput, TokenIds
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import FINISH_REJECTED, Request, Sequence, SequenceStatus
from .record.decode_run import DecodeWrites
from .record.pool_view import PoolView
from .record.recording import MAX_IDLE_RUN
from .record.snapshot import StepSnapshot, seq_arrays, take_snapshot


@dataclasses.dataclass(frozen=True)
class StartedStep:
    """A step between :meth:`Engine.start_step` and :meth:`Engine.finish_step`: its index, the
    scheduler's plan, and whether a snapshot was asked for."""

    step: int
    plan: object  # the scheduler's plan: its batch, events and what complete() needs
    snapshot: bool

    @property
    def batch(self):
        return self.plan.batch

    @property
    def executes(self) -> bool:
        """Whether the source has work in this step: sequences, swaps or copies."""
        b = self.plan.batch
        return bool(b.num_seqs or b.swap_out or b.swap_in or b.copies)


class DecodeRun(NamedTuple):
    """The steps a :meth:`Engine.step` call took after its own (``Engine(coalesce=True)``): ``steps``
    of them from ``first_step``, in each of which every one of the ``num_seqs`` running sequences
    (the same ones, in the same order) decoded one token plainly and nothing else happened."""

    first_step: int
    steps: int
    num_seqs: int


NO_LIMIT = 1 << 62  # a decode run's length when no arrival bounds it (each sequence's own length does)

_INDEX = operator.attrgetter("index")  # requests in submission order
_REQUEST, _SEQ_ID = operator.attrgetter("request"), operator.attrgetter("seq_id")
_FINISHED = int(SequenceStatus.FINISHED)


def _completion(seq: Sequence, sampled: set[int]) -> CompletionOutput:
    """One sample's output as it stands after the step (``sampled``: seq ids that got a token in it)."""
    ids = seq.token_ids
    return CompletionOutput(seq.sample_index, TokenIds(ids, seq.num_prompt_tokens, len(ids)),
                            [ids[-1]] if seq.seq_id in sampled else [], seq.finish_reason)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. "\ud800" from a JSON file
        return False
    return True


def kept_request_id(request_id) -> str:
    """The id a request is kept and reported under (:meth:`Engine.add_request`): ``request_id`` as
    a string, with what is not valid UTF-8 (a lone surrogate from a JSON file) backslash-escaped,
    so that every output can print it."""
    text = str(request_id)
    return text if _is_utf8(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


class Engine:
    def __init__(self, config: EngineConfig, source: TokenSource, recording=None, kv_event_sink=None, *,
                 snapshots: bool = True, skip_idle: bool = False, coalesce: bool = False):
        """``kv_event_sink`` (paged allocators): told of prefix-cache blocks stored, evicted and
        cleared, and ``flush()``-ed at the end of every step (see pagedkv_core.observe.publisher).
        ``snapshots=False``: :meth:`step` is only ever called with ``snapshot=False``; without a
        recording either, the engine keeps no pool view and the allocator logs nothing.
        ``skip_idle``: an idle stretch passes in one :meth:`step` call; ``coalesce``: so does a
        decode run (both: see the module docstring)."""
        self.config = config
        self.source = source
        self.max_model_len = min(config.max_model_len, int(source.max_model_len))
        self._arrivals: list[Event] = []  # this step's rejections, before the scheduler's events
        self.kv_event_sink = kv_event_sink
        viewed = snapshots or recording is not None
        if coalesce and snapshots:
            raise ValueError("coalesce=True needs snapshots=False: a snapshot is taken of every step")
        if coalesce and not getattr(source, "answers_runs", False):
            raise ValueError("coalesce=True needs a token source that answers decode runs (the scripted source)")
        self.coalesce = coalesce
        self.decode_run: DecodeRun | None = None  # what the last step() call took after its step
        self.coalesced_steps = 0  # steps taken so, over the run
        self._changes = ChangeLog() if viewed else None
        self.allocator = build_allocator(config, self.max_model_len, self._changes, kv_event_sink=kv_event_sink)
        self.view = PoolView.of(self.allocator) if viewed else None  # the arrays snapshots and recordings read
        self.scheduler = Scheduler(config, self.allocator, source.eos_token_id, self.max_model_len,
                                   lane_source=bool(getattr(source, "reads_lane", False)),
                                   slot_source=bool(getattr(source, "reads_slots", True)))
        self.vocab_size = int(source.vocab_size)  # prompt ids at or past it are rejected
        self.recording = recording
        if recording is not None:
            recording.start(self.view.scalars(), self.view.arrays)
        elif self.view is not None:
            self.view.tracking = False  # snapshots copy the whole view: nobody reads what a fold touched
        self.requests: dict[str, Request] = {}
        self._pending: list[tuple[int, int, Request]] = []  # heap of (arrival_step, index, request)
        self._feed = None  # requests still to come, pulled as they arrive (feed())
        self._feed_next = None  # the next of them, pulled ahead to read its arrival step
        self._release_finished = False  # feed(): forget a request once its last output is returned
        self._on_release = None  # feed(on_release=...): told of each sequence it forgets
        self.num_requests = 0  # added so far (released ones included)
        self.skip_idle = skip_idle
        self.step_index = 0
        self.stats = RunStats()
        self.num_finished = 0
        self.num_rejected = 0
        self._rejected: list[dict] = []
        self._doomed: dict[str, str] = {}  # request id -> why it will be rejected on arrival
        self.last_seqs: dict | None = None  # the last step's seq_arrays (the live sequences after it, before any decode run; tables with a snapshot only)
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
    ) -> str:
        """Queue a request; it becomes visible at ``arrival_step`` (default: the next step).
        ``output_len`` (scripted sources): the answer's intended length. ``extra_keys`` are
        mixed into its prefix-cache hashes (e.g. an adapter id). Returns the id it is kept
        under (an id that is not valid UTF-8 is escaped, and the request rejected). Raises
        ValueError only for a duplicate ``request_id``."""
        text = str(request_id)
        request_id = kept_request_id(text)  # the request and its rejection under a printable id
        bad_id = request_id != text
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        sampling = sampling if sampling is not None else SamplingParams()
        arrival = self.step_index if arrival_step is None else max(int(arrival_step), 0)
        reject = "request id is not valid UTF-8" if bad_id else None
        if arrival > self.step_index + MAX_ARRIVAL_STEP:
            reject = f"arrival_step {arrival:,} is past the horizon of {MAX_ARRIVAL_STEP:,} steps"
            arrival = self.step_index
        request = Request(
            request_id,
            self.num_requests,
            list(prompt_token_ids),
            sampling,
            arrival,
            output_len,
            tuple(extra_keys),
        )
        if reject is not None:
            self._doomed[request_id] = reject  # rejected, with this reason, when it arrives
        self.requests[request_id] = request
        self.num_requests += 1
        heapq.heappush(self._pending, (arrival, request.index, request))
        return request_id

    def add_rejected(self, request_id: str, reason: str, arrival_step: int | None = None) -> None:
        """Queue a request that is already known to be unrunnable (a workload entry with a bad
        field): it ends as rejected with ``reason`` when it arrives, while the others run."""
        rid = self.add_request(request_id, [], arrival_step=arrival_step)
        self._doomed.setdefault(rid, str(reason))

    def feed(self, requests, on_release=None) -> None:
        """Requests that come later, pulled lazily: ``requests`` is an iterable, in
        non-decreasing ``arrival_step`` order, of objects with an ``arrival_step`` and a
        ``submit(engine)`` that adds them (:meth:`add_request` or :meth:`add_rejected`). Each is
        submitted in the step it arrives. From then on a request is forgotten once its last
        output is returned (``requests`` and :meth:`get_request` hold only the live ones), so a
        log of any length runs in the memory of the requests alive. ``on_release(seq)``, if given,
        is called with each sequence of a request as it is forgotten (what it wrote is final; read
        what you need there: after the call the sequence's ``request`` is None).
        Belady eviction needs every request up front, and is refused here (ValueError)."""
        if self.config.eviction == "belady":
            raise ValueError("Belady eviction needs every request up front: add them with add_request, not feed")
        if self._feed is not None:
            raise ValueError("the engine already has a request feed")
        self._feed = iter(requests)
        self._feed_next = next(self._feed, None)
        self._release_finished = True
        self._on_release = on_release

    def _pull_feed(self, step: int) -> None:
        while self._feed_next is not None and self._feed_next.arrival_step <= step:
            item = self._feed_next
            self._feed_next = next(self._feed, None)
            if self._feed_next is not None and self._feed_next.arrival_step < item.arrival_step:
                raise ValueError(f"the request feed is out of arrival order: step {self._feed_next.arrival_step} "
                                 f"after step {item.arrival_step}")
            item.submit(self)

    def _next_arrival(self) -> int | None:
        steps = [self._pending[0][0]] if self._pending else []
        if self._feed_next is not None:
            steps.append(self._feed_next.arrival_step)
        return min(steps, default=None)

    def get_request(self, request_id: str) -> Request:
        return self.requests[request_id]

    def sequence(self, seq_id: int) -> Sequence:
        return self.scheduler.seqs[seq_id]

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self._feed_next is not None or self.scheduler.has_work()

    def _invalid_reason(self, request: Request) -> str | None:
        if request.request_id in self._doomed:
            return self._doomed.pop(request.request_id)
        prompt = request.prompt_token_ids
        if not prompt:
            return "empty prompt"
        if set(map(type, prompt)) != {int}:  # plain ints (the usual case) need no conversion
            try:
                if any(isinstance(t, bool) for t in prompt):
                    raise TypeError
                prompt = [operator.index(t) for t in prompt]  # numpy ints are fine, floats are not
            except TypeError:
                return "prompt token ids must be non-negative integers"
        if min(prompt) < 0:
            return "prompt token ids must be non-negative integers"
        top = max(prompt)
        if top >= self.vocab_size:
            return f"prompt token id {top:,} is outside the vocabulary (ids 0 to {self.vocab_size - 1:,})"
        request.prompt_token_ids = prompt
        if request.output_len is not None and (
            isinstance(request.output_len, bool) or not isinstance(request.output_len, int) or request.output_len < 1
        ):
            return f"output_len must be an integer >= 1, got {request.output_len!r}"
        if len(prompt) >= self.max_model_len:
            return f"prompt of {len(prompt)} tokens leaves no room for output under max_model_len={self.max_model_len}"
        return self.allocator.rejection_reason(len(prompt), request.sampling.max_tokens, request.output_len)

    def _arrive(self, request: Request) -> None:
        request.arrived = True
        reason = self._invalid_reason(request)
        if reason is not None:
            request.reject_reason = reason
            self.num_rejected += 1
            self._rejected.append({"id": request.request_id, "reason": reason})
            self._arrivals.append(Event(REJECT, -1, request.request_id, {"reason": reason}))
            self.scheduler.touched.add(request)
            self.scheduler.ended.add(request)
            return
        n = request.sampling.n
        if n > 1 and not self.allocator.capabilities.fork:
            for i in range(n):  # contiguous: every sample is its own sequence from the start
                self.scheduler.add(self.scheduler.new_sequence(request, i, list(request.prompt_token_ids)))
        else:
            self.scheduler.add(self.scheduler.new_sequence(request, 0, list(request.prompt_token_ids), fork_into=n))

    # ------------------------------------------------------------------ stepping
    def step(self, snapshot: bool = True, outputs: bool = True) -> tuple[list[RequestOutput], StepSnapshot | None]:
        """One scheduled step. Returns its outputs and, unless ``snapshot=False``, a full
        :class:`StepSnapshot` (with a recording attached, the step is recorded either way).
        ``outputs=False``: a caller that reads no outputs (a replay) gets ``[]``; the step is the
        same (finished requests are counted, and forgotten under :meth:`feed`)."""
        started = self.start_step(snapshot)
        results: dict[int, list[int]] = {}
        execute_s = 0.0
        if started.executes:
            t0 = time.perf_counter()
            results = self.source.execute(started.batch)
            execute_s = time.perf_counter() - t0
        return self.finish_step(started, results, execute_s, outputs)

    def start_step(self, snapshot: bool = True) -> "StartedStep":
        """The first half of :meth:`step`: arrivals and the schedule. Its batch
        (``StartedStep.batch``, when ``executes``) goes to the source; :meth:`finish_step` takes
        the source's answer. For a caller that runs several engines' batches at once
        (:meth:`pagedkv_core.sources.model.runner.ModelRunner.execute_together`); :meth:`step` is
        the two halves with this engine's source between them."""
        if snapshot and self.view is None:
            raise ValueError("this engine keeps no pool view (snapshots=False, no recording): call step(snapshot=False)")
        step = self.step_index
        sched = self.scheduler
        sched.new_step()
        if step == 0 and self.config.eviction == "belady":
            plan_eviction(self.allocator, self.requests.values())  # the future: every request held now
        if self._feed_next is not None:
            self._pull_feed(step)
        while self._pending and self._pending[0][0] <= step:
            self._arrive(heapq.heappop(self._pending)[2])
        return StartedStep(step, sched.schedule(step), snapshot)

    def finish_step(self, started: "StartedStep", results: dict[int, list[int]], execute_s: float = 0.0,
                    outputs: bool = True) -> tuple[list[RequestOutput], StepSnapshot | None]:
        """The second half of :meth:`step`: the source's ``results`` for the started step's batch
        (seq id -> new tokens; ``{}`` when it ``executes`` nothing), ``execute_s`` the seconds
        they took. Returns what :meth:`step` returns."""
        step, plan, snapshot = started.step, started.plan, started.snapshot
        wants_outputs = outputs
        if step != self.step_index:
            raise RuntimeError(f"finish_step for step {step}, but the engine is at step {self.step_index}")
        sched = self.scheduler
        batch = plan.batch
        counts, after = sched.complete(plan, results)
        if not batch.num_seqs and not sched.touched and sched.has_work() and not self._pending:
            raise RuntimeError(f"engine made no progress at step {step}: {sched.waiting[:3]} {sched.swapped[:3]}")
        outputs = self._outputs(outputs)
        alloc = self.allocator
        head_need = alloc.admission_slots(sched.waiting[0]) if alloc.capabilities.fragmentation and sched.waiting else 0
        if alloc.capabilities.fragmentation:
            alloc.update_fragmentation(head_need)
        seqs = self.last_seqs = seq_arrays(alloc, sched, tables=snapshot)  # a recording gets the changed tables alone
        events = (*self._arrivals, *plan.events, *after)
        skipped = self._idle_ahead(step, batch, events)
        metrics = self._metrics(counts, execute_s, seqs["seq_num_blocks"], head_need, skipped)
        self.stats.add(metrics)
        self._arrivals.clear()
        snap = None
        if self.view is not None:
            self.view.fold(self._changes.take())
            if self.recording is not None:
                self._record(step, seqs, events, metrics)
            else:
                self.view.forget_changes()
            if snapshot:
                snap = take_snapshot(step, self.view, seqs, events, metrics)
        if skipped:
            self._skip_idle(skipped, metrics)
        run = self.decode_run = None if skipped or not self.coalesce or wants_outputs else self._run_decodes(step, metrics)
        if self.kv_event_sink is not None:
            self.kv_event_sink.flush()
        self.step_index += 1 + skipped + (run.steps if run is not None else 0)
        return outputs, snap

    def _run_decodes(self, step: int, metrics: StepMetrics) -> DecodeRun | None:
        """With ``coalesce``: the decode run after ``step`` (whose metrics are ``metrics``), taken
        and counted; None where the next step may do anything else."""
        sched = self.scheduler
        nxt = self._next_arrival()
        steps = sched.quiet_ahead(NO_LIMIT if nxt is None else nxt - step - 1)
        if steps <= 0:
            return None
        running = sched.running
        tokens = self.source.decode_run(running, steps)
        if len(sched.stop_tokens):  # a token that may stop its sequence: the run ends before its step
            hit = sched.stop_hits(tokens).any(axis=0)
            if hit.any():
                steps = int(hit.argmax())
                if steps == 0:
                    return None
                tokens = tokens[:, :steps]
        first_slots, written = sched.run_decodes(tokens)
        if self.view is not None:  # the view moves on by the whole run; a recording gets it as one
            self.view.fold(self._changes.take())
            self.view.forget_changes()
            if self.recording is not None:
                ids = np.fromiter(map(_SEQ_ID, running), dtype=np.int32, count=len(running))
                self.recording.record_decode_run(step + 1, DecodeWrites(ids, first_slots, written))
        n = len(running)
        for j in range(1, steps + 1):  # each step's metrics, as the step alone would have them
            self.stats.add(metrics.after_decodes(j, n))
        self.coalesced_steps += steps
        return DecodeRun(step + 1, steps, n)

    def _idle_ahead(self, step: int, batch, events) -> int:
        """With ``skip_idle``: the steps after an idle ``step`` (it did nothing and nothing is
        left to do) until the next arrival; 0 otherwise."""
        if not self.skip_idle or batch.num_seqs or events or self.scheduler.touched or self.scheduler.has_work():
            return 0
        if batch.swap_out or batch.swap_in or batch.copies:
            return 0
        nxt = self._next_arrival()
        return 0 if nxt is None or nxt <= step + 1 else nxt - step - 1

    def _skip_idle(self, skipped: int, metrics: StepMetrics) -> None:
        """The ``skipped`` steps after this one at once: each is an idle step's copy (no change,
        no events, the same metrics but ``idle_skipped`` 0); a recording gets them in one call
        (``append_idle``: it keeps them as one run of repeated steps)."""
        same = dataclasses.replace(metrics, idle_skipped=0)
        for _ in range(skipped):
            self.stats.add(same)
        if self.recording is not None:
            for done in range(0, skipped, MAX_IDLE_RUN):
                self.recording.append_idle(min(skipped - done, MAX_IDLE_RUN), same)

    def _record(self, step: int, seqs: dict, events, metrics: StepMetrics) -> None:
        """Hand the step to the recording: what the pool view's folds touched, and with ``seqs``
        that hold no tables (a step without a snapshot) the tables that changed, whole."""
        changes = self.view.take_changes()
        if "seq_tables" not in seqs:
            changes = changes._replace(tables=self._tables_of(changes.tables))
        self.recording.record(step, changes, seqs, events, metrics)

    def _tables_of(self, seq_ids) -> dict:
        """seq id -> block table now (empty for a sequence that holds none, or is forgotten)."""
        known = self.scheduler.seqs
        seqs = [known[sid] for sid in seq_ids if sid in known]
        _, _, tables = self.allocator.seq_layout(seqs)
        out = dict.fromkeys(seq_ids, ())
        if tables is not None:
            out.update(zip((s.seq_id for s in seqs), tables))
        return out

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache, as vLLM's ``/reset_prefix_cache``: only while no request
        holds a block (paged allocators). The event sink hears AllBlocksCleared at once."""
        reset = getattr(self.allocator, "reset_prefix_cache", None)
        if reset is None or not reset():
            return False
        if self.view is not None:  # shown at once; a recording gets the ranges with the next step
            self.view.fold(self._changes.take())
        if self.kv_event_sink is not None:
            self.kv_event_sink.flush()
        return True

    def run(self, max_steps: int | None = None, on_step=None, snapshot: bool = True) -> RunSummary:
        """Step until every request is finished or rejected (or ``max_steps`` steps);
        ``on_step(outputs, snapshot)`` sees each step (``snapshot=False``: None instead of a
        full copy; a recording still gets every step). Without ``on_step`` no step builds outputs
        (``step(outputs=False)``: the finished are still counted)."""
        steps = 0
        outputs_read = on_step is not None  # without one, nobody reads the outputs: none are built
        while self.has_unfinished() and (max_steps is None or steps < max_steps):
            outputs, snapshot_ = self.step(snapshot, outputs=outputs_read)
            steps += 1
            if on_step is not None:
                on_step(outputs, snapshot_)
        return self.summary()

    # ------------------------------------------------------------------ reporting
    def _outputs(self, build: bool = True) -> list[RequestOutput]:
        """The touched requests' outputs, in submission order (``build=False``: none, the
        finished are only counted and released)."""
        if not build:  # the same releases, in the same order: only requests that ended can finish
            for request in sorted(self.scheduler.ended, key=_INDEX):
                finished = request.reject_reason is None and request.finished
                if finished:
                    self.num_finished += 1
                if (finished or request.reject_reason is not None) and self._release_finished:
                    self._release(request)
            return []
        sched = self.scheduler
        touched, sampled = sched.touched, sched.sampled
        if sched.lane_sampled:  # the plain decodes: each got a token, and touched its request
            touched.update(map(_REQUEST, sched.lane_sampled))
            sampled.update(map(_SEQ_ID, sched.lane_sampled))
        touched = sorted(touched, key=_INDEX)
        outputs = []
        for request in touched:
            if request.reject_reason is not None:
                outs = [CompletionOutput(i, [], [], FINISH_REJECTED) for i in range(request.n)]
                outputs.append(
                    RequestOutput(request.request_id, request.prompt_token_ids, outs, True, FINISH_REJECTED, request.reject_reason)
                )
                if self._release_finished:
                    self._release(request)
                continue
            seqs = request.seqs
            if len(seqs) == 1 and request.sampling.n == 1:  # the usual case: what request.finished says for one sample
                outs = [_completion(seqs[0], sampled)]
                finished = seqs[0].status >= _FINISHED
            else:
                outs = [_completion(s, sampled) for s in seqs]
                finished = request.finished
            if finished:
                self.num_finished += 1
                if self._release_finished:
                    self._release(request)
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

    def _release(self, request: Request) -> None:
        """Forget a finished request (feed()): its outputs are out, and nothing reads it again.
        Its sequences then stop pointing back at it (``seq.request`` is None): without that cycle
        the request and its sequences are freed as soon as nothing holds them, not whenever
        Python's cyclic collector runs (the README's *Forgotten requests freed at once* has the figures)."""
        self.requests.pop(request.request_id, None)
        for s in request.seqs:
            self.scheduler.seqs.pop(s.seq_id, None)
            if self._on_release is not None:
                self._on_release(s)
            s.request = None

    def _metrics(self, counts: StepCounts, execute_s: float, seq_num_blocks, head_need: int = 0,
                 idle_skipped: int = 0) -> StepMetrics:
        sched = self.scheduler
        use = self.allocator.usage()
        allocated = use.allocated_slots
        queried = use.queried_tokens
        blocks = seq_num_blocks.tolist()  # the mean as numpy's: float64 sums of ints are exact here
        return StepMetrics.of(
            counts,
            sched.totals,
            kv_usage=use.kv_usage,
            token_utilization=use.filled_slots / allocated if allocated else 0.0,
            allocated_slots=allocated,
            filled_slots=use.filled_slots,
            num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped),
            prefix_cache_hit_rate=use.hit_tokens / queried if queried else 0.0,
            prefix_hit_tokens=use.hit_tokens,
            prefix_queried_tokens=queried,
            host_used_blocks=use.host_used_blocks,
            fragmented_slots=use.fragmented_slots,
            largest_free_run=use.largest_free_run,
            next_reservation=head_need,
            mean_blocks_per_seq=sum(blocks) / len(blocks) if blocks else 0.0,
            max_blocks_per_seq=max(blocks) if blocks else 0,
            num_finished=self.num_finished,
            num_rejected=self.num_rejected,
            execute_s=execute_s,
            idle_skipped=idle_skipped,
        )

    def summary(self) -> RunSummary:
        cfg = self.config
        use = self.allocator.usage()
        queried = use.queried_tokens
        return RunSummary.of(
            self.stats,
            self.scheduler.totals,
            **{name: getattr(cfg, name) for name in RunSummary.CONFIG_FIELDS},
            requests=self.num_requests,
            finished=self.num_finished,
            rejected=list(self._rejected),
            prefix_cache_hit_rate=use.hit_tokens / queried if queried else 0.0,
            prefix_cache_hit_tokens=use.hit_tokens,
            prefix_cache_queried_tokens=queried,
            prefix_cache_preempted_hit_tokens=use.preempted_hit_tokens,
            prefix_cache_preempted_queried_tokens=use.preempted_queried_tokens,
        )

    def trace_header(self) -> dict:
        """Config and request list for :func:`pagedkv_core.record.trace_file.write_trace`."""
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
        """Assert the allocator's bookkeeping and that the pool view shows exactly what it
        implies (tests call this after every step)."""
        sched = self.scheduler
        live = sched.live
        for seq in live:
            assert not seq.is_finished, f"{seq} is finished but still queued"
        for seq in sched.running:
            assert seq.status == SequenceStatus.RUNNING
        for seq in sched.swapped:
            assert seq.status == SequenceStatus.SWAPPED
        self.allocator.check_invariants(live)
        sched.check_invariants()
        if self.view is not None:
            self.view.check_against(self.allocator, live)
