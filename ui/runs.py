"""Runs the pages show: engine configs from the sidebar, finished scripted runs (cached), live
real-model runs (stepped by the page), and uploaded traces. Allocation always happens in
``pagedkv_core``; this module only drives the engine's public API and keeps what it records.

Memory. A run keeps its steps as a delta-encoded :class:`~pagedkv_core.record.recording.Recording`
(what changed each step, a keyframe every K steps), never one full snapshot per step, and every
run knows its size in bytes (:attr:`Run.nbytes`). Finished scripted runs are kept once per
process in a :class:`~pagedkv_core.sizing.memory.ByteCache` of :func:`~pagedkv_core.sizing.memory.process_budget`
bytes, so visitors share them; live runs and uploaded traces are kept per browser session in one
of :func:`~pagedkv_core.sizing.memory.session_budget` bytes. Both evict the least recently used runs by
bytes. A run is refused before it starts when its fixed part (the engine's arrays, the
recording's keyframe and working states, and a real model's KV pool) would not fit its share of
the session budget, and stopped, saying so, when its recording grows past that share.
"""
from __future__ import annotations

import functools
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import streamlit as st

from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES, allocator_kind
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import Event
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.sizing.memory import BudgetError, ByteCache, check_fits, process_budget, session_budget
from pagedkv_core.record.recording import Recording, pool_bytes
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.snapshot import ARRAY_FIELDS, StepSnapshot
from pagedkv_core.record.trace_file import TraceError, load_recording, write_recording
from pagedkv_core.record.waste import WasteAccumulator, final_written
from pagedkv_core.workloads.scenarios import Workload, build_workload, workload_from_bytes
from ui import settings
from ui.live_stepper import GuardedRecording, LiveStepper
from ui.workshop import check_upload

MAX_SCRIPTED_STEPS = 5000  # a scripted scenario that has not ended by then is cut short (and says so)
REAL_MAX_TOKENS = 256  # the longest answer a live chat request may ask for: what a contiguous server must reserve
CACHED_SNAPSHOTS = 2  # full snapshots a run keeps rebuilt (a page asks for step 0 and the shown step in turn)
# Python objects of a paged allocator per block (free-list node, holder list, fill, host pool):
# measured 225 B at 1,048,576 slots, both at block size 1 and 16.
ENGINE_BYTES_PER_BLOCK = 240
RECORDING_STATES = 3  # a recording holds its first keyframe, its last step and at()'s cursor
WORKLOAD_REQUEST_BYTES = 400  # one WorkloadRequest: the dataclass, its id string and its tuple
BASELINE_LABELS = {
    "contiguous": "Orca Max",
    "contiguous-pow2": "Orca Pow2",
    "contiguous-oracle": "Orca Oracle",
    "paged": "vLLM (paged)",
}
RESERVES = {
    "contiguous": "reserves prompt + max_tokens",
    "contiguous-pow2": "reserves prompt + the answer's length rounded up to a power of two",
    "contiguous-oracle": "reserves prompt + exactly the answer's length",
}


def allocator_title(allocator: str, block_size: int = 1) -> str:
    """How the pages head an allocator's side: "Contiguous (Orca Max)", "Paged (blocks of 16)"
    (what each contiguous policy reserves is :data:`RESERVES`)."""
    if allocator_kind(allocator) == "paged":
        return f"Paged (blocks of {block_size})"
    return f"Contiguous ({BASELINE_LABELS.get(allocator, allocator)})"


def _snapshot_bytes(snap: StepSnapshot) -> int:
    return sum(getattr(snap, name).nbytes for name in ARRAY_FIELDS)


