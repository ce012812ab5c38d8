"""The shared sidebar: engine settings kept across pages, mirrored in the URL so a link opens the
exact scenario. Bad values in the URL are reported with st.error and replaced by defaults.

Every engine setting's default and bounds come from its rule in :mod:`pagedkv_core.config`
(``setting_spec``), so the sidebar, the CLI and ``EngineConfig`` itself cannot drift apart.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from pagedkv_core.config import SettingSpec, setting_spec

# The block sizes the sidebar offers: the powers of two up to 128, a subset of the engine's bound.
BLOCK_SIZES = [1 << i for i in range(8)]
SOURCES = {"scripted": "Scripted (instant)", "model": "SmolLM2 (real text)"}
WATERMARK_STEP = 0.01
# The EngineConfig fields the sidebar sets (the allocator is the page's choice).
ENGINE_KEYS = ("block_size", "pool_slots", "watermark", "preemption", "swap_slots", "prefix_caching", "seed")


@dataclass(frozen=True)
class Setting:
    key: str
    default: object
    parse: Callable[[str], object]  # URL text -> value; raises ValueError (one line) with the reason


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "on", "yes"):
        return True
    if text.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"must be on or off, got {text!r}")


def _one_of(options):
    def parse(text: str):
        if text not in options:
            raise ValueError(f"must be one of {', '.join(map(str, options))}, got {text!r}")
        return text
    return parse


def _engine(name: str, from_text: Callable[[str], object], offered: list | None = None) -> Setting:
    """A setting of EngineConfig: its default and its rule come from the config (ConfigError is a
    ValueError); ``offered`` narrows the values to what the sidebar's widget can show."""
    spec = setting_spec(name)

    def parse(text: str):
        value = from_text(text)
        if offered is not None and value not in offered:
            raise ValueError(f"must be one of {', '.join(map(str, offered))}, got {value!r}")
        return spec.check(value)

    return Setting(name, spec.default, parse)


def _workload(text: str) -> str:
    from pagedkv_core.workloads import WORKLOADS

    return _one_of(list(WORKLOADS))(text)


SETTINGS = [
    _engine("block_size", _whole, BLOCK_SIZES),
    _engine("pool_slots", _whole),
    _engine("watermark", _number),
    _engine("preemption", str),
    _engine("swap_slots", _whole),  # default None: the config's rule, as many host slots as the pool
    _engine("prefix_caching", _bool),
    Setting("workload", "explainer40", _workload),
    Setting("source", "scripted", _one_of(list(SOURCES))),
    _engine("seed", _whole),
]
BY_KEY = {s.key: s for s in SETTINGS}


def current(key: str):
    """The setting's value in this session (its default before the sidebar has run)."""
    return st.session_state.get(key, BY_KEY[key].default)


def engine_settings() -> dict:
    """The sidebar's EngineConfig fields, as keyword arguments."""
    return {k: current(k) for k in ENGINE_KEYS}


def _to_url(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _default_text(s: Setting) -> str:
    return "the pool size" if s.key == "swap_slots" and s.default is None else _to_url(s.default)


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
            except ValueError as exc:  # the config's own rules name the setting already
                reason = str(exc) if str(exc).startswith(f"{s.key} ") else f"{s.key}: {exc}"
                problems.append(f"URL parameter {reason}; using {_default_text(s)}")
    st.session_state["_settings_from_url_done"] = True
    st.session_state["_url_problems"] = problems
    return problems


def write_to_url() -> None:
    """Mirror the current settings into the query string (only those that differ from defaults)."""
    wanted = {s.key: _to_url(st.session_state[s.key]) for s in SETTINGS if st.session_state.get(s.key) != s.default}
    current_params = {k: st.query_params[k] for k in st.query_params}
    if wanted != {k: v for k, v in current_params.items() if k in BY_KEY}:
        for k in list(st.query_params):
            if k in BY_KEY:
                del st.query_params[k]
        for k, v in wanted.items():
            st.query_params[k] = v


def _top(spec: SettingSpec, step: float) -> float:
    """The highest value a slider may reach: the bound, or one step below it when it is open."""
    return round(spec.hi - step, 10) if spec.hi_open else spec.hi


@functools.lru_cache(maxsize=None)
def _workload_label(name: str) -> str:
    from pagedkv_core.workloads import build_workload

    return f"{name}: {build_workload(name).description}"


def sidebar() -> None:
    """Draw the engine settings. Every page reads them from st.session_state on its next run."""
    from pagedkv_core.workloads import WORKLOADS

    for problem in load_from_url():
        st.error(problem)
    pool, watermark, preemption = setting_spec("pool_slots"), setting_spec("watermark"), setting_spec("preemption")
    swap, seed = setting_spec("swap_slots"), setting_spec("seed")
    sb = st.sidebar
    sb.header("Engine settings")
    sb.select_slider("Block size (token slots per block)", options=BLOCK_SIZES, key="block_size",
                     help="Small blocks waste less of their last block; large blocks mean shorter block tables.")
    sb.number_input("Pool size (token slots)", min_value=pool.lo, max_value=pool.hi, step=256, key="pool_slots",
                    help="KV memory shared by all requests, counted in token slots. Both allocators get the same pool.")
    sb.slider("Watermark (share of the pool kept free)", min_value=watermark.lo,
              max_value=_top(watermark, WATERMARK_STEP), step=WATERMARK_STEP, key="watermark",
              help="Admissions may not dip into this reserve, so running sequences can always grow by a token.")
    sb.radio("Preemption", list(preemption.choices), key="preemption", horizontal=True,
             help="When the pool is full: recompute (drop the KV, re-prefill later) or swap (copy it to host memory).")
    sb.number_input("Swap pool (host token slots)", min_value=swap.lo, max_value=swap.hi, step=256, key="swap_slots",
                    placeholder=f"the pool size ({current('pool_slots'):,})", help=swap.help,
                    disabled=st.session_state.get("preemption") != "swap")
    sb.toggle("Prefix caching", key="prefix_caching",
              help="Reuse full blocks whose chained hash (parent hash + tokens) matches an earlier request's.")
    sb.selectbox("Workload", list(WORKLOADS), key="workload", format_func=_workload_label,
                 help="A seeded scenario of scripted requests (prompt length, answer length, arrival step).")
    sb.file_uploader("…or a workload file (.json)", type=["json"], key="workload_upload",
                     help='A JSON list of {"id", "prompt" or "prompt_len", "output_len", "max_tokens", "arrival_step", "n"}.')
    sb.radio("Token source", list(SOURCES), key="source", format_func=SOURCES.get,
             help="Scripted plays hundreds of steps instantly; SmolLM2 runs the real model and shows real text.")
    sb.number_input("Seed", min_value=seed.lo, max_value=seed.hi, step=1, key="seed")
    with sb.expander("Model and traces"):
        st.text_input("Model (blank = bundled SmolLM2-135M)", key="model_path",
                      help="A local Llama-family model directory or .gguf file.")
        st.file_uploader("Replay a trace (.jsonl)", type=["jsonl", "json"], key="trace_upload",
                         help="A trace downloaded from a page or written by `python -m pagedkv_core simulate --trace-out`.")
    write_to_url()
