"""The shared sidebar: engine settings kept across pages, mirrored in the URL so a link opens the
exact scenario. Bad values in the URL are reported with st.error and replaced by defaults.

Every engine setting's default and bounds come from its rule in :mod:`pagedkv_core.config`
(``setting_spec``), so the sidebar, the CLI and ``EngineConfig`` itself cannot drift apart.

The query string also carries the pages' own parameters (``guide``, ``guide_step``, ``present``,
``speed``, read by :mod:`ui.guide`, :mod:`ui.presenter` and :mod:`ui.player`);
:func:`check_page_params` checks them on every run, before the page reads them, and drops a bad
one after saying so. The *Model and traces* expander follows :mod:`ui.workshop`'s rule: a
free-form model path only on a loopback server outside workshop mode, else a select box of the
models the server offers.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from pagedkv_core.config import ConfigError, SettingSpec, setting_spec
from pagedkv_core.workloads.hashed_log import FIELDS as HASHED_LOG_FIELDS, HASH_BLOCK
from pagedkv_core.workloads.scenarios import DEFAULT_SECONDS_PER_STEP, LOG_COLUMNS, MAX_BUILT_LOG_REQUESTS, Workload
from ui import player, sessions, workshop
from ui.runs.scripted import named_workload
from ui.runs.session import uploaded_workload

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


def _policy(text: str) -> str:
    from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES

    return _one_of(list(CONTIGUOUS_POLICIES))(text)


def _workload(text: str) -> str:
    from pagedkv_core.workloads.scenarios import WORKLOADS

    return _one_of(list(WORKLOADS))(text)


SETTINGS = [
    _engine("block_size", _whole, BLOCK_SIZES),
    _engine("pool_slots", _whole),
    _engine("watermark", _number),
    _engine("preemption", str),
    _engine("swap_slots", _whole),  # default None: the config's rule, as many host slots as the pool
    _engine("prefix_caching", _bool),
    Setting("contiguous_policy", "max", _policy),  # which contiguous baseline runs beside paged
    Setting("workload", "explainer40", _workload),
    Setting("source", "scripted", _one_of(list(SOURCES))),
    Setting("dtype", "float32", _one_of(["float32", "bfloat16"])),  # the CPU model's precision (ui.models.runner_dtype)
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


# The pages' own query parameters: name -> (check raising ValueError, what happens without it).
PAGE_PARAMS = {
    "guide": (lambda text: _bool(text), "the guide stays off"),
    "present": (lambda text: _bool(text), "presenter mode stays off"),
    "guide_step": (lambda text: _step_number(text), "the guide opens at its first step"),
    "speed": (lambda text: player.parse_speed(text), f"Play starts at {player.DEFAULT_SPEED} steps/s"),
}


def _step_number(text: str) -> int:
    """A guide step from the URL: ASCII digits only (``"²".isdigit()`` is True, ``int("²")``
    fails), at least 1, and short enough to be a step."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or int(text) < 1:
        raise ValueError(f"must be a whole number from 1, got {text!r}")
    return int(text)


def check_page_params() -> list[str]:
    """Drop the pages' query parameters that do not parse (every run: a page reads them on its
    first run, and a link may switch pages). Returns the problems found."""
    problems = []
    for name, (check, fallback) in PAGE_PARAMS.items():
        if name not in st.query_params:
            continue
        try:
            check(st.query_params[name])
        except ValueError as exc:
            problems.append(f"URL parameter {name}: {exc}; {fallback}")
            del st.query_params[name]
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
    """``name: the description's first clause`` (the select box's line; the whole description
    is the caption under it)."""
    from pagedkv_core.workloads.scenarios import workload_description

    return f"{name}: {re.split(r'[:;]', workload_description(name), maxsplit=1)[0]}"


POLICY_LABELS = {
    "max": "Orca Max: reserve max_tokens",
    "pow2": "Orca Pow2: the answer, rounded up to a power of two",
    "oracle": "Orca Oracle: exactly the answer",
}
# The options of a request-log upload (pagedkv_core.workloads.scenarios.LogOptions), shown when one is uploaded.
CSV_DEFAULTS = {"csv_start": 0, "csv_count": 200, "csv_seconds_per_step": DEFAULT_SECONDS_PER_STEP, "csv_rate": 1.0}
# A hashed log's (.jsonl) length scales: each keeps a 512-token hash block a whole number of tokens.
HASH_SCALES = {"1": 1.0, "1/2": 0.5, "1/4": 0.25, "1/8": 0.125, "1/16": 0.0625, "1/32": 0.03125}


def is_request_log(file_name: str) -> bool:
    """Whether an uploaded workload is a request log (a CSV, gzipped CSV, or a hashed log's JSON
    lines) rather than a JSON list of requests."""
    from pagedkv_core.workloads.scenarios import is_request_log_name

    return is_request_log_name(file_name)


