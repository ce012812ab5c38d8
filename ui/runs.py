"""Runs the pages show: engine configs from the sidebar, finished scripted runs (cached), live
real-model runs (stepped by the page), and uploaded traces. Allocation always happens in
``pagedkv_core``; this module only drives the engine's public API and keeps its snapshots."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from pagedkv_core.allocator import allocator_kind
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import Event
from pagedkv_core.scripted import ScriptedSource
from pagedkv_core.snapshot import StepSnapshot
from pagedkv_core.trace import TraceError, read_trace, write_trace
from pagedkv_core.workloads import Workload, build_workload, parse_workload
from ui import settings

MAX_SCRIPTED_STEPS = 5000  # a scripted scenario that has not ended by then is cut short (and says so)
REAL_MAX_TOKENS = 256  # the longest answer a live chat request may ask for: what a contiguous server must reserve


@dataclass
class Run:
    """One engine run: its steps so far, the request ids by index (the owner ids in snapshots),
    and whether it is done.

    Pages and figures read the steps only through :attr:`num_steps` and :meth:`at`, never the
    list behind them, so the storage can become a delta-encoded recording without touching them.
    """

    label: str
    config: EngineConfig
    request_ids: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    done: bool = False
    engine: Engine | None = None  # live runs only
    token_text: dict = field(default_factory=dict)  # token id -> text (real model)
    _snapshots: list[StepSnapshot] = field(default_factory=list, repr=False)

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
        return len(self._snapshots)

    def at(self, step: int) -> StepSnapshot:
        """The snapshot at ``step``, clamped to the steps recorded (the last one when this run
        ended earlier). IndexError when nothing is recorded yet."""
        if not self._snapshots:
            raise IndexError(f"run {self.label!r} has no steps yet")
        return self._snapshots[max(0, min(step, len(self._snapshots) - 1))]

    def append(self, snapshot: StepSnapshot) -> None:
        self._snapshots.append(snapshot)

    def events(self, *kinds: str, upto: int | None = None) -> list[tuple[int, Event]]:
        """(step, event) of the given kinds (all kinds when none given), in order, up to ``upto``."""
        last = self.num_steps if upto is None else min(upto + 1, self.num_steps)
        return [(s.step, e) for s in map(self.at, range(last)) for e in s.events if not kinds or e.kind in kinds]

    def first(self, predicate, start: int = 0) -> int | None:
        """The first step from ``start`` whose snapshot satisfies ``predicate``, or None."""
        return next((self.at(i).step for i in range(start, self.num_steps) if predicate(self.at(i))), None)

    def metric(self, name: str, *, steps: int | None = None, empty_as_none: bool = False) -> list:
        """One StepMetrics field per step, padded with None to ``steps``; ``empty_as_none``: None
        where nothing was allocated (a ratio of nothing)."""
        out = []
        for i in range(self.num_steps if steps is None else steps):
            m = self.at(i).metrics if i < self.num_steps else None
            out.append(None if m is None or (empty_as_none and not m.allocated_slots) else getattr(m, name))
        return out

    def trace_bytes(self) -> bytes:
        with tempfile.TemporaryDirectory() as d:
            path = write_trace(Path(d) / "trace.jsonl", self._snapshots, self.header)
            return path.read_bytes()


def settings_config(allocator: str, **overrides) -> EngineConfig:
    """EngineConfig from the sidebar settings. Raises ConfigError (one line) on a bad combination."""
    return EngineConfig(**{**settings.engine_settings(), "allocator": allocator, **overrides})


def current_workload() -> Workload:
    """The sidebar's workload: a named scenario, or the uploaded workload file. Raises ConfigError."""
    upload = st.session_state.get("workload_upload")
    seed = int(settings.current("seed"))
    if upload is not None:
        try:
            data = json.loads(upload.getvalue().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"workload file {upload.name}: not JSON ({exc})") from None
        return parse_workload(data, name=upload.name, seed=seed)
    return build_workload(settings.current("workload"), seed=seed)


def play_scripted(config: EngineConfig, workload: Workload, label: str) -> Run:
    """Play a workload to the end (or MAX_SCRIPTED_STEPS) on the scripted source and keep every step."""
    engine = Engine(config, ScriptedSource())
    workload.submit(engine)
    run = Run(label, config, request_ids=list(engine.requests))
    while engine.has_unfinished() and run.num_steps < MAX_SCRIPTED_STEPS:
        run.append(engine.step()[1])
    run.header = {**engine.trace_header(), "summary": engine.summary().to_json()}
    run.done = not engine.has_unfinished()
    return run


@st.cache_resource(show_spinner=False, max_entries=24)
def scripted_run(config: EngineConfig, workload: Workload, label: str) -> Run:
    """:func:`play_scripted`, once per process for each (config, workload)."""
    return play_scripted(config, workload, label)


