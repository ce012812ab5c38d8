"""Real-model runs that the teaching pages record step by step.

A :class:`TimedRun` drives one :class:`~pagedkv_core.engine.Engine` through its public API and
keeps, per step, the wall time of ``engine.step()`` (``time.perf_counter``) and every sample's
output tokens so far; the engine records each step into the run's recording itself, as a delta of
what changed (``Engine(config, source, recording=rec)`` and ``engine.step(snapshot=False)``, like
every other run), so a step costs what it changed, not a full snapshot of the pool. Every number a
lesson shows (time to first token, prefill tokens computed or skipped, bytes swapped, tokens
recomputed) is read back from these runs: measured, not asserted. A lesson's scenario is a
function ``scenario(make_engine, tokenizer, config, *args)`` that runs the same with the real
model (the pages) or any other token source; it never allocates anything itself.
``make_engine(config, recording=rec)`` returns a fresh engine that records into ``rec``.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import streamlit as st

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import ADMIT, CACHE_HIT, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN
from pagedkv_core.outputs import RequestOutput
from pagedkv_core.sampling import SamplingParams
from ui import run_store
from ui.live_stepper import GuardedRecording
from ui.runs.model import Run

MAX_LESSON_STEPS = 400  # a lesson run that has not ended by then is cut short


@dataclass(frozen=True)
class RequestInfo:
    request_id: str
    label: str  # what the lesson calls it ("A", "B", ...)
    text: str  # the question, for display
    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int
    arrival_step: int


@dataclass
class TimedRun(Run):
    """One engine run, recorded step by step with its wall times and outputs (see the module docstring)."""

    bytes_per_block: int = 0
    wall_s: list[float] = field(default_factory=list)
    # Each sample's tokens are kept once, appended as the engine emits them; per step only their
    # lengths are kept, so the history grows with what each step added (a token per sample), not
    # with every answer again at every step.
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)  # request id -> sample -> tokens
    lengths: list[dict[str, tuple[int, ...]]] = field(default_factory=list)  # per step: request id -> lengths
    requests: dict[str, RequestInfo] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> reason

    # ------------------------------------------------------------------ driving
    def add(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, *, label: str = "",
            text: str = "", arrival_step: int | None = None) -> None:
        eng = self.engine
        arrival = eng.step_index if arrival_step is None else arrival_step
        eng.add_request(request_id, prompt_ids, sampling, arrival_step=arrival)
        self.requests[request_id] = RequestInfo(request_id, label or request_id, text, tuple(prompt_ids),
                                                sampling.n, sampling.max_tokens, arrival)
        self.request_ids.append(request_id)
        self.done = False

    def step(self) -> list[RequestOutput]:
        """One ``engine.step()``, timed (the engine records it into :attr:`recording`), with every
        request's outputs so far; returns the step's outputs."""
        eng = self.engine
        t0 = time.perf_counter()
        outs, _ = eng.step(snapshot=False)
        self.wall_s.append(time.perf_counter() - t0)
        for o in outs:
            if o.reject_reason:
                self.rejected[o.request_id] = o.reject_reason
            samples = self.tokens.setdefault(o.request_id, [[] for _ in range(self.requests[o.request_id].n)]
                                             if o.request_id in self.requests else [])
            for c in o.outputs:
                while len(samples) <= c.index:
                    samples.append([])
                samples[c.index].extend(c.new_token_ids)  # only what this step added
        self.lengths.append({rid: tuple(len(t) for t in samples) for rid, samples in self.tokens.items()})
        self.done = not eng.has_unfinished()
        return outs

    def run(self, max_steps: int = MAX_LESSON_STEPS) -> "TimedRun":
        while self.engine.has_unfinished() and self.num_steps < max_steps:
            self.step()
        return self

    def release(self) -> "TimedRun":
        """Drop the engine (and with it the KV pool) of a finished run; the recorded steps stay."""
        self.engine = None
        return self

    # ------------------------------------------------------------------ reading back
    @property
    def last_step(self) -> int:
        return max(0, self.num_steps - 1)

    def step_wall_s(self, step: int) -> float:
        """Measured wall time of ``engine.step()`` at ``step`` (clamped like :meth:`at`)."""
        return self.wall_s[max(0, min(step, len(self.wall_s) - 1))]

    def excess_wall_s(self, steps) -> float:
        """Measured time of ``steps`` beyond the run's median step time, summed: what the extra work
        done in those steps cost (noisy on a busy machine; the median of the others is the baseline)."""
        steps = sorted(set(steps))
        others = [w for i, w in enumerate(self.wall_s) if i not in steps]
        if not steps or not others:
            return 0.0
        base = statistics.median(others)
        return sum(self.wall_s[i] - base for i in steps if i < len(self.wall_s))

    def outputs_at(self, step: int) -> dict[str, list[list[int]]]:
        """Every sample's output tokens as they were after ``step`` (clamped like :meth:`at`)."""
        if not self.lengths:
            return {rid: [[] for _ in range(r.n)] for rid, r in self.requests.items()}
        lens = self.lengths[max(0, min(step, len(self.lengths) - 1))]
        out = {}
        for rid, r in self.requests.items():
            n = lens.get(rid, ())
            samples = self.tokens.get(rid, [])
            out[rid] = [samples[i][: n[i]] if i < len(n) else [] for i in range(max(r.n, len(n)))]
        return out

    def first_token_step(self, request_id: str) -> int | None:
        for i, lens in enumerate(self.lengths):
            if any(lens.get(request_id, ())):
                return i
        return None

    def finish_step(self, request_id: str) -> int | None:
        """The step in which the request's last sample finished (None while it runs)."""
        first = self.first_token_step(request_id)
        if first is None:
            return None
        idx = self.request_ids.index(request_id)
        for i in range(first, self.num_steps):
            if not (self.at(i).seq_request == idx).any():
                return i
        return None

    def ttft_s(self, request_id: str) -> float | None:
        """Measured time to first token: wall time of the steps from the request's arrival to
        the step that sampled its first token, inclusive."""
        first = self.first_token_step(request_id)
        if first is None:
            return None
        return sum(self.wall_s[self.requests[request_id].arrival_step : first + 1])

    def prefill_tokens(self, request_id: str) -> tuple[int, int]:
        """(computed, skipped) prompt tokens at the request's first admission: skipped = the
        tokens whose K/V came from the prefix cache."""
        for _, e in self.events(ADMIT):
            if e.request_id == request_id and not e.detail.get("recompute"):
                cached = int(e.detail.get("cached_tokens", 0))
                return len(self.requests[request_id].prompt_ids) - cached, cached
        return 0, 0

    def cache_hit_blocks(self, request_id: str) -> list[int]:
        for _, e in self.events(CACHE_HIT):
            if e.request_id == request_id:
                return list(e.detail.get("blocks", []))
        return []

    def output_ids(self, request_id: str) -> list[list[int]]:
        return self.outputs_at(len(self.lengths) - 1)[request_id] if self.lengths else []

    # ------------------------------------------------------------------ pressure
    # ``upto``: count the steps up to and including it only (None: the whole run).
    def swap_bytes(self, upto: int | None = None) -> tuple[int, int]:
        """(bytes copied to host, bytes copied back)."""
        out = sum(len(e.detail.get("host_blocks", [])) for _, e in self.events(PREEMPT_SWAP, upto=upto))
        back = sum(len(e.detail.get("host_blocks", [])) for _, e in self.events(SWAP_IN, upto=upto))
        return out * self.bytes_per_block, back * self.bytes_per_block

    def recompute_cache_hits(self, upto: int | None = None) -> int:
        """Tokens that sequences re-admitted after a recompute preemption found in the prefix cache."""
        return sum(int(e.detail.get("cached_tokens", 0)) for _, e in self.events(ADMIT, upto=upto)
                   if e.detail.get("recompute"))

    def recomputed_tokens(self, upto: int | None = None) -> int:
        """Tokens prefilled again after a recompute preemption (prefix-cache hits excluded)."""
        total = 0
        for step, e in self.events(ADMIT, upto=upto):
            if not e.detail.get("recompute"):
                continue
            snap = self.at(step)
            try:
                computed = int(snap.seq_num_computed[snap.seq_index(e.seq_id)])
            except KeyError:  # finished within the same step: it computed all but its last token
                computed = 0
            total += max(0, computed - int(e.detail.get("cached_tokens", 0)))
        return total

    def readmitted_tokens(self, upto: int | None = None) -> int:
        """Tokens the sequences re-admitted after a recompute preemption had when they came back (all
        of them need K/V again: the prefix cache serves some, the rest is prefilled). That is what they
        held when evicted plus the token each had sampled but whose K/V was not yet written."""
        total = 0
        for step, e in self.events(ADMIT, upto=upto):
            if not e.detail.get("recompute") or step == 0:
                continue
            before = self.at(step - 1)
            try:
                total += int(before.seq_num_tokens[before.seq_index(e.seq_id)])
            except KeyError:
                pass
        return total

    def preempted_tokens(self, upto: int | None = None) -> int:
        """Tokens whose K/V the preempted sequences had in the pool when they were evicted."""
        total = 0
        for step, e in self.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE, upto=upto):
            if step == 0:
                continue
            before = self.at(step - 1)
            try:
                total += int(before.seq_num_computed[before.seq_index(e.seq_id)])
            except KeyError:
                pass
        return total

    def preemptions(self, upto: int | None = None) -> list[dict]:
        """Every preemption, with the running sequences it was chosen from: the running list of
        the snapshot before, in admission order (the engine keeps it so)."""
        rows = []
        ids = self.request_ids
        for step, e in self.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE, upto=upto):
            before = self.at(step - 1) if step > 0 else None
            running = []
            if before is not None:
                for sid in before.running:
                    i = before.seq_index(sid)
                    running.append(ids[int(before.seq_request[i])])
            rows.append({
                "step": step,
                "victim": e.request_id,
                "mode": "swap" if e.kind == PREEMPT_SWAP else "recompute",
                "blocks": len(e.detail.get("blocks", [])),
                "running_before": running,
                "reason": e.detail.get("reason", ""),
            })
        return rows