@dataclass(eq=False)
class Run:
    """One engine run: its recorded steps, the request ids by index (the owner ids in snapshots),
    and whether it is done.

    Pages and figures read the steps only through :attr:`num_steps`, :meth:`at` (a full
    snapshot, rebuilt from the recording) and :meth:`step_events` / :meth:`events` (which decode
    a step's events without rebuilding its arrays). :meth:`at` is safe from several sessions at
    once (a process-wide run is shared): the recording's cursor moves under a lock and the
    snapshots it returns are copies.
    """

    label: str
    config: EngineConfig
    request_ids: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    done: bool = False
    engine: Engine | None = None  # live runs only
    token_text: dict = field(default_factory=dict)  # token id -> text (real model)
    recording: Recording = field(default_factory=Recording, repr=False)
    stopped: str = ""  # why the run was stopped before its end ("" = it was not, or ran out of steps)
    waste: dict | None = None  # the memory-waste breakdown (pagedkv_core.record.waste), scripted runs only
    kv_bytes: int = 0  # a live real-model engine's KV pools (device + host), while it holds them
    texts: list = field(default_factory=list)  # a live run's (request id, text, finish reason) once it has ended
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _snaps: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)

    def __post_init__(self) -> None:
        # A recording that another thread writes (a live run's, see ui.live_stepper) brings the
        # lock it is written under: reading it under the same lock sees whole steps only.
        self._lock = getattr(self.recording, "lock", None) or self._lock

    @property
    def allocator(self) -> str:
        """The allocator's registry name (``paged``, ``contiguous``, ``contiguous-pow2``, ...)."""
        return self.config.allocator

    @property
    def kind(self) -> str:
        """How the allocator lays sequences out: "paged" or "contiguous"."""
        return allocator_kind(self.config.allocator)

    @property
    def num_steps(self) -> int:
        return self.recording.num_steps

    def _index(self, step: int) -> int:
        if not self.recording.num_steps:
            raise IndexError(f"run {self.label!r} has no steps yet")
        return max(0, min(int(step), self.recording.num_steps - 1))

    def at(self, step: int) -> StepSnapshot:
        """The snapshot at ``step``, clamped to the steps recorded (the last one when this run
        ended earlier). IndexError when nothing is recorded yet."""
        i = self._index(step)
        with self._lock:
            snap = self._snaps.get(i)
            if snap is None:
                snap = self.recording.at(self.recording.first_step + i)
                self._snaps[i] = snap
                while len(self._snaps) > CACHED_SNAPSHOTS:
                    self._snaps.popitem(last=False)
            else:
                self._snaps.move_to_end(i)
            return snap

    def step_events(self, step: int) -> tuple[Event, ...]:
        """The events of ``step`` (clamped like :meth:`at`), without rebuilding its arrays."""
        i = self._index(step)
        with self._lock:
            return self.recording.events(self.recording.first_step + i)

    def append(self, snapshot: StepSnapshot) -> None:
        """Record a full snapshot (a run whose engine takes snapshots; it is diffed into the recording)."""
        with self._lock:
            self.recording.append(snapshot)

    def events(self, *kinds: str, upto: int | None = None) -> list[tuple[int, Event]]:
        """(step, event) of the given kinds (all kinds when none given), in order, up to ``upto``."""
        last = self.num_steps if upto is None else min(upto + 1, self.num_steps)
        out = []
        for i in range(last):
            out += [(i, e) for e in self.step_events(i) if not kinds or e.kind in kinds]
        return out

    def first(self, predicate, start: int = 0) -> int | None:
        """The first step from ``start`` whose snapshot satisfies ``predicate``, or None. The
        predicate sees each step's arrays in place (no copy), so it must not keep the snapshot."""
        rec = self.recording
        with self._lock:
            for i in range(max(0, start), rec.num_steps):
                snap = rec.at(rec.first_step + i, copy=False)
                if predicate(snap):
                    return snap.step
        return None

    def metric(self, name: str, *, steps: int | None = None, empty_as_none: bool = False) -> list:
        """One StepMetrics field per step, padded with None to ``steps``; ``empty_as_none``: None
        where nothing was allocated (a ratio of nothing)."""
        with self._lock:
            values = self.recording.metrics_series(name).tolist() if self.num_steps else []
            empty = (self.recording.metrics_series("allocated_slots") == 0).tolist() if empty_as_none and values else []
        if empty:
            values = [None if e else v for v, e in zip(values, empty)]
        n = len(values) if steps is None else steps
        return values[:n] + [None] * (n - len(values))

    def _snapshot_bytes(self) -> int:
        """One rebuilt snapshot: the largest kept so far, or the pool's arrays before any."""
        kept = [_snapshot_bytes(s) for s in list(self._snaps.values())]
        scalars = self.recording.scalars or {}
        return max(kept, default=pool_bytes(scalars.get("num_slots", 0), scalars.get("num_blocks", 0)))

    @property
    def nbytes(self) -> int:
        """What this run holds: its recording, the snapshots it keeps rebuilt (counted full, so
        the figure is known up front), its header, and a live run's engine (allocator arrays
        and, for a real model, the KV pools)."""
        held = self.recording.nbytes + CACHED_SNAPSHOTS * self._snapshot_bytes()
        held += sum(np.asarray(r.get("prompt", ())).nbytes for r in self.header.get("requests", ()))
        if self.engine is not None:
            held += engine_bytes(self.config) + self.kv_bytes
        return held

    def trace_bytes(self) -> bytes:
        """This run as a version-2 trace (see :mod:`pagedkv_core.record.trace_file`)."""
        with tempfile.TemporaryDirectory() as d, self._lock:
            path = write_recording(Path(d) / "trace.jsonl", self.recording, _json_header(self.header))
            return path.read_bytes()


