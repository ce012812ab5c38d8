"""Runs the pages show: engine configs from the sidebar, finished scripted runs (cached), live
real-model runs (stepped by the page), and uploaded traces. Allocation always happens in
``pagedkv_core``; this module only drives the engine's public API and keeps its snapshots."""
from __future__ import annotations

import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.scripted import ScriptedSource
from pagedkv_core.snapshot import StepSnapshot
from pagedkv_core.trace import TraceError, read_trace, write_trace
from pagedkv_core.workloads import Workload, build_workload, parse_workload

MAX_STEPS = 5000  # a scripted scenario that has not ended by then is cut short (and says so)


@dataclass
class Run:
    """One engine run: its snapshots so far, the request ids by index, and whether it is done."""

    label: str
    config: EngineConfig
    snapshots: list[StepSnapshot] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    done: bool = False
    engine: Engine | None = None  # live runs only
    token_text: dict = field(default_factory=dict)  # token id -> text (real model)

    @property
    def allocator(self) -> str:
        return self.config.allocator

    def at(self, step: int) -> StepSnapshot:
        """The snapshot at ``step``, or the last one when this run ended earlier."""
        return self.snapshots[min(step, len(self.snapshots) - 1)]

    def trace_bytes(self) -> bytes:
        with tempfile.TemporaryDirectory() as d:
            path = write_trace(Path(d) / "trace.jsonl", self.snapshots, self.header)
            return path.read_bytes()


def settings_config(allocator: str, **overrides) -> EngineConfig:
    """EngineConfig from the sidebar settings. Raises ConfigError (one line) on a bad combination."""
    s = st.session_state
    values = dict(
        allocator=allocator,
        block_size=int(s.get("block_size", 16)),
        pool_slots=int(s.get("pool_slots", 2048)),
        watermark=float(s.get("watermark", 0.01)),
        preemption=s.get("preemption", "recompute"),
        swap_slots=int(s.get("swap_slots", 1024)),
        prefix_caching=bool(s.get("prefix_caching", True)),
        seed=int(s.get("seed", 0)),
    )
    values.update(overrides)
    return EngineConfig(**values)


def current_workload() -> Workload:
    """The sidebar's workload: a named scenario, or the uploaded workload file. Raises ConfigError."""
    upload = st.session_state.get("workload_upload")
    seed = int(st.session_state.get("seed", 0))
    if upload is not None:
        try:
            data = json.loads(upload.getvalue().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"workload file {upload.name}: not JSON ({exc})") from None
        return parse_workload(data, name=upload.name, seed=seed)
    return build_workload(st.session_state.get("workload", "explainer40"), seed=seed)


@st.cache_resource(show_spinner=False, max_entries=24)
def scripted_run(config: EngineConfig, workload: Workload, label: str) -> Run:
    """Play a workload to the end on the scripted source (instant) and keep every snapshot."""
    engine = Engine(config, ScriptedSource())
    workload.submit(engine)
    run = Run(label, config, request_ids=list(engine.requests))
    while engine.has_unfinished() and len(run.snapshots) < MAX_STEPS:
        run.snapshots.append(engine.step()[1])
    run.header = {**engine.trace_header(), "summary": engine.summary().to_json()}
    run.done = not engine.has_unfinished()
    return run


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
    run = Run(f"trace {upload.name}", config, snaps, ids, header, done=True)
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
        if st.session_state.get("source") == "model":
            return live_pair()
        workload = current_workload()
        return [scripted_run(settings_config("contiguous"), workload, "contiguous"),
                scripted_run(settings_config("paged"), workload, "paged")]
    except ConfigError as exc:
        st.error(str(exc))
        return None


REAL_MAX_TOKENS = 256  # the longest answer a request may ask for: what a contiguous server must reserve


def live_pair() -> list[Run] | None:
    """The 16 chat prompts on the real model, contiguous and paged side by side, stepped live by
    the page (``step_live``). Kept in the session until the settings change."""
    from pagedkv_core.prompts import CHAT_PROMPTS
    from pagedkv_core.sampling import SamplingParams
    from pages.common import chat_ids, real_engine, token_text_lookup

    configs = [settings_config("contiguous"), settings_config("paged")]
    key = ("live", tuple(configs), st.session_state.get("model_path", ""))
    cached = st.session_state.get("_live_pair")
    if cached and cached[0] == key:
        return cached[1]
    runs = []
    for cfg in configs:
        engine = real_engine(cfg)
        if engine is None:
            return None
        for i, text in enumerate(CHAT_PROMPTS):
            engine.add_request(f"chat{i:02d}", chat_ids(text), SamplingParams(max_tokens=REAL_MAX_TOKENS))
        run = Run(cfg.allocator, cfg, request_ids=list(engine.requests), header=engine.trace_header(),
                  engine=engine, token_text={})
        run.token_text = _TokenText(token_text_lookup())
        runs.append(run)
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
        if len(run.snapshots) <= shown_step + 1:
            run.snapshots.append(run.engine.step()[1])
            if not run.engine.has_unfinished():
                run.done = True
                run.header = {**run.engine.trace_header(), "summary": run.engine.summary().to_json()}


def live_texts(run: Run) -> list[tuple[str, str, str]]:
    """(request id, text so far, finish reason) of a live real-model run."""
    from pages.common import tokenizer

    tok = tokenizer()
    out = []
    for rid in run.request_ids:
        req = run.engine.get_request(rid)
        ids = req.output_token_ids[0] if req.output_token_ids else []
        out.append((rid, tok.decode(ids, skip_special_tokens=True), req.finish_reason or "running"))
    return out
