"""Real traffic: the vLLM paper's baselines. The same requests (by default 200 of Azure's
production conversation requests, lengths at 1/8 scale) on the paper's three contiguous Orca
baselines and on paged blocks: the four pools at one shared step, the memory-waste breakdown
measured on each (the paper's Figure 2) beside the paper's published token shares, and what
differs between their measurement and ours.

Every number on the page is measured from the four runs (scripted tokens, so they are instant and
exact); only :data:`PAPER_TOKEN_SHARE` is quoted."""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st

from pagedkv_core.config import ConfigError
from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES
from pagedkv_core.record.waste import CLASSES
from pagedkv_core.workloads.scenarios import Workload
from ui import export, guide, pool_view, predict, presenter, settings
from ui.predict import Prediction
from ui.figures import step_curves
from ui.pool_cells import LEGEND, SLIDE_LEGEND, snapshot_heatmap
from ui.lesson import Export, Lesson
from ui.runs.model import BASELINE_LABELS, RESERVES, Run
from ui.runs.scripted import named_workload, scripted_runs
from ui.runs.session import report_stops
from ui.settings import current_workload
from ui.live_chart import show_chart

KEY = "base"
GUIDE_SEED = 0
GUIDE_HELP = ("A fixed walkthrough of the default requests (200 of Azure's conversation requests, the log's "
              "4,096-slot pool, blocks of 16, the engine's default settings, seed 0), whatever the sidebar says.")
ALLOCATORS = (*CONTIGUOUS_POLICIES.values(), "paged")  # Orca Max, Pow2, Oracle, then vLLM's paging
DEFAULT_WORKLOAD = "azure-conv-small"
# Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
# SOSP 2023, Figure 2: the share of the KV memory in use that holds token states.
PAPER_TOKEN_SHARE = {"contiguous": 0.204, "contiguous-pow2": 0.268, "contiguous-oracle": 0.382, "paged": 0.963}
PAPER = "Kwon et al., SOSP 2023, Figure 2 (OPT-13B serving ShareGPT)"
MEASURED_COLOR = "#334155"
CLASS_COLORS = {"token": "#1d4ed8", "reservation": "#ff9f1c", "internal": "#b45309", "external": "#c9a9a6",
                "free": "#e6e6e6"}
CLASS_WORDS = {
    "token": "token: holds a token's K/V",
    "reservation": "reservation: kept for a token the request will still write",
    "internal": "internal: allocated, never written (a reservation's unreached tail, a last block's end)",
    "external": "external: free, in a hole too small for the next reservation",
    "free": "free",
}


def workload_choice() -> tuple[Workload, bool]:
    """The requests the page runs: the sidebar's workload when it was changed from its default
    (a named scenario or an upload), else :data:`DEFAULT_WORKLOAD`. Also: whether it is the
    page's default. Raises ConfigError for a bad upload."""
    changed = (st.session_state.get("workload_upload") is not None
               or settings.current("workload") != settings.BY_KEY["workload"].default)
    if changed:
        return current_workload(), False
    return named_workload(DEFAULT_WORKLOAD, int(settings.current("seed"))), True


def config_for(workload: Workload) -> dict:
    """The sidebar's engine settings, with the workload's suggested pool while the sidebar's pool
    is at its default (the request-log scenarios are sized for theirs)."""
    config = settings.engine_settings()
    if config["pool_slots"] == settings.BY_KEY["pool_slots"].default:
        config["pool_slots"] = workload.pool_slots
    return config


def baseline_runs(workload: Workload, **config) -> list[Run]:
    """The workload on the four allocators, same settings (cached per process)."""
    return scripted_runs(workload, ALLOCATORS, **config)


# ---------------------------------------------------------------------------- numbers
def running_stats(run: Run) -> tuple[int, float]:
    """(peak, mean) sequences running per step, over the run."""
    running = run.metric("num_running")
    return (max(running), sum(running) / len(running)) if running else (0, 0.0)