MakeEngine = Callable[..., Engine]  # make_engine(config, recording=rec): a fresh engine that records into rec


def run_interleaved(runs: list[TimedRun], max_steps: int = MAX_LESSON_STEPS) -> list[TimedRun]:
    """Run several engines to the end one step each in turn, the order reversed every step, so
    that whatever else loads the machine weighs on their measured step times alike (two runs one
    after the other can differ 30x on a busy machine). Each engine is still stepped alone: the
    tokens and the schedule are exactly what :meth:`TimedRun.run` would produce."""
    order = list(runs)
    while True:
        live = [r for r in order if r.engine.has_unfinished() and r.num_steps < max_steps]
        if not live:
            return runs
        for rec in live:
            rec.step()
        order.reverse()


def new_timed_run(label: str, config: EngineConfig, make_engine: MakeEngine) -> TimedRun:
    """An empty run on a fresh engine that records into the run's recording (written under the
    lock the run reads it under); ``bytes_per_block`` from the token source when it knows it."""
    recording = GuardedRecording()
    engine = make_engine(config, recording=recording)
    bpb = 0
    source = engine.source
    if hasattr(source, "bytes_per_block"):
        bpb = int(source.bytes_per_block(config.block_size))
    return TimedRun(label, config, bytes_per_block=bpb, engine=engine, recording=recording)