def is_hashed_log(file_name: str) -> bool:
    lower = file_name.lower()
    return lower.endswith(".jsonl") or lower.endswith(".jsonl.gz")


def csv_options() -> dict:
    """The sidebar's options for a request-log upload, as ``workload_from_bytes`` keywords."""
    get = {k: st.session_state.get(k, v) for k, v in CSV_DEFAULTS.items()}
    options = {"start": int(get["csv_start"]), "count": int(get["csv_count"]),
               "seconds_per_step": float(get["csv_seconds_per_step"]), "rate": float(get["csv_rate"])}
    upload = st.session_state.get("workload_upload")
    if upload is not None and is_hashed_log(upload.name):
        options["length_scale"] = HASH_SCALES[st.session_state.get("hash_length_scale", "1")]
    return options


def current_workload() -> Workload:
    """The sidebar's workload: a named scenario, or the uploaded workload file (JSON, or a request
    log with the sidebar's row and time-scale options), parsed once per session
    (:func:`ui.runs.session.uploaded_workload`). Raises ConfigError."""
    upload = st.session_state.get("workload_upload")
    seed = int(current("seed"))
    if upload is None:
        return named_workload(current("workload"), seed)
    return uploaded_workload(upload, seed, csv_options() if is_request_log(upload.name) else {})