def summary_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        peak, mean = running_stats(run)
        steps = f"{run.num_steps:,}" if run.done else f"{run.num_steps:,}+ (cut short)"
        rows.append({
            "allocator": BASELINE_LABELS[run.allocator],
            "token share, measured here": f"{run.waste['token_share']:.1%}",
            "token share, the paper": f"{PAPER_TOKEN_SHARE[run.allocator]:.1%}",
            "steps to finish": steps,
            "peak running": peak,
            "mean running": round(mean, 1),
        })
    return rows


def waste_figure(runs: list[Run]) -> go.Figure:
    """One stacked bar per allocator: the share of the pool in each class of the breakdown,
    averaged over the steps in which anything is allocated (each bar sums to 1)."""
    names = [BASELINE_LABELS[r.allocator] for r in runs]
    fig = go.Figure()
    for c in CLASSES:
        shares = [r.waste[c] for r in runs]
        fig.add_trace(go.Bar(y=names, x=shares, name=CLASS_WORDS[c].split(":")[0], orientation="h",
                             marker_color=CLASS_COLORS[c], text=[f"{v:.0%}" if v >= 0.04 else "" for v in shares],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"%{{y}}: {CLASS_WORDS[c]}: %{{x:.1%}} of the pool<extra></extra>"))
    fig.update_layout(barmode="stack", height=320, margin=dict(l=110, r=10, t=64, b=30),
                      title=dict(text="Where the pool goes: each class's share of the slots, measured, mean over the run",
                                 x=0.0, font=dict(size=15)),  # the legend under the title: on a slide it stays in view
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0.0, traceorder="normal"),
                      plot_bgcolor="white")
    fig.update_xaxes(range=[0, 1], tickformat=".0%", title_text=None)
    fig.update_yaxes(autorange="reversed")
    return fig


def token_share_figure(runs: list[Run]) -> go.Figure:
    """The token share (token slots / slots in use) measured here beside the paper's."""
    names = [BASELINE_LABELS[r.allocator] for r in runs]
    fig = go.Figure([
        go.Bar(y=names, x=[r.waste["token_share"] for r in runs], name="measured here", orientation="h",
               marker_color=MEASURED_COLOR,
               text=[f"{r.waste['token_share']:.1%}" for r in runs], textposition="outside",
               hovertemplate="%{y}, measured here: %{x:.1%} of the slots in use hold a token<extra></extra>"),
        go.Bar(y=names, x=[PAPER_TOKEN_SHARE[r.allocator] for r in runs], name="the paper (OPT-13B, ShareGPT)",
               orientation="h", marker=dict(color="white", line=dict(color="#374151", width=1.5)),
               text=[f"{PAPER_TOKEN_SHARE[r.allocator]:.1%}" for r in runs], textposition="outside",
               hovertemplate="%{y}, the paper: %{x:.1%}<extra></extra>"),
    ])
    fig.update_layout(barmode="group", height=320, margin=dict(l=110, r=10, t=64, b=30), plot_bgcolor="white",
                      title=dict(text="Token share: the slots in use that hold a token, measured here and in the paper",
                                 x=0.0, font=dict(size=15)),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0.0, traceorder="normal"))
    fig.update_xaxes(range=[0, 1.12], tickformat=".0%", title_text=None)
    fig.update_yaxes(autorange="reversed")
    return fig