# ---------------------------------------------------------------------------- sizes
def engine_bytes(config: EngineConfig) -> int:
    """An engine's allocator state: its per-slot and per-block arrays (9 B a slot, 15 B a block)
    and, for a paged pool, the Python bookkeeping of every device and host block."""
    paged = allocator_kind(config.allocator) == "paged"
    blocks = config.num_blocks if paged else 0
    host_blocks = config.num_host_blocks if paged else 0
    return pool_bytes(config.pool_slots, blocks) + ENGINE_BYTES_PER_BLOCK * (blocks + host_blocks)


def run_bytes_estimate(config: EngineConfig) -> int:
    """What a run holds before its first step: the engine (:func:`engine_bytes`), the recording's
    keyframe and working states, and the snapshots the run keeps rebuilt. The recording then grows
    by what each step changes (about 13 B a changed slot)."""
    paged = allocator_kind(config.allocator) == "paged"
    copy = pool_bytes(config.pool_slots, config.num_blocks if paged else 0)
    return engine_bytes(config) + (RECORDING_STATES + CACHED_SNAPSHOTS) * copy


def _compact_header(engine: Engine) -> dict:
    """The engine's trace header with each prompt as an int32 array (a list of Python ints costs
    9 times as much; :func:`_json_header` turns them back into lists for a download)."""
    header = engine.trace_header()
    for r in header["requests"]:
        r["prompt"] = np.asarray(r["prompt"], dtype=np.int32)
    return header


def _json_header(header: dict) -> dict:
    if not header.get("requests"):
        return header
    return {**header, "requests": [{**r, "prompt": np.asarray(r.get("prompt", ())).tolist()} for r in header["requests"]]}


def _budget_note(run: Run, budget: int) -> str:
    return (f"its recording reached {format_bytes(run.nbytes)} at step {run.num_steps - 1}, past its share of the "
            f"memory budget ({format_bytes(budget)}); pick a smaller pool or fewer requests to see the rest")


# ---------------------------------------------------------------------------- caches
_PROCESS_LOCK = threading.Lock()
_PROCESS_RUNS = ByteCache(process_budget(), "the app's shared runs")


def process_runs() -> ByteCache:
    """Finished scripted runs, shared by every session of this process, evicted by bytes."""
    _PROCESS_RUNS.capacity = process_budget()  # the budget can be changed while the app runs
    return _PROCESS_RUNS


def session_runs() -> ByteCache:
    """This browser session's live runs and uploaded traces, evicted by bytes."""
    cache = st.session_state.get("_session_runs")
    if cache is None:
        cache = st.session_state["_session_runs"] = ByteCache(session_budget(), "this session's runs")
    cache.capacity = session_budget()
    return cache


