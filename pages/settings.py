"""The shared sidebar: engine settings kept across pages, mirrored in the URL so a link opens the
exact scenario. Bad values in the URL are reported with st.error and replaced by defaults."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import streamlit as st

BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
SOURCES = {"scripted": "Scripted (instant)", "model": "SmolLM2 (real text)"}
PREEMPTIONS = ["recompute", "swap"]


@dataclass(frozen=True)
class Setting:
    key: str
    default: object
    parse: object  # str -> value, raises ValueError with a reason
    help: str = ""


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {value}")
        return value
    return parse


def _one_of(options):
    def parse(text: str):
        if text not in options:
            raise ValueError(f"must be one of {', '.join(map(str, options))}, got {text!r}")
        return text
    return parse


def _block_size(text: str) -> int:
    value = _int_in(1, 128)(text)
    if value not in BLOCK_SIZES:
        raise ValueError(f"must be a power of two from 1 to 128, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None
    if not 0.0 <= value < 0.5:
        raise ValueError(f"must be in [0, 0.5), got {value}")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "on", "yes"):
        return True
    if text.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"must be on or off, got {text!r}")


def _workload(text: str) -> str:
    from pagedkv_core.workloads import WORKLOADS

    return _one_of(list(WORKLOADS))(text)


SETTINGS = [
    Setting("block_size", 16, _block_size),
    Setting("pool_slots", 2048, _int_in(16, 65536)),
    Setting("watermark", 0.01, _fraction),
    Setting("preemption", "recompute", _one_of(PREEMPTIONS)),
    Setting("swap_slots", 1024, _int_in(0, 65536)),
    Setting("prefix_caching", True, _bool),
    Setting("workload", "explainer40", _workload),
    Setting("source", "scripted", _one_of(list(SOURCES))),
    Setting("seed", 0, _int_in(0, 2**31 - 1)),
]
BY_KEY = {s.key: s for s in SETTINGS}


def _to_url(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def load_from_url() -> list[str]:
    """Once per browser session: take settings from the query string. Returns the problems found."""
    if st.session_state.get("_settings_from_url_done"):
        return st.session_state.get("_url_problems", [])
    problems = []
    for s in SETTINGS:
        st.session_state.setdefault(s.key, s.default)
        if s.key in st.query_params:
            try:
                st.session_state[s.key] = s.parse(st.query_params[s.key])
            except ValueError as exc:
                problems.append(f"URL parameter {s.key}: {exc}; using {_to_url(s.default)}")
    st.session_state["_settings_from_url_done"] = True
    st.session_state["_url_problems"] = problems
    return problems


def write_to_url() -> None:
    """Mirror the current settings into the query string (only those that differ from defaults)."""
    wanted = {s.key: _to_url(st.session_state[s.key]) for s in SETTINGS if st.session_state.get(s.key) != s.default}
    current = {k: st.query_params[k] for k in st.query_params}
    if wanted != {k: v for k, v in current.items() if k in BY_KEY}:
        for k in list(st.query_params):
            if k in BY_KEY:
                del st.query_params[k]
        for k, v in wanted.items():
            st.query_params[k] = v


@functools.lru_cache(maxsize=None)
def _workload_label(name: str) -> str:
    from pagedkv_core.workloads import build_workload

    return f"{name}: {build_workload(name).description}"


def sidebar() -> None:
    """Draw the engine settings. Every page reads them from st.session_state on its next run."""
    from pagedkv_core.workloads import WORKLOADS

    for problem in load_from_url():
        st.error(problem)
    sb = st.sidebar
    sb.header("Engine settings")
    sb.select_slider("Block size (token slots per block)", options=BLOCK_SIZES, key="block_size",
                     help="Small blocks waste less of their last block; large blocks mean shorter block tables.")
    sb.number_input("Pool size (token slots)", min_value=16, max_value=65536, step=256, key="pool_slots",
                    help="KV memory shared by all requests, counted in token slots. Both allocators get the same pool.")
    sb.slider("Watermark (share of the pool kept free)", min_value=0.0, max_value=0.49, step=0.01, key="watermark",
              help="Admissions may not dip into this reserve, so running sequences can always grow by a token.")
    sb.radio("Preemption", PREEMPTIONS, key="preemption", horizontal=True,
             help="When the pool is full: recompute (drop the KV, re-prefill later) or swap (copy it to host memory).")
    sb.number_input("Swap pool (host token slots)", min_value=0, max_value=65536, step=256, key="swap_slots",
                    disabled=st.session_state.get("preemption") != "swap")
    sb.toggle("Prefix caching", key="prefix_caching",
              help="Reuse full blocks whose chained hash (parent hash + tokens) matches an earlier request's.")
    sb.selectbox("Workload", list(WORKLOADS), key="workload", format_func=_workload_label,
                 help="A seeded scenario of scripted requests (prompt length, answer length, arrival step).")
    sb.file_uploader("…or a workload file (.json)", type=["json"], key="workload_upload",
                     help='A JSON list of {"id", "prompt" or "prompt_len", "output_len", "max_tokens", "arrival_step", "n"}.')
    sb.radio("Token source", list(SOURCES), key="source", format_func=SOURCES.get,
             help="Scripted plays hundreds of steps instantly; SmolLM2 runs the real model and shows real text.")
    sb.number_input("Seed", min_value=0, max_value=2**31 - 1, step=1, key="seed")
    with sb.expander("Model and traces"):
        st.text_input("Model (blank = bundled SmolLM2-135M)", key="model_path",
                      help="A local Llama-family model directory or .gguf file.")
        st.file_uploader("Replay a trace (.jsonl)", type=["jsonl", "json"], key="trace_upload",
                         help="A trace downloaded from a page or written by `python -m pagedkv_core simulate --trace-out`.")
    write_to_url()