def differences(workload: Workload, runs: list[Run], config: dict) -> str:
    """What differs between the paper's measurement and this one, in a few sentences."""
    data = ("the Azure LLM inference trace 2023 (conversation service; Microsoft Azure, CC BY 4.0): "
            f"{len(workload.requests):,} real requests at their recorded arrival times"
            if workload.name.startswith("azure") else f"the sidebar's workload {workload.name!r}")
    paged = next(r for r in runs if r.allocator == "paged")
    return (
        f"**What differs.** The paper's shares come from OPT-13B serving ShareGPT conversations on a GPU; ours "
        f"are measured here, on {data}, by this engine on scripted tokens, in a pool of {config['pool_slots']:,} "
        f"slots with blocks of {config['block_size']}. The model, the traffic and the pool differ, so compare the "
        f"order and the gaps, not the digits: every reserve-ahead policy leaves part of what it holds empty, and "
        f"the better it guesses the answer's length the less it wastes, yet even Oracle, which knows each length, "
        f"cannot share its holes. Paging's only waste is the unfilled end of each sequence's last block, at most "
        f"{config['block_size'] - 1} slots a sequence ({paged.waste['internal']:.1%} of the pool here); with "
        "lengths at 1/8 scale the sequences are short, so that end weighs more than in the paper."
        if workload.name == "azure-conv-small" else
        f"**What differs.** The paper's shares come from OPT-13B serving ShareGPT conversations on a GPU; ours are "
        f"measured here, on {data}, by this engine on scripted tokens, in a pool of {config['pool_slots']:,} slots "
        f"with blocks of {config['block_size']}. The model, the traffic and the pool differ, so compare the order "
        f"and the gaps, not the digits. Paging's only waste is the unfilled end of each sequence's last block "
        f"({paged.waste['internal']:.1%} of the pool here)."
    )


# ---------------------------------------------------------------------------- settings
def settings_note(workload: Workload, config: dict, is_default: bool) -> str:
    """Which of the sidebar's settings this page applies, and which it does not, in two sentences."""
    pool = ("the sidebar's pool size" if config["pool_slots"] != workload.pool_slots or not is_default
            else f"the log's own pool ({workload.pool_slots:,} slots) while the sidebar's pool size is at its default")
    return (
        "**Sidebar settings on this page.** Applied: block size, watermark, preemption mode and swap pool, prefix "
        f"caching, seed, {pool}, and the workload once you change it from its default (a named scenario or a workload "
        "file replaces the Azure requests). Not applied: *Contiguous policy* (all three Orca baselines run here), "
        "*Token source* and the model (the four runs use scripted tokens, so they are instant and exact; the real "
        "model's text does not change where memory goes), and *Replay a trace* (a replay holds one allocator's run, "
        "this page needs four). Guide mode ignores the sidebar: it runs the default requests with the engine's "
        "default settings."
    )


# ---------------------------------------------------------------------------- drawing
def busiest_step(runs: list[Run]) -> int:
    """The step the page opens at: the paged run's peak of running sequences (the contiguous
    runs' queues are long there)."""
    running = runs[-1].metric("num_running")
    return running.index(max(running)) if running else 0


def grid_block(runs: list[Run]) -> int:
    """The unit of the one grid the four pools share: the paged run's block size (the contiguous
    runs have blocks of one slot), so every pool has the same cells per row and cell size."""
    return max(max(1, r.at(0).block_size) for r in runs)


def pool_title(run: Run, step: int) -> str:
    snap = run.at(step)
    m = snap.metrics
    when = f"step {snap.step}" if step < run.num_steps else f"finished at step {snap.step}"
    return f"{BASELINE_LABELS[run.allocator]}, {when}: {m.num_running} running, {m.num_waiting} waiting"


def pools(runs: list[Run], step: int, *, height: int = 300) -> None:
    """The four pools at ``step``, two by two, on one grid (each run held at its last step once it
    has finished)."""
    unit = grid_block(runs)
    window = pool_view.zoom_control(KEY, runs[0].at(0).num_slots, unit)
    cols = [c for _ in range(0, len(runs), 2) for c in st.columns(2, gap="medium")]
    for col, run in zip(cols, runs):
        with col:
            pool_view.pool_chart(run.at(step), run.request_ids, pool_title(run, step), key=f"{KEY}_heat_{run.allocator}",
                                 window=window, height=height, grid_block=unit)
    st.caption(LEGEND + ". " + " · ".join(f"**{BASELINE_LABELS[a]}** {w}" for a, w in RESERVES.items())
               + f" · **{BASELINE_LABELS['paged']}** takes blocks of {unit} as tokens arrive.")


