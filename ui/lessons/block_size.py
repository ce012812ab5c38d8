"""Lesson 5, block size and pool sizing: a sweep of block sizes 1..128 on one workload (scripted,
instant) and a pool calculator from a model's architecture (the loaded SmolLM2's real config, or a
preset). The workloads, the sweep's numbers, the charts, the calculator and the guide's narration."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import ADMIT
from pagedkv_core.sizing.kv_math import KVShape, dtype_bytes, format_bytes
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import Workload, WorkloadRequest, parse_workload
from ui import export, presenter, settings
from ui.guide import GuideStep
from ui.lesson import Lesson
from ui.predict import Prediction, range_options
from ui.lesson_figures import lines
from ui.models import loaded_model, model_kv_shape
from ui.runs.scripted import MAX_SCRIPTED_STEPS
from ui.runs.sidebar import settings_config
from ui.settings import current_workload
from ui.settings import BLOCK_SIZES

KEY = "bsize"
GIB = 1 << 30
PREAMBLE_TOKENS = 600
SHORT_CHAT_REQUESTS, SHORT_PROMPT, SHORT_ANSWER = 40, (12, 40), (4, 40)  # requests; token ranges, inclusive


# ---------------------------------------------------------------------------- the sweep
def short_chat(seed: int = 0) -> Workload:
    """40 short chat turns at step 0: prompts of 12-40 tokens, answers of 4-40 tokens."""
    rng = np.random.default_rng([seed, 12])
    reqs = [{"id": f"c{i:02d}", "prompt_len": int(rng.integers(SHORT_PROMPT[0], SHORT_PROMPT[1] + 1)),
             "output_len": int(rng.integers(SHORT_ANSWER[0], SHORT_ANSWER[1] + 1)),
             "max_tokens": 64} for i in range(SHORT_CHAT_REQUESTS)]
    return parse_workload(reqs, name="short chat turns", seed=seed)


def preamble_workload(seed: int = 0) -> Workload:
    """A 600-token preamble, then four requests with their own 20-token questions, one per step."""
    rng = np.random.default_rng([seed, 600])
    pre = tuple(int(t) for t in rng.integers(3, 49152, size=PREAMBLE_TOKENS))
    reqs = tuple(WorkloadRequest(f"p{i}", pre + tuple(int(t) for t in rng.integers(3, 49152, size=20)), 8, 8,
                                 arrival_step=i) for i in range(5))
    return Workload("preamble", "5 requests sharing a 600-token preamble", reqs, 16384)


@dataclass(frozen=True)
class SweepPoint:
    block_size: int
    utilization: float  # mean over steps of filled / allocated slots
    waste_per_seq: float  # mean over steps of (allocated - filled) / sequences holding blocks
    entries_per_seq: float  # mean block-table entries per sequence
    reused_preamble: float  # preamble tokens a later request took from the prefix cache
    steps: int
    preemptions: int


@st.cache_resource(show_spinner=False, max_entries=16)
def sweep(config: EngineConfig, workload: Workload, seed: int) -> list[SweepPoint]:
    points = []
    pre = preamble_workload(seed)
    for b in BLOCK_SIZES:
        engine = Engine(EngineConfig(**{**config.to_dict(), "block_size": b}), ScriptedSource())
        workload.submit(engine)
        util, waste, entries = [], [], []
        steps = 0
        while engine.has_unfinished() and steps < MAX_SCRIPTED_STEPS:
            snap = engine.step()[1]
            steps += 1
            m = snap.metrics
            holding = int(np.count_nonzero(snap.seq_num_blocks))
            if m.allocated_slots and holding:
                util.append(m.token_utilization)
                waste.append((m.allocated_slots - m.filled_slots) / holding)
                entries.append(float(snap.seq_num_blocks[snap.seq_num_blocks > 0].mean()))
        # prefix granularity: a big pool, caching on, the same preamble for every request
        p_engine = Engine(EngineConfig(block_size=b, pool_slots=pre.pool_slots, prefix_caching=True), ScriptedSource())
        pre.submit(p_engine)
        hits = []
        while p_engine.has_unfinished():
            for e in p_engine.step()[1].events:
                if e.kind == ADMIT and e.request_id != "p0":
                    hits.append(int(e.detail["cached_tokens"]))
        points.append(SweepPoint(b, float(np.mean(util)) if util else 0.0, float(np.mean(waste)) if waste else 0.0,
                                 float(np.mean(entries)) if entries else 0.0, float(np.mean(hits)) if hits else 0.0,
                                 steps, engine.summary().preemptions))
    return points


SWEEP_CHARTS = ("util", "waste", "entries", "prefix")


def sweep_figure(points: list[SweepPoint], name: str, highlight: int, workload_name: str):
    """One chart of the sweep: ``util``, ``waste``, ``entries`` or ``prefix``."""
    xs = [p.block_size for p in points]
    axis = "block size (token slots per block)"
    if name == "util":
        return lines(xs, {"token utilization": [p.utilization for p in points]},
                     "Token utilization: filled / allocated slots", axis,
                     "utilization", colors={"token utilization": "#1d4ed8"}, percent=True, current_x=highlight, log_x=True)
    if name == "waste":
        half = "about half a block: (B − 1) / 2"
        return lines(xs, {"measured": [p.waste_per_seq for p in points], half: [(b - 1) / 2 for b in xs]},
                     "Waste per sequence: allocated but empty slots", axis, "empty slots per sequence",
                     colors={"measured": "#c2410c", half: "#6b7280"}, dash={half: "dash"}, current_x=highlight, log_x=True)
    if name == "entries":
        return lines(xs, {"block-table entries": [p.entries_per_seq for p in points]},
                     "Block-table entries per sequence (mean)", axis, "entries",
                     colors={"block-table entries": "#0f766e"}, current_x=highlight, log_x=True)
    if name == "prefix":
        fig = lines(xs, {"reused from the cache": [p.reused_preamble for p in points]},
                    f"Prefix sharing: preamble tokens reused (of {PREAMBLE_TOKENS})", axis,
                    "tokens per request", colors={"reused from the cache": "#7c3aed"},
                    hline=(PREAMBLE_TOKENS, f"the whole preamble: {PREAMBLE_TOKENS} tokens"), current_x=highlight,
                    log_x=True, point_labels={"reused from the cache": lambda v: f"{v:.0f}"})
        fig.update_yaxes(range=[0, PREAMBLE_TOKENS * 1.15])
        return fig
    raise ValueError(f"unknown sweep chart {name!r}: one of {', '.join(SWEEP_CHARTS)}")


def conceal(fig, what: str = "Answer the prediction above to see this chart."):
    """The chart's frame (axes, the highlighted block size) without its data: a prediction is open."""
    for trace in fig.data:
        trace.visible = False
    fig.update_layout(showlegend=False)
    fig.add_annotation(text=what, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#6b7280"))
    return fig


def sweep_charts(points: list[SweepPoint], highlight: int, workload_name: str, hidden=()) -> None:
    """The four charts (``hidden``: names of charts drawn without their data) and the table."""
    for row in (SWEEP_CHARTS[:2], SWEEP_CHARTS[2:]):
        for col, name in zip(st.columns(2), row):
            fig = sweep_figure(points, name, highlight, workload_name)
            if name in hidden:
                conceal(fig)
            col.plotly_chart(fig, width="stretch", key=f"{KEY}_{name}", config=export.png_config(f"{KEY}-{name}"))
    if hidden:
        return  # the table would give the answer away
    rows = [{"block size": p.block_size, "token utilization": f"{p.utilization:.1%}",
             "empty slots per sequence": f"{p.waste_per_seq:.1f}", "(B − 1) / 2": (p.block_size - 1) / 2,
             "block-table entries per sequence": f"{p.entries_per_seq:.1f}",
             f"preamble tokens reused (of {PREAMBLE_TOKENS})": int(round(p.reused_preamble)),
             "steps": p.steps, "preemptions": p.preemptions} for p in points]
    with st.expander("The sweep as a table"):
        st.dataframe(rows, hide_index=True, width="stretch")


# ---------------------------------------------------------------------------- the calculator
@dataclass(frozen=True)
class Preset:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    params_b: float  # billions of parameters
    dtype: str
    budget_gib: float
    workspace_gib: float
    avg_len: int
    note: str = ""


STATIC_PRESETS = [
    Preset("Llama 3 8B", 32, 32, 8, 128, 8.03, "bf16", 80.0, 4.0, 2048, "one 80 GiB GPU"),
    Preset("Llama 3 70B", 80, 64, 8, 128, 70.6, "bf16", 160.0, 8.0, 2048, "two 80 GiB GPUs"),
    Preset("Qwen2.5-0.5B", 24, 14, 2, 64, 0.494, "bf16", 8.0, 1.0, 1024, "an 8 GiB GPU"),
]
DTYPES = ["fp32", "bf16", "fp16", "fp8"]
FIELDS = ("layers", "heads", "kv_heads", "head_dim", "params_b", "dtype", "budget_gib", "workspace_gib", "avg_len")


def smollm2_preset() -> Preset | None:
    lm = loaded_model()
    if lm is None:
        return None
    shape = model_kv_shape(lm)
    params = lm.num_parameters / 1e9
    return Preset(f"{lm.name} (loaded, from its config)", shape.num_layers, shape.num_heads or shape.num_kv_heads,
                  shape.num_kv_heads, shape.head_dim, round(params, 4), "fp32", 4.0, 0.5, 512, "this CPU, fp32")


def presets() -> dict[str, Preset]:
    out = {}
    sm = smollm2_preset()
    if sm is not None:
        out[sm.name] = sm
    for p in STATIC_PRESETS:
        out[p.name] = p
    return out


def load_preset(p: Preset) -> None:
    for f in FIELDS:
        st.session_state[f"{KEY}_{f}"] = getattr(p, f)


def calculator(all_presets: dict[str, Preset], block_size: int, fixed: Preset | None = None, *,
               compact: bool = False) -> None:
    """Inputs (or a fixed preset in guide mode) and the arithmetic, with the numbers filled in;
    ``compact`` (a slide): the numbers without the table of formulas."""
    if fixed is not None:
        v = {f: getattr(fixed, f) for f in FIELDS}
        st.markdown(f"**{fixed.name}** ({fixed.note})")
    else:
        names = list(all_presets)
        if f"{KEY}_preset" not in st.session_state or st.session_state[f"{KEY}_preset"] not in names:
            st.session_state[f"{KEY}_preset"] = names[0]
            load_preset(all_presets[names[0]])
        st.selectbox("Preset", names, key=f"{KEY}_preset",
                     on_change=lambda: load_preset(all_presets[st.session_state[f"{KEY}_preset"]]),
                     help="Fills the fields below; change any of them afterwards.")
        c = st.columns(5)
        c[0].number_input("layers", 1, 1000, key=f"{KEY}_layers")
        c[1].number_input("query heads", 1, 1024, key=f"{KEY}_heads")
        c[2].number_input("KV heads", 1, 1024, key=f"{KEY}_kv_heads",
                          help="Grouped-query attention: several query heads share one KV head.")
        c[3].number_input("head dimension", 1, 4096, key=f"{KEY}_head_dim")
        c[4].selectbox("element type", DTYPES, key=f"{KEY}_dtype")
        c = st.columns(4)
        c[0].number_input("parameters (billions)", 0.0, 10000.0, key=f"{KEY}_params_b", format="%.3f", step=0.1,
                          help="Weights take parameters × bytes per element.")
        c[1].number_input("memory budget (GiB)", 0.0, 100000.0, key=f"{KEY}_budget_gib", step=1.0,
                          help="The device memory this server may use.")
        c[2].number_input("activation workspace (GiB)", 0.0, 100000.0, key=f"{KEY}_workspace_gib", step=0.5,
                          help="Peak memory of the forward pass itself; vLLM measures it with a profiling run.")
        c[3].number_input("average sequence length (tokens)", 1, 10_000_000, key=f"{KEY}_avg_len", step=128,
                          help="Prompt + answer, on average.")
        v = {f: st.session_state[f"{KEY}_{f}"] for f in FIELDS}
    if v["kv_heads"] > v["heads"]:
        st.error(f"KV heads ({v['kv_heads']}) cannot exceed query heads ({v['heads']}).")
        return
    eb = dtype_bytes(v["dtype"])
    shape = KVShape("calc", int(v["layers"]), int(v["kv_heads"]), int(v["head_dim"]), int(v["heads"]))
    per_token = shape.bytes_per_token(v["dtype"])
    per_block = shape.bytes_per_block(block_size, v["dtype"])
    weights = v["params_b"] * 1e9 * eb
    budget = v["budget_gib"] * GIB
    workspace = v["workspace_gib"] * GIB
    kv_bytes = budget - weights - workspace
    if kv_bytes <= 0:
        st.error(f"No room for a KV cache: weights ({format_bytes(weights)}) plus workspace ({format_bytes(workspace)}) "
                 f"take {format_bytes(weights + workspace)} of the {format_bytes(budget)} budget.")
        return
    blocks = int(kv_bytes // per_block)
    per_seq = math.ceil(v["avg_len"] / block_size)
    concurrency = blocks // per_seq
    c = st.columns(5)
    c[0].metric("bytes per token", format_bytes(per_token))
    c[1].metric(f"bytes per block of {block_size}", format_bytes(per_block))
    c[2].metric("KV blocks in the pool", f"{blocks:,}")
    c[3].metric("tokens in the pool", f"{blocks * block_size:,}")
    c[4].metric("sequences at once", f"{concurrency:,}", help=f"blocks / ⌈{v['avg_len']} / {block_size}⌉ blocks per sequence")
    preset = fixed.name if fixed is not None else st.session_state.get(f"{KEY}_preset", "the calculator")
    if not presenter.on(KEY):  # a slide has no sidebar to use it in, and needs the room to end on the screen
        pool = settings.rounded_pool(blocks * block_size, int(settings.current("block_size")))
        st.button(f"Use this pool in the sidebar ({pool:,} slots)",
                  key=f"{KEY}_use_pool", on_click=settings.use_pool, args=(blocks * block_size, f"{preset} in the calculator"))
        st.caption("Sets the sidebar's pool size to this pool, rounded down to whole blocks of the sidebar's block size "
                   "(and within the sidebar's largest pool), so every page runs on it.")
    if compact:
        st.markdown(f"2 (K and V) × {v['layers']} layers × {v['kv_heads']} KV heads × {v['head_dim']} × {eb} B = "
                    f"**{per_token:,} B per token**; {format_bytes(kv_bytes)} left for KV after the weights and the "
                    f"workspace hold **{blocks:,} blocks of {block_size}**.")
    else:
        st.markdown(
            f"""
| quantity | formula | here |
| --- | --- | --- |
| bytes per token | 2 (K and V) × layers × KV heads × head dim × bytes per element | 2 × {v['layers']} × {v['kv_heads']} × {v['head_dim']} × {eb} = **{per_token:,} B** ({format_bytes(per_token)}) |
| bytes per block | bytes per token × block size | {per_token:,} × {block_size} = **{per_block:,} B** ({format_bytes(per_block)}) |
| weights | parameters × bytes per element | {v['params_b']:g} × 10⁹ × {eb} = {format_bytes(weights)} |
| memory for KV | budget − weights − activation workspace | {format_bytes(budget)} − {format_bytes(weights)} − {format_bytes(workspace)} = {format_bytes(kv_bytes)} |
| blocks | memory for KV / bytes per block | **{blocks:,}** blocks = {blocks * block_size:,} token slots |
| concurrency | blocks / average blocks per sequence | {blocks:,} / ⌈{v['avg_len']} / {block_size}⌉ = {blocks:,} / {per_seq:,} = **{concurrency:,}** sequences |
"""
        )
    ratio = v["heads"] // v["kv_heads"] if v["kv_heads"] else 1
    if ratio > 1:
        mha = per_token * v["heads"] // v["kv_heads"]
        mha_blocks = int(kv_bytes // (mha * block_size))
        st.markdown(
            f"**Grouped-query attention.** {v['heads']} query heads share {v['kv_heads']} KV heads ({ratio} per KV head). "
            f"Without GQA (one KV head per query head) a token would cost {format_bytes(mha)} instead of "
            f"{format_bytes(per_token)}. GQA divides the bytes per token and per block by {ratio} and multiplies the blocks "
            f"and the sequences that fit by {ratio}: {blocks:,} blocks instead of {mha_blocks:,}, "
            f"{concurrency:,} sequences at once instead of {mha_blocks // per_seq:,}."
        )
    else:
        st.markdown("**Grouped-query attention.** This model has as many KV heads as query heads (plain multi-head "
                    "attention); with grouped-query attention every term above would shrink by the group size.")


def sweep_settings(guided: bool) -> tuple[EngineConfig, Workload, int]:
    """(config, workload, seed) of the sweep: the engine's defaults on short chat turns in guide
    mode; else the sidebar's settings on the workload picked here (st.error and stop when invalid)."""
    if guided:
        return EngineConfig(), short_chat(0), 0
    seed = int(settings.current("seed"))
    choice = st.radio("Workload for the sweep", ["short chat turns", "the sidebar's workload"], horizontal=True,
                      key=f"{KEY}_workload", help=f"Short chat turns: {SHORT_CHAT_REQUESTS} requests at once, prompts "
                      f"of {SHORT_PROMPT[0]}-{SHORT_PROMPT[1]} tokens and answers of {SHORT_ANSWER[0]}-{SHORT_ANSWER[1]} "
                      "tokens. The sidebar's workload: whatever is selected there.")
    try:
        config = settings_config("paged")
        workload = short_chat(seed) if choice == "short chat turns" else current_workload()
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    return config, workload, seed


# ---------------------------------------------------------------------------- guide
UTILIZATION_RANGES = [("under 40%", 0.4), ("40% to 60%", 0.6), ("60% to 80%", 0.8), ("over 80%", float("inf"))]


def guide_steps(points: list[SweepPoint], all_presets: dict[str, Preset], workload: Workload | None = None) -> list[GuideStep]:
    """The walkthrough: block sizes read off the sweep, then the calculator on two presets. ``show``:
    the block size to highlight, the preset, the charts drawn without data while a prediction is
    open (``hide``) and the slide's figure (``figure``: a sweep chart or ``calc``)."""
    by_size = {p.block_size: p for p in points}
    p1, p16, p128 = by_size[1], by_size[16], by_size[128]
    p64 = by_size[64]
    l70 = next(p for p in STATIC_PRESETS if p.name == "Llama 3 70B")
    sm = next(iter(all_presets.values()))
    l70_kib = KVShape("l70", l70.layers, l70.kv_heads, l70.head_dim, l70.heads).bytes_per_token(l70.dtype) / 1024
    elem = l70_kib * 1024 / (2 * l70.layers * l70.kv_heads * l70.head_dim)  # bytes per element of its dtype
    mha = l70.heads / l70.kv_heads  # a KV head per query head: this many times more
    wl = workload if workload is not None else short_chat(0)
    prompts = [len(r.prompt) for r in wl.requests]
    answers = [r.output_len for r in wl.requests]
    cfg = EngineConfig()
    return [
        GuideStep("Blocks of 16", f"{len(wl.requests)} short chat turns at once. With blocks of 16 (vLLM's default), "
                  f"{p16.utilization:.0%} of the allocated slots hold a token: the rest is the unfilled end of each "
                  f"sequence's last block. (The guide sweeps its own workload on a {cfg.pool_slots:,}-slot pool, "
                  "whatever the sidebar says.)", {"block_size": 16, "preset": sm.name, "figure": "util"}),
        GuideStep("Blocks of 1", f"Blocks of 1 waste nothing ({p1.utilization:.0%} utilization), but every token is a "
                  f"block-table entry: {p1.entries_per_seq:.0f} entries per sequence, and attention gathers K/V one slot "
                  "at a time.", {"block_size": 1, "preset": sm.name, "figure": "entries"}),
        GuideStep("Blocks of 128", f"Now blocks of 128. These chat turns are short: prompts of {min(prompts)}-{max(prompts)} "
                  f"tokens and answers of {min(answers)}-{max(answers)}, so "
                  f"{sum(p + a < 128 for p, a in zip(prompts, answers))} of the {len(prompts)} sequences hold fewer than "
                  "128 tokens.",
                  {"block_size": 128, "preset": sm.name, "figure": "util", "hide": ("util",)},
                  predict=Prediction(
                      "bsize_utilization_128", "Predict: with blocks of 128, what share of the allocated slots will "
                      "hold a token?", why=f"A short request fills a fraction of its only block and the rest of the "
                      f"block is reserved for it, useless to anyone else: {p128.utilization:.0%} at 128, against "
                      f"{p16.utilization:.0%} at 16.", **range_options(p128.utilization, UTILIZATION_RANGES)),
                  reveal={"hide": ()}),
        GuideStep("About half a block", f"Measured waste per sequence follows the dashed line (B − 1) / 2 while blocks "
                  f"are small next to the sequences: a last block is on average half full ({p16.waste_per_seq:.1f} empty slots "
                  f"at 16). At 128 it is {p128.waste_per_seq:.0f}, more than half a block: these short requests do not fill "
                  "even one.", {"block_size": 128, "preset": sm.name, "figure": "waste"}),
        GuideStep("Sharing in whole blocks", f"{len(preamble_workload().requests)} requests share a "
                  f"{PREAMBLE_TOKENS}-token preamble, each followed by "
                  "its own question. The prefix cache finds a block by the hash of its tokens and of everything before "
                  "it.", {"block_size": 64, "preset": sm.name, "figure": "prefix", "hide": ("prefix",)},
                  predict=Prediction(
                      "bsize_prefix_64", f"Predict: with blocks of 64, how many of the {PREAMBLE_TOKENS} preamble tokens "
                      "will a later request take from the cache?", round(p64.reused_preamble),
                      f"Only whole blocks are shared: ⌊{PREAMBLE_TOKENS} / 64⌋ = {PREAMBLE_TOKENS // 64} full blocks = "
                      f"{round(p64.reused_preamble)} tokens; the last {PREAMBLE_TOKENS - round(p64.reused_preamble)} "
                      f"share a block with the question and are computed again (at 16: {p16.reused_preamble:.0f}, at "
                      f"128: {p128.reused_preamble:.0f}).", unit="tokens"),
                  reveal={"hide": ()}),
        GuideStep("Sizing a pool", f"The calculator: {sm.name.split(' (')[0]}'s own config gives the bytes per token; the "
                  "pool gets what the memory budget leaves after the weights and the activation workspace.",
                  {"block_size": 16, "preset": sm.name, "figure": "calc"}),
        GuideStep("Llama 3 70B", f"Llama 3 70B has {l70.layers} layers and {l70.kv_heads} KV heads of dimension "
                  f"{l70.head_dim}, stored in {l70.dtype} ({elem:g} bytes per element). A token's KV bytes = "
                  "2 (K and V) × layers × KV heads × head dimension × bytes per element.",
                  {"block_size": 16, "preset": sm.name, "figure": "calc"},
                  predict=Prediction(
                      "bsize_l70_bytes", "Predict: how many KiB of KV cache does one token of Llama 3 70B take?",
                      round(l70_kib, 1), f"2 (K and V) × {l70.layers} × {l70.kv_heads} × {l70.head_dim} × {elem:g} B = "
                      f"{l70_kib * 1024:,.0f} B = {l70_kib:g} KiB per token slot. On {l70.note} the weights take most "
                      "of the memory; what is left holds the blocks below.", tolerance=4, unit="KiB",
                      source="Computed from its config"),
                  reveal={"preset": l70.name}),
        GuideStep("Grouped-query attention", f"Llama 3 70B has {l70.heads} query heads but only {l70.kv_heads} KV heads. "
                  f"With a KV head per query head every term would be {mha:g}× larger: {l70_kib * mha / 1024:g} MiB per "
                  f"token, and {mha:g}× fewer sequences at once.",
                  {"block_size": 16, "preset": l70.name, "figure": "calc"}),
    ]


def slide(points: list[SweepPoint], all_presets: dict[str, Preset], show: dict, workload_name: str) -> None:
    """Presenter mode: the step's one chart of the sweep, or the calculator's numbers."""
    which = show.get("figure", "util")
    highlight = int(show["block_size"])
    if which == "calc":
        fixed = all_presets.get(show["preset"]) or next(iter(all_presets.values()))
        calculator(all_presets, highlight, fixed=fixed, compact=True)
        return
    fig = sweep_figure(points, which, highlight, workload_name)
    if which in show.get("hide", ()):
        conceal(fig)
    presenter.slide(fig, KEY)


# ---------------------------------------------------------------------------- the page
@dataclass(frozen=True)
class Sweep:
    """What the page draws: the sweep of ``workload`` under ``config``, and the calculator's presets."""
    config: EngineConfig
    workload: Workload
    seed: int
    points: list[SweepPoint]
    presets: dict[str, Preset]


def scenario(guided: bool) -> Sweep:
    """The sweep: the engine's defaults on short chat turns in guide mode, else the sidebar's settings."""
    all_presets = presets()
    config, workload, seed = sweep_settings(guided)
    with st.spinner(f"Running the workload at {len(BLOCK_SIZES)} block sizes…"):
        points = sweep(config, workload, seed)
    return Sweep(config, workload, seed, points, all_presets)


def lesson_steps(s: Sweep) -> list[GuideStep]:
    return guide_steps(s.points, s.presets)


def lesson_slide(s: Sweep, show: dict) -> None:
    slide(s.points, s.presets, show, s.workload.name)


def guide_view(s: Sweep, show: dict) -> None:
    """A guide step: the sweep with the step's block size marked (charts it asks about hidden), and
    the calculator on the step's preset."""
    highlight = int(show["block_size"])
    fixed = s.presets.get(show["preset"]) or next(iter(s.presets.values()))
    draw(s, highlight, fixed, show.get("hide", ()), guided=True)


def explore(s: Sweep) -> None:
    """Free play: the sidebar's block size marked, the calculator's model picked here."""
    draw(s, int(s.config.block_size), None, (), guided=False)


def draw(s: Sweep, highlight: int, fixed: Preset | None, hidden, *, guided: bool) -> None:
    """The sweep's charts with ``highlight`` marked, and the pool calculator at that block size."""
    config, workload = s.config, s.workload
    st.header(f"One workload, {len(BLOCK_SIZES)} block sizes")
    if guided:
        st.caption(f"Guide mode: {SHORT_CHAT_REQUESTS} short chat turns, a {config.pool_slots:,}-slot pool, the "
                   "engine's default settings, whatever the sidebar says.")
    else:
        st.caption(f"Workload: {workload.name} ({len(workload.requests)} requests). Other settings from the sidebar "
                   f"({config.pool_slots:,} slots, watermark {config.watermark:.0%}, {config.preemption}). The dotted "
                   f"line marks the sidebar's block size, {config.block_size}.")
    sweep_charts(s.points, highlight, workload.name, hidden)
    st.caption("Token utilization and waste are averaged over the steps in which anything was allocated. The prefix "
               f"chart runs a separate small workload: {len(preamble_workload().requests)} requests sharing a "
               f"{PREAMBLE_TOKENS}-token preamble, each with "
               "its own question; it counts the tokens each later request took from the prefix cache.")

    st.header("Pool calculator")
    st.markdown("How many blocks fit, and how many sequences run at once? Block size: "
                f"**{highlight}** ({'this guide step' if guided else 'the sidebar'}).")
    calculator(s.presets, highlight, fixed=fixed)


LESSON = Lesson(key=KEY, title="Block size and pool sizing", scenario=scenario, guide_steps=lesson_steps,
                guide_view=guide_view, slide=lesson_slide, explore=explore)