# ---------------------------------------------------------------------------- settings
def settings_config(allocator: str, **overrides) -> EngineConfig:
    """EngineConfig from the sidebar settings. Raises ConfigError (one line) on a bad combination."""
    return EngineConfig(**{**settings.engine_settings(), "allocator": allocator, **overrides})


def contiguous_allocator() -> str:
    """The sidebar's contiguous baseline: its registry name (Orca Max, Pow2 or Oracle)."""
    return CONTIGUOUS_POLICIES[settings.current("contiguous_policy")]


@lru_cache(maxsize=4)
def named_workload(name: str, seed: int) -> Workload:
    """A built-in scenario, built once per process for each seed (the trace scenarios take a
    quarter of a second to build)."""
    return build_workload(name, seed=seed)


def current_workload() -> Workload:
    """The sidebar's workload: a named scenario, or the uploaded workload file (JSON, or a trace
    CSV with the sidebar's row and time-scale options). Raises ConfigError."""
    upload = st.session_state.get("workload_upload")
    seed = int(settings.current("seed"))
    if upload is None:
        return named_workload(settings.current("workload"), seed)
    options = settings.csv_options() if settings.is_trace_csv(upload.name) else {}
    key = ("workload", getattr(upload, "file_id", upload.name), upload.size, seed, tuple(sorted(options.items())))
    cache = session_runs()
    workload = cache.get(key)
    if workload is None:
        check_upload(upload, "workload file")
        workload = workload_from_bytes(upload.getvalue(), upload.name, seed=seed, **options)
        cache.put(key, workload, workload_bytes(workload))
    st.session_state["_workload_upload"] = (key, workload)  # what the pages run (tests read it back)
    return workload


def workload_bytes(workload: Workload) -> int:
    """What a workload holds: its prompts as tuples of Python ints (36 B a token) and each
    request's own objects."""
    return sum(36 * len(r.prompt) + WORKLOAD_REQUEST_BYTES for r in workload.requests)


# ---------------------------------------------------------------------------- scripted runs
def play_scripted(config: EngineConfig, workload: Workload, label: str, *, budget: int | None = None) -> Run:
    """Play a workload to the end (or MAX_SCRIPTED_STEPS) on the scripted source, recording every
    step and measuring the memory-waste breakdown as it goes. ``budget`` (default: the session
    budget): refused with BudgetError before the first step when the run's fixed part would not
    fit, stopped (``Run.stopped`` says why) when its recording grows past it."""
    budget = session_budget() if budget is None else int(budget)
    check_fits(run_bytes_estimate(config), budget,
               f"a {config.pool_slots:,}-slot {BASELINE_LABELS.get(label, label)} run "
               f"(engine arrays {format_bytes(engine_bytes(config))} plus its recording's keyframes)",
               hint="pick a smaller pool, or raise PAGEDKV_SESSION_BUDGET")
    recording = Recording()
    engine = Engine(config, ScriptedSource(), recording=recording)
    workload.submit(engine)
    run = Run(label, config, request_ids=list(engine.requests), recording=recording, engine=engine)
    waste = WasteAccumulator()
    while engine.has_unfinished() and recording.num_steps < MAX_SCRIPTED_STEPS:
        engine.step(snapshot=False)
        waste.add_engine(engine)
        if run.nbytes > budget:
            run.stopped = _budget_note(run, budget)
            break
    run.waste = waste.breakdown(final_written(engine))
    run.header = {**_compact_header(engine), "summary": engine.summary().to_json()}
    run.done = not engine.has_unfinished()
    run.engine = None  # the recording keeps every step: drop the allocator's arrays
    return run


def scripted_run(config: EngineConfig, workload: Workload, label: str, *, budget: int | None = None) -> Run:
    """:func:`play_scripted`, once per process for each (config, workload, label), kept in
    :func:`process_runs`. Raises BudgetError (a ConfigError) when the run cannot fit."""
    key = (config, workload, label)
    with _PROCESS_LOCK:
        run = process_runs().get(key)
    if run is None:
        run = play_scripted(config, workload, label, budget=budget)
        with _PROCESS_LOCK:
            process_runs().put(key, run, run.nbytes)
    return run