def pools_figure(runs: list[Run], step: int) -> go.Figure:
    """The four pools at ``step`` side by side in one figure (a slide), on one grid."""
    unit = grid_block(runs)
    figs = [snapshot_heatmap(r.at(step), r.request_ids, "", grid_block=unit)[0] for r in runs]
    titles = []
    for r in runs:
        m = r.at(step).metrics
        titles.append(f"{BASELINE_LABELS[r.allocator]}: {m.num_running} running, {m.num_waiting} waiting")
    return presenter.side_by_side(figs, titles, f"{runs[0].at(0).num_slots:,} KV slots each, step {step}")


def running_figure(runs: list[Run], step: int | None = None) -> go.Figure:
    """Sequences running per step on each allocator."""
    n = max(r.num_steps for r in runs)
    fig = step_curves(range(n), {BASELINE_LABELS[r.allocator]: r.metric("num_running", steps=n) for r in runs},
                      "Requests running at once, per step", "running", percent=False, current_step=step)
    for trace, color in zip(fig.data, RUN_COLORS):
        trace.line.color = color
    fig.update_xaxes(range=[0, n - 1])
    fig.update_yaxes(tickformat=",d")
    return fig


CHART_SLIDE_HEIGHT = 320  # px
RUN_COLORS = ("#c2410c", "#f59e0b", "#7c3aed", "#1d4ed8")  # Orca Max, Pow2, Oracle, paged


def predictions(runs: list[Run]) -> list[Prediction]:
    """Two questions the four runs answer: which reserve-ahead baseline wastes most, and how much
    of the memory paging holds in use is real K/V."""
    by = {r.allocator: r for r in runs}
    contiguous = [r for r in runs if r.kind == "contiguous"]
    worst = min(contiguous, key=lambda r: r.waste["token_share"])
    paged = by["paged"]
    share = paged.waste["token_share"]
    ranges = [("under 50%", 0.5), ("50-75%", 0.75), ("75-90%", 0.9), ("90% or more", 2.0)]
    return [
        Prediction(
            "base_worst", "Predict: which of the three reserve-ahead baselines keeps the smallest share of its "
            "allocated memory filled with tokens?", answer=BASELINE_LABELS[worst.allocator],
            options=tuple(BASELINE_LABELS[r.allocator] for r in contiguous),
            why=f"{BASELINE_LABELS[worst.allocator]} holds tokens in {worst.waste['token_share']:.1%} of what it has "
                f"allocated: it reserves room for the longest answer a request may write, and "
                f"{worst.waste['internal']:.1%} of the pool is reserved but never written (internal waste)."),
        Prediction(
            "base_paged_share", "Predict: of the memory the paged allocator has in use, what share holds real K/V?",
            why=f"{share:.1%}: blocks are taken as tokens arrive, so the only waste is the unfilled end of each "
                f"sequence's last block ({paged.waste['internal']:.1%} of the pool) and the one block a running "
                "sequence is about to write.", **predict.range_options(share, ranges)),
    ]


def guided_runs() -> tuple[list[Run], Workload, dict]:
    """The guide's fixed runs: the default requests, the log's pool, the engine's defaults."""
    workload = named_workload(DEFAULT_WORKLOAD, GUIDE_SEED)
    config = {k: settings.BY_KEY[k].default for k in settings.ENGINE_KEYS}
    config.update(pool_slots=workload.pool_slots, seed=GUIDE_SEED)
    return baseline_runs(workload, **config), workload, config