def scripted_pair(workload: Workload, **config) -> list[Run]:
    """The workload on the contiguous baseline and on paged blocks (cached), same settings."""
    return [scripted_run(EngineConfig(allocator=a, **config), workload, a) for a in ("contiguous", "paged")]


def uploaded_trace() -> Run | None:
    """The trace uploaded in the sidebar, as a finished Run; shows st.error and returns None when
    the file is not a pagedkv trace."""
    upload = st.session_state.get("trace_upload")
    if upload is None:
        return None
    key = ("trace", upload.file_id if hasattr(upload, "file_id") else upload.name, upload.size)
    cached = st.session_state.get("_trace_cache")
    if cached and cached[0] == key:
        return cached[1]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "upload.jsonl"
        path.write_bytes(upload.getvalue())
        try:
            header, snaps = read_trace(path)
        except TraceError as exc:
            st.error(f"Cannot replay {upload.name}: {str(exc).replace(str(path), upload.name)}")
            return None
    if not snaps:
        st.error(f"Cannot replay {upload.name}: the trace has a header but no steps")
        return None
    try:
        config = EngineConfig.from_dict(header.get("config", {})) if header.get("config") else EngineConfig(
            allocator=snaps[0].allocator, block_size=max(1, snaps[0].block_size), pool_slots=snaps[0].num_slots)
    except (ConfigError, TypeError) as exc:
        st.error(f"Cannot replay {upload.name}: its config is invalid ({exc})")
        return None
    ids = [r.get("id", str(i)) for i, r in enumerate(header.get("requests", []))]
    run = Run(f"trace {upload.name}", config, ids, header, done=True)
    for snap in snaps:
        run.append(snap)
    st.session_state["_trace_cache"] = (key, run)
    return run


def current_runs() -> list[Run] | None:
    """The runs a pool page shows for the sidebar settings: an uploaded trace; else the workload on
    both allocators, scripted (finished, cached) or on the real model (live). Shows st.error and
    returns None when the settings are invalid."""
    trace = uploaded_trace()
    if st.session_state.get("trace_upload") is not None:
        return [trace] if trace is not None else None
    try:
        if settings.current("source") == "model":
            return live_pair()
        return scripted_pair(current_workload(), **settings.engine_settings())
    except ConfigError as exc:
        st.error(str(exc))
        return None


def live_pair() -> list[Run] | None:
    """The 16 chat prompts on the real model, contiguous and paged side by side, stepped live by
    the page (``step_live``). Kept in the session until the settings change."""
    from pagedkv_core.prompts import CHAT_PROMPTS
    from pagedkv_core.sampling import SamplingParams
    from ui.models import chat_prompt, engine_factory, model_path, token_text_lookup

    configs = [settings_config("contiguous"), settings_config("paged")]
    key = ("live", tuple(configs), model_path())
    cached = st.session_state.get("_live_pair")
    if cached and cached[0] == key:
        return cached[1]
    make = engine_factory()
    if make is None:
        return None
    runs = []
    for cfg in configs:
        engine = make(cfg)
        for i, text in enumerate(CHAT_PROMPTS):
            engine.add_request(f"chat{i:02d}", chat_prompt(make.tokenizer, text), SamplingParams(max_tokens=REAL_MAX_TOKENS))
        runs.append(Run(cfg.allocator, cfg, request_ids=list(engine.requests), header=engine.trace_header(),
                        engine=engine, token_text=_TokenText(token_text_lookup())))
    with st.spinner("Prefilling 16 chat prompts on SmolLM2…"):
        step_live(runs, 0)
    st.session_state["_live_pair"] = (key, runs)
    return runs


class _TokenText(dict):
    """Truthy token-id -> text mapping for hover labels (decoded lazily)."""

    def __init__(self, lookup):
        super().__init__(ready=True)
        self._lookup = lookup

    def get(self, token_id, default=None):
        return self._lookup(int(token_id))


def step_live(runs: list[Run], shown_step: int) -> None:
    """Advance every unfinished live run until it has a snapshot past ``shown_step``."""
    for run in runs:
        if run.engine is None or run.done:
            continue
        if run.num_steps <= shown_step + 1:
            run.append(run.engine.step()[1])
            if not run.engine.has_unfinished():
                run.done = True
                run.header = {**run.engine.trace_header(), "summary": run.engine.summary().to_json()}


def live_texts(run: Run) -> list[tuple[str, str, str]]:
    """(request id, text so far, finish reason) of a live real-model run."""
    from ui.models import tokenizer

    tok = tokenizer()
    out = []
    for rid in run.request_ids:
        req = run.engine.get_request(rid)
        ids = req.output_token_ids[0] if req.output_token_ids else []
        out.append((rid, tok.decode(ids, skip_special_tokens=True), req.finish_reason or "running"))
    return out