def scripted_runs(workload: Workload, allocators, **config) -> list[Run]:
    """The workload on each allocator (cached), same settings; each run may hold an equal share
    of the session budget."""
    allocators = list(allocators)
    share = session_budget() // max(1, len(allocators))
    return [scripted_run(EngineConfig(allocator=a, **config), workload, a, budget=share) for a in allocators]


def scripted_pair(workload: Workload, contiguous: str = "contiguous", **config) -> list[Run]:
    """The workload on a contiguous baseline (Orca Max unless told) and on paged blocks (cached)."""
    return scripted_runs(workload, (contiguous, "paged"), **config)


def report_stops(runs: list[Run]) -> None:
    """A warning per run stopped for the memory budget."""
    for run in runs:
        if run.stopped:
            st.warning(f"The {BASELINE_LABELS.get(run.allocator, run.label)} run was stopped: {run.stopped}.")


# ---------------------------------------------------------------------------- uploaded traces
def uploaded_trace() -> Run | None:
    """The trace uploaded in the sidebar, as a finished Run (streamed from the file into a
    recording); shows st.error and returns None when the file is not a pagedkv trace or its
    recording would not fit the session budget."""
    upload = st.session_state.get("trace_upload")
    if upload is None:
        return None
    key = ("trace", getattr(upload, "file_id", upload.name), upload.size)
    cache = session_runs()
    run = cache.get(key)
    if run is not None:
        return run
    try:
        check_upload(upload, "trace")
    except ConfigError as exc:
        st.error(f"Cannot replay {upload.name}: {exc}")
        return None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "upload.jsonl"
        path.write_bytes(upload.getvalue())
        try:
            header, recording = load_recording(path)
        except TraceError as exc:
            st.error(f"Cannot replay {upload.name}: {str(exc).replace(str(path), upload.name)}")
            return None
    if not recording.num_steps:
        st.error(f"Cannot replay {upload.name}: the trace has a header but no steps")
        return None
    first = recording.at(recording.first_step, copy=False)
    try:
        config = EngineConfig.from_dict(header.get("config", {})) if header.get("config") else EngineConfig(
            allocator=first.allocator, block_size=max(1, first.block_size), pool_slots=first.num_slots)
    except (ConfigError, TypeError) as exc:
        st.error(f"Cannot replay {upload.name}: its config is invalid ({exc})")
        return None
    ids = [str(r.get("id", i)) if isinstance(r, dict) else str(i) for i, r in enumerate(header.get("requests", []))]
    run = Run(f"trace {upload.name}", config, ids, {}, done=True, recording=recording)
    try:
        cache.put(key, run, run.nbytes)
    except BudgetError as exc:
        st.error(f"Cannot replay {upload.name}: {exc}")
        return None
    return run


def current_runs() -> list[Run] | None:
    """The runs a pool page shows for the sidebar settings: an uploaded trace; else the workload on
    the sidebar's contiguous baseline and on paged blocks, scripted (finished, cached) or on the
    real model (live). Shows st.error and returns None when the settings are invalid or the runs
    would not fit the memory budget."""
    trace = uploaded_trace()
    if st.session_state.get("trace_upload") is not None:
        return [trace] if trace is not None else None
    try:
        if settings.current("source") == "model":
            return live_pair()
        runs = scripted_pair(current_workload(), contiguous_allocator(), **settings.engine_settings())
    except ConfigError as exc:
        st.error(str(exc))
        return None
    report_stops(runs)
    return runs


# ---------------------------------------------------------------------------- live runs
# Tokens one step of a live real-model engine may compute (EngineConfig.max_batch_tokens, vLLM's
# max_num_batched_tokens): the 16 chat prompts' prefills (about 600 tokens) are chunked over the
# first steps instead of one step of several seconds, so the first frame comes at once. 64 keeps
# one step of the pair near 0.3 s on one core each while prefilling, and above the 16 decodes
# of a full batch, so the budget never holds a decode back.
LIVE_BATCH_TOKENS = 64