def guide_steps(runs: list[Run], workload: Workload) -> list[guide.GuideStep]:
    """The walkthrough: every number is read off the four runs. ``show``: the step of the pools
    and the slide's figure (``figure``: pools, waste, share or running)."""
    by = {r.allocator: r for r in runs}
    omax, pow2, oracle, paged = (by[a] for a in ALLOCATORS)
    busy = busiest_step(runs)
    pool = runs[0].at(0).num_slots
    block = grid_block(runs)
    last_arrival = max(r.arrival_step for r in workload.requests)
    at = {a: by[a].at(busy).metrics for a in ALLOCATORS}
    q, w = predictions(runs)
    steps = {a: by[a].num_steps for a in ALLOCATORS}
    peaks = {a: running_stats(by[a])[0] for a in ALLOCATORS}
    shares = ", ".join(f"{BASELINE_LABELS[r.allocator]} {r.waste['token_share']:.0%} (paper {PAPER_TOKEN_SHARE[r.allocator]:.0%})"
                       for r in runs)
    return [
        guide.GuideStep("One request log, four allocators", (
            f"{len(workload.requests)} real requests from Azure's conversation log arrive at their recorded times "
            f"into four pools of {pool:,} slots each, the last at step {last_arrival}. Orca Max, Pow2 and Oracle "
            f"reserve each request's room in one piece when they admit it; paging takes blocks of {block} as its "
            "tokens arrive."), {"step": 0, "figure": "pools"}),
        guide.GuideStep("Reserving for the longest answer", (
            f"Step {busy}, the busiest moment for paging. Orange is reserved but holds no token yet. Orca Max runs "
            f"{at['contiguous'].num_running} requests with {at['contiguous'].num_waiting} waiting; Pow2 runs "
            f"{at['contiguous-pow2'].num_running}, Oracle {at['contiguous-oracle'].num_running}, paging "
            f"{at['paged'].num_running}."), {"step": busy, "figure": "pools"},
            predict=q, reveal={"figure": "waste"}),
        guide.GuideStep("Knowing the answer's length", (
            "Pow2 reserves the answer's real length rounded up to a power of two, Oracle exactly that length: both know "
            "each answer in advance, which no real server does, so they bound what reserving ahead could ever do. "
            f"Oracle still keeps {oracle.waste['external']:.1%} of the pool in holes too small for the next reservation "
            "(dusty red) on average: it cannot share them."), {"step": busy, "figure": "pools"}),
        guide.GuideStep("Paging", (
            f"Paging holds only the blocks its sequences have filled, plus the unfilled end of each one's last block. "
            f"At step {busy} it runs {at['paged'].num_running} requests, against {at['contiguous'].num_running} on "
            "Orca Max, in the same memory."), {"step": busy, "figure": "pools"},
            predict=w, reveal={"figure": "share"}),
        guide.GuideStep("Who finishes first", (
            f"The same {len(workload.requests)} requests take Orca Max {steps['contiguous']:,} steps, Pow2 "
            f"{steps['contiguous-pow2']:,}, Oracle {steps['contiguous-oracle']:,} and paging {steps['paged']:,}. At "
            f"most {peaks['contiguous']}, {peaks['contiguous-pow2']}, {peaks['contiguous-oracle']} and "
            f"{peaks['paged']} requests run at once."), {"step": busy, "figure": "running"}),
        guide.GuideStep("The paper's numbers and ours", (
            f"Token share, measured here and in the paper: {shares}. The paper served OPT-13B on ShareGPT on a GPU; "
            "the model, the traffic and the pool differ, so compare the order and the gaps, not the digits."),
            {"step": busy, "figure": "share"}),
    ]


def step_figure(runs: list[Run], show: dict) -> go.Figure | None:
    """The figure a guide step names, besides the pools (None for the pools themselves)."""
    which = show.get("figure", "pools")
    if which == "waste":
        return waste_figure(runs)
    if which == "share":
        return token_share_figure(runs)
    if which == "running":
        return running_figure(runs, int(show["step"]))
    return None


def slide(runs: list[Run], show: dict) -> None:
    """Presenter mode: the step's one figure (the four pools in one figure, or a chart)."""
    fig = step_figure(runs, show)
    if fig is None:
        presenter.slide(pools_figure(runs, int(show["step"])), KEY, SLIDE_LEGEND)
    else:  # a bar chart needs less height than the pools: it stays above the fold under a revealed answer
        presenter.slide(fig, KEY, height=CHART_SLIDE_HEIGHT)