def rounded_pool(slots: int, block_size: int) -> int:
    """``slots`` rounded down to whole blocks of ``block_size``, within the pool's bounds."""
    spec = setting_spec("pool_slots")
    top = spec.hi // block_size * block_size
    low = -(-max(spec.lo, block_size) // block_size) * block_size
    return max(low, min(top, int(slots) // block_size * block_size))


def use_pool(slots: int, source: str = "") -> int:
    """Set the sidebar's pool to ``slots`` rounded down to whole blocks of the sidebar's block
    size (and within the pool's bounds); the sidebar says so on its next run. Call it from a
    button's ``on_click``, before the sidebar's widgets are drawn. Returns the pool set."""
    block_size = int(current("block_size"))
    pool = rounded_pool(slots, block_size)
    st.session_state["pool_slots"] = pool
    capped = " (the most the sidebar allows)" if pool < int(slots) // block_size * block_size else ""
    st.session_state["_pool_notice"] = (f"Pool set to {pool:,} token slots{capped}: {pool // block_size:,} blocks of "
                                        f"{block_size}" + (f", from {source}" if source else "") + ".")
    return pool


def sidebar() -> None:
    """Draw the engine settings. Every page reads them from st.session_state on its next run."""
    from pagedkv_core.workloads.scenarios import WORKLOADS

    for problem in load_from_url() + check_page_params():
        st.error(problem)
    if st.session_state.get("source") == "model" and not sessions.claim_model_seat():
        st.session_state["source"] = "scripted"  # before the radio is drawn: the widget shows it
    pool, watermark, preemption = setting_spec("pool_slots"), setting_spec("watermark"), setting_spec("preemption")
    swap, seed = setting_spec("swap_slots"), setting_spec("seed")
    sb = st.sidebar
    sb.header("Engine settings")
    sb.select_slider("Block size (token slots per block)", options=BLOCK_SIZES, key="block_size",
                     help="Small blocks waste less of their last block; large blocks mean shorter block tables.")
    sb.number_input("Pool size (token slots)", min_value=pool.lo, max_value=pool.hi, step=256, key="pool_slots",
                    help="KV memory shared by all requests, counted in token slots. Both allocators get the same pool. "
                         f"Up to {pool.hi:,}: a large GPU's pool (Llama 3 8B in fp16 on one 80 GB GPU holds about 450k).")
    notice = st.session_state.pop("_pool_notice", None)
    if notice:
        sb.success(notice)
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
    sb.radio("Contiguous policy", list(POLICY_LABELS), key="contiguous_policy", format_func=POLICY_LABELS.get,
             help="What the contiguous side reserves beyond the prompt: the vLLM paper's three Orca baselines "
                  "(Kwon et al., SOSP 2023, section 6.1). Pow2 and Oracle know each answer's length in advance, "
                  "which no real server does.")
    sb.selectbox("Workload", list(WORKLOADS), key="workload", format_func=_workload_label,
                 help="A seeded scenario of scripted requests (prompt length, answer length, arrival step).")
    upload = st.session_state.get("workload_upload")
    if upload is None:
        from pagedkv_core.workloads.scenarios import workload_description

        sb.caption(workload_description(current("workload")))
        if current("source") == "model":  # the real model runs real prompts instead (ui.runs.live)
            from ui.runs.live import live_workload_note

            sb.caption(live_workload_note(str(current("workload"))))
    sb.file_uploader("…or a workload file (.json, .csv or .jsonl)", type=["json", "csv", "gz", "jsonl"],
                     key="workload_upload", max_upload_size=workshop.upload_cap_mb(),
                     help='A JSON list of {"id", "prompt" or "prompt_len", "output_len", "max_tokens", "arrival_step", "n"}, '
                          f"or a request log: a CSV (or .csv.gz) with the columns {', '.join(LOG_COLUMNS[:-1])} and "
                          f"{LOG_COLUMNS[-1]}, one request per row (Azure's LLM inference traces have them), or JSON lines "
                          '(.jsonl) of {"' + '", "'.join(HASHED_LOG_FIELDS) + '"}, one request per line '
                          f"with a hash id per {HASH_BLOCK}-token prompt block (Mooncake's traces have them; equal ids share a prefix).")
    if upload is not None:
        report_rejections(sb)
    if upload is not None and is_request_log(upload.name):
        for k, v in CSV_DEFAULTS.items():
            st.session_state.setdefault(k, v)
        c = sb.columns(2)
        c[0].number_input("Skip rows", min_value=0, step=100, key="csv_start", help="Rows of the request log to skip first.")
        c[1].number_input("Requests", min_value=1, max_value=MAX_BUILT_LOG_REQUESTS, step=50, key="csv_count",
                          help="How many rows after the skipped ones become requests.")
        c = sb.columns(2)
        c[0].number_input("Log seconds per step", min_value=0.001, max_value=3600.0, step=0.01, format="%.3f",
                          key="csv_seconds_per_step", help="How much of the log's time one engine step stands for.")
        c[1].number_input("Rate multiplier", min_value=0.01, max_value=1000.0, step=0.5, key="csv_rate",
                          help="2 = the requests arrive twice as densely as in the log.")
        if is_hashed_log(upload.name):
            sb.select_slider("Length scale", options=list(HASH_SCALES), key="hash_length_scale",
                             help=f"Scale every length: a {HASH_BLOCK}-token hash block becomes {HASH_BLOCK} x this many tokens, which "
                                  "the block size must divide (1/16: 32-token blocks).")
    sb.radio("Token source", list(SOURCES), key="source", format_func=SOURCES.get,
             help="Scripted plays hundreds of steps instantly; SmolLM2 runs the real model and shows real text.")
    from ui.models import DTYPES, bf16_offered

    if bf16_offered():  # only where the CPU computes bf16 natively (AVX512-BF16 or AMX)
        sb.radio("Model precision", DTYPES, key="dtype", horizontal=True,
                 help="bfloat16 halves each token's KV bytes and runs SmolLM2's matmuls at this CPU's bf16 rate; "
                      "its text may part from float32's after some tokens. float32 matches transformers token for token.")
    sb.number_input("Seed", min_value=seed.lo, max_value=seed.hi, step=1, key="seed")
    with sb.expander("Model and traces"):
        model_box()
        st.file_uploader("Replay a trace (.trace, or an older .jsonl)", type=["trace", "jsonl", "json"],
                         key="trace_upload",
                         max_upload_size=workshop.upload_cap_mb(),
                         help="A trace downloaded from a page or written by `python -m pagedkv_core simulate --trace-out`.")
    write_to_url()


def model_box() -> None:
    """The model to load: a free-form path on a loopback server outside workshop mode; else a
    select box of the bundled model and PAGEDKV_MODEL_DIR's models (see :mod:`ui.workshop`), and
    a ``model_path`` in the session that is not one of them falls back to the bundled model."""
    if workshop.free_model_paths(st.get_option("server.address")):
        st.text_input("Model (blank = bundled SmolLM2-135M)", key="model_path",
                      help="A local Llama-family model directory or .gguf file.")
        return
    choices = workshop.model_choices()
    if st.session_state.get("model_path", "") not in choices:
        st.session_state["model_path"] = ""
    folder = workshop.model_dir()
    st.selectbox("Model", list(choices), key="model_path", format_func=choices.get,
                 help="The models this server offers: the bundled SmolLM2"
                      + (f" and those in {folder.name}/ ({workshop.ENV_MODEL_DIR})." if folder else
                         f"; more can be offered in a folder named by {workshop.ENV_MODEL_DIR}."))


MAX_REJECTIONS_SHOWN = 3


def report_rejections(where) -> None:
    """A warning under the workload uploader when requests of the uploaded file are rejected
    (each for its own reason, while the others run). A file-level error is the page's to show."""
    try:
        workload = current_workload()
    except ConfigError:
        return
    rejected = [r for r in workload.requests if r.reject_reason is not None]
    if not rejected:
        return
    shown = "; ".join(f"{r.id!r}: {r.reject_reason}" for r in rejected[:MAX_REJECTIONS_SHOWN])
    more = f"; and {len(rejected) - MAX_REJECTIONS_SHOWN:,} more" if len(rejected) > MAX_REJECTIONS_SHOWN else ""
    count = (f"Every request in {workload.name} is rejected" if len(rejected) == len(workload.requests) else
             f"{len(rejected):,} of {len(workload.requests):,} requests in {workload.name} are rejected (the others run)")
    where.warning(f"{count}: {shown}{more}.")