def live_configs() -> list[EngineConfig]:
    """The live pair's configs: the sidebar's contiguous baseline and paged, each with the
    per-step token budget :data:`LIVE_BATCH_TOKENS`."""
    return [settings_config(a, max_batch_tokens=LIVE_BATCH_TOKENS) for a in (contiguous_allocator(), "paged")]


LIVE_TRACE_SCALE = 1 / 8  # trace lengths scaled so a CPU replays them live


def live_requests(tokenizer, replay: bool) -> list[tuple[str, list[int], object]]:
    """(request id, prompt ids, SamplingParams) of the live pair: the 16 chat prompts, or the
    first 16 requests of the shipped Azure trace replayed at :data:`LIVE_TRACE_SCALE` (exact
    prompt and answer lengths, ``ignore_eos``; Orca Pow2 and Oracle then reserve from the
    answer's real length)."""
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS
    from pagedkv_core.sampling import SamplingParams
    from ui.models import chat_prompt

    if replay:
        from pagedkv_core.workloads.log_prompts import trace_requests
        from pagedkv_core.workloads.scenarios import DATA_DIR, read_trace_rows

        rows = read_trace_rows(DATA_DIR / "azure_conv_2023.csv", 0, len(CHAT_PROMPTS))
        return [(f"trace{i:02d}", ids, sp) for i, (ids, sp) in enumerate(trace_requests(rows, tokenizer, LIVE_TRACE_SCALE))]
    return [(f"chat{i:02d}", chat_prompt(tokenizer, text), SamplingParams(max_tokens=REAL_MAX_TOKENS))
            for i, text in enumerate(CHAT_PROMPTS)]


def live_pair() -> list[Run] | None:
    """The 16 chat prompts on the real model, the sidebar's contiguous baseline and paged side by
    side, stepped live by the page (:func:`advance_live`) on a thread of their own. Kept in the
    session until the settings change; its first step (at most :data:`LIVE_BATCH_TOKENS` tokens
    each) is computed here. Raises BudgetError (a ConfigError) before allocating when the two KV
    pools would not fit the session budget."""
    from ui.models import engine_factory, model_path, runner_dtype, token_text_lookup

    configs = live_configs()
    # An Azure-trace workload in the sidebar: replay its first 16 requests' lengths (x1/8) on
    # SmolLM2, real-text prompts of exactly those lengths and answers of exactly those lengths.
    replay = str(st.session_state.get("workload", "")).startswith("azure-conv")
    if configs[0].allocator != "contiguous" and not replay:
        st.info(f"{BASELINE_LABELS[configs[0].allocator]} needs each answer's length in advance; SmolLM2's chat "
                "requests state none, so it reserves max_tokens, like Orca Max. Pick an azure-conv workload to "
                "replay the trace's lengths, which it knows.")
    key = ("live", tuple(configs), model_path(), runner_dtype(), replay)
    cache = session_runs()
    held = cache.get(key)
    if held is not None:
        st.session_state["_live_key"] = key
        return held
    make = engine_factory()
    if make is None:
        return None
    kv = [make.kv_bytes(cfg) for cfg in configs]
    need = sum(kv) + sum(run_bytes_estimate(cfg) for cfg in configs)
    check_fits(need, session_budget(),
               f"the two real-model KV pools ({configs[0].pool_slots:,} device slots each, plus "
               f"{configs[1].num_host_blocks * configs[1].block_size:,} host slots for swap, at "
               f"{format_bytes(make.bytes_per_token)} a token)",
               hint="pick a smaller pool or swap pool, or raise PAGEDKV_SESSION_BUDGET")
    runs = []
    for cfg, kv_bytes in zip(configs, kv):
        recording = GuardedRecording()  # written by the stepping thread while the page reads it
        engine = make(cfg, recording=recording)
        for rid, ids, sampling in live_requests(make.tokenizer, replay):
            engine.add_request(rid, ids, sampling)
        runs.append(Run(cfg.allocator, cfg, request_ids=list(engine.requests), header=_compact_header(engine),
                        engine=engine, token_text=_TokenText(token_text_lookup()), recording=recording,
                        kv_bytes=kv_bytes))
    cache.put(key, runs, sum(r.nbytes for r in runs))
    st.session_state["_live_key"] = key
    with st.spinner(f"SmolLM2's first step ({LIVE_BATCH_TOKENS} prompt tokens on each side)…"):
        advance_live(runs, 0)
    return runs