def guide_view(runs: list[Run], show: dict) -> None:
    """Guide mode: the step's chart, then the four pools."""
    fig = step_figure(runs, show)
    if fig is not None:
        show_chart(fig, f"{KEY}_guide_figure", config=export.png_config(f"{KEY}-guide"))
    pools(runs, int(show["step"]))


def explore(runs: list[Run], workload: Workload, config: dict, is_default: bool) -> None:
    report_stops(runs)
    n = max(r.num_steps for r in runs)
    step_key = f"{KEY}_step"
    if step_key not in st.session_state:
        st.session_state[step_key] = busiest_step(runs)
    if int(st.session_state[step_key]) > n - 1:  # fewer steps than the runs shown before
        st.session_state[step_key] = max(0, n - 1)
    step = st.slider("Step (all four pools)", 0, max(1, n - 1), key=step_key,
                     help="One step for the four runs; a run that has finished stays at its last step. The page opens "
                          "where paging runs the most requests at once.")
    if presenter.on(KEY):  # free play on a projector: the four pools in one figure
        presenter.fit(False)
        presenter.slide(pools_figure(runs, step), KEY, SLIDE_LEGEND)
    else:
        pools(runs, step)
    st.caption(("Default requests: " if is_default else "The sidebar's workload: ") + workload.description
               + f" · pool {config['pool_slots']:,} slots, blocks of {config['block_size']}, seed {config['seed']}.")
    st.subheader("Before the numbers: predict")
    answers = [predict.ask(p, KEY) for p in predictions(runs)]
    st.caption(predict.score_text())
    if any(a is None for a in answers) and not st.toggle("Show the measured breakdown now", key=f"{KEY}_show"):
        st.info("Answer both questions (or flip the switch) to see the measured breakdown of all four allocators.")
        return
    show_chart(waste_figure(runs), f"{KEY}_waste", config=export.png_config(f"{KEY}-waste"))
    show_chart(token_share_figure(runs), f"{KEY}_token_share", config=export.png_config(f"{KEY}-token-share"))
    show_chart(running_figure(runs, step), f"{KEY}_running", config=export.png_config(f"{KEY}-running"))
    st.dataframe(summary_rows(runs), hide_index=True, width="stretch")
    st.markdown(differences(workload, runs, config))
    st.caption(f"Quoted: {PAPER}. The breakdown's classes: " + "; ".join(CLASS_WORDS.values()) + ".")


# ---------------------------------------------------------------------------- the page
@dataclass(frozen=True)
class Baselines:
    """What the page draws: the four runs of ``workload`` under ``config``; ``is_default``: the
    page's default requests (always in guide mode)."""
    runs: list[Run]
    workload: Workload
    config: dict
    is_default: bool


def scenario(guided: bool) -> Baselines:
    """The guide's fixed runs, or the sidebar's workload (or the default requests) on the four allocators."""
    try:
        if guided:
            with st.spinner("Running 200 Azure requests on four allocators…"):
                runs, workload, config = guided_runs()
            return Baselines(runs, workload, config, True)
        workload, is_default = workload_choice()
        config = config_for(workload)
        with st.spinner(f"Running {len(workload.requests):,} requests on four allocators…"):
            runs = baseline_runs(workload, **config)
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    return Baselines(runs, workload, config, is_default)


def export_files(b: Baselines) -> Export:
    return Export(b.runs, "Real traffic: Azure's requests on Orca Max, Pow2, Oracle and paged blocks", "baselines")


LESSON = Lesson(
    key=KEY, title="Real traffic: the paper's baselines", help=GUIDE_HELP, scenario=scenario,
    guide_steps=lambda b: guide_steps(b.runs, b.workload), guide_view=lambda b, show: guide_view(b.runs, show),
    slide=lambda b, show: slide(b.runs, show), explore=lambda b: explore(b.runs, b.workload, b.config, b.is_default),
    export=export_files, sidebar_note=lambda b: settings_note(b.workload, b.config, b.is_default))