# ---------------------------------------------------------------------------- Streamlit side
def cached(scenario: Callable, config: EngineConfig, *args, spinner: str = "Running SmolLM2…"):
    """``scenario(make_engine, tokenizer, config, *args)`` on the sidebar's model, run once per
    process for each config and arguments and kept in ``st.cache_resource``: a TimedRun, or what
    the scenario returns (several runs). A run this machine finished before with the same code,
    model and precision is read back from the run store (:mod:`ui.run_store`) instead. None
    (after st.error) when the model cannot load."""
    from ui.models import engine_factory, model_path

    make = engine_factory()
    if make is None:
        return None
    runner = make.runner
    precision = f"{type(runner).__qualname__}|{getattr(runner, 'device', '')}|{getattr(runner, 'dtype', '')}"
    with st.spinner(spinner):
        return _cached_run(f"{scenario.__module__}.{scenario.__qualname__}", config, args, model_path(), precision,
                           scenario, make)


@st.cache_resource(show_spinner=False, max_entries=16)
def _cached_run(name: str, config: EngineConfig, args: tuple, model_path: str, precision: str, _scenario, _make):
    key = run_store.run_key(name, config, args, _model_id(model_path), precision)
    stored = run_store.load(key)
    if stored is not None:
        return stored
    result = _scenario(_make, _make.tokenizer, config, *args)
    run_store.save(key, result)
    return result


def _model_id(model_path: str) -> str:
    """The model file (or folder) a run used: its path, size and time of change."""
    from pagedkv_core.sources.model.loader import resolve_source

    source = resolve_source(model_path or None)
    files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
    return "|".join(f"{p.resolve()}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)