class _TokenText(dict):
    """Truthy token-id -> text mapping for hover labels (decoded lazily)."""

    def __init__(self, lookup):
        super().__init__(ready=True)
        self._lookup = lookup

    def get(self, token_id, default=None):
        return self._lookup(int(token_id))


def _finish(run: Run, tokenizer) -> None:
    """A live run whose engine has ended (or was stopped): keep its header and texts, release its pools."""
    run.texts = live_texts(run, tokenizer)
    run.header = {**_compact_header(run.engine), "summary": run.engine.summary().to_json()}
    run.done = not run.engine.has_unfinished()
    run.engine = None
    run.kv_bytes = 0


def _after_live_step(runs: list[Run], budget: int, tokenizer) -> None:
    """After each step of a live group (on its stepping thread, so no Streamlit here): finish the
    runs that ended, and stop them all, saying so, when together they outgrow ``budget``."""
    for run in runs:
        if run.engine is not None and not run.engine.has_unfinished():
            _finish(run, tokenizer)
    if sum(r.nbytes for r in runs) > budget:
        for run in runs:
            if run.engine is not None:
                run.stopped = _budget_note(run, budget // len(runs))
                _finish(run, tokenizer)


def _stepper(runs: list[Run]) -> LiveStepper:
    """This session's stepper for ``runs``; a stepper of other runs (the settings changed) is
    stopped and replaced."""
    held = st.session_state.get("_live_stepper")
    if held is None or len(held.runs) != len(runs) or any(a is not b for a, b in zip(held.runs, runs)):
        if held is not None:
            held.cancel()
        from ui.models import tokenizer

        held = LiveStepper(runs, functools.partial(_after_live_step, budget=session_budget(), tokenizer=tokenizer()))
        st.session_state["_live_stepper"] = held
    return held


def advance_live(runs: list[Run], to_step: int, *, ahead: int = 0) -> None:
    """Make every unfinished live run record step ``to_step`` (returns once each has, or has
    ended), and keep them stepping on their own thread up to ``to_step + ahead`` while the page
    draws. A page that plays asks for the step after the one it shows with a lookahead (the
    next frame is then usually computed already); Step asks for one more step and no lookahead;
    a lower step than before stops the stepping there. Shows st.warning if a step takes longer
    than the stepper's timeout; re-raises an error a step raised."""
    if not any(r.engine is not None and not r.done for r in runs):
        return
    if not _stepper(runs).advance(to_step, ahead=ahead):
        st.warning(f"SmolLM2 has not finished step {to_step} yet: the machine is busy. It keeps computing; "
                   "press Step or Play again in a moment.")
    key = st.session_state.get("_live_key")
    if key is not None:
        session_runs().touch(key, sum(r.nbytes for r in runs))


def live_texts(run: Run, tok=None) -> list[tuple[str, str, str]]:
    """(request id, text so far, finish reason) of a live real-model run (its engine, while it
    runs; the texts kept when it ended). ``tok``: the model's tokenizer (default: the sidebar
    model's, which needs the script thread)."""
    engine = run.engine  # read once: the stepping thread lets it go when the run ends
    if engine is None:
        return list(run.texts)
    if tok is None:
        from ui.models import tokenizer

        tok = tokenizer()
    out = []
    for rid in run.request_ids:
        req = engine.get_request(rid)
        ids = list(req.output_token_ids[0]) if req.output_token_ids else []
        out.append((rid, tok.decode(ids, skip_special_tokens=True), req.finish_reason or "running"))
    return out
