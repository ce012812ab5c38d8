"""Lesson 6, the ops dashboard: the signals an operator watches on a serving loop, over the steps
of a run on both allocators, each with what healthy looks like and what a bad pattern means."""
from __future__ import annotations

from collections import Counter

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from pagedkv_core.events import PREEMPT_RECOMPUTE, PREEMPT_SWAP
from pagedkv_core.workloads.scenarios import build_workload
from ui import export, guide, presenter
from ui.figures import integer_ticks, legend_below, series_color, step_curves
from ui.predict import Prediction, range_options
from ui.lesson import Export, Lesson, sidebar_or_guided
from ui.runs.model import Run
from ui.runs.scripted import scripted_pair

KEY = "ops"
GUIDE_WORKLOAD, GUIDE_POOL, GUIDE_BLOCK, GUIDE_SEED = "burst", 2048, 16, 0
GUIDE_HELP = (f"A fixed walkthrough of the {GUIDE_WORKLOAD} workload ({GUIDE_POOL:,} slots, block size {GUIDE_BLOCK}, "
              f"recompute, seed {GUIDE_SEED}), whatever the sidebar says.")
FULL_USAGE = 0.9  # "the pool fills": paged KV usage above this
THRASH_REPEATS = 3  # thrashing: some request evicted at least this many times


def guided_runs() -> list[Run]:
    """The fixed, seeded burst run of the guide, whatever the sidebar says."""
    return scripted_pair(build_workload(GUIDE_WORKLOAD, seed=GUIDE_SEED), pool_slots=GUIDE_POOL, block_size=GUIDE_BLOCK)


def arrived(run: Run, step: int) -> int:
    """Requests that have arrived by the end of ``step``: every one is running, waiting, swapped,
    finished or rejected (the count identity of :mod:`pagedkv_core.metrics`)."""
    if step < 0:
        return 0
    m = run.at(step).metrics
    return m.num_running + m.num_waiting + m.num_swapped + m.num_finished + m.num_rejected


def thrashing_answer(run: Run) -> tuple[str, int | None]:
    """Is the run thrashing (the same sequences evicted and re-admitted over and over)? Answered
    from its preemption events; with the step of the most evicted request's last eviction."""
    pre = run.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE)
    if not pre:
        return "No: nothing was preempted.", None
    times = Counter(e.request_id for _, e in pre)
    most, most_times = times.most_common(1)[0]
    last = max(s for s, e in pre if e.request_id == most)
    again = sum(1 for c in times.values() if c > 1)
    steps = sorted({s for s, _ in pre})
    span = steps[-1] - steps[0] + 1
    facts = (f"At step {last}, {most} is evicted for the last time. Over the run, {len(pre)} preemptions hit "
             f"{len(times)} requests, {again} of them more than once; the most evicted, {most}, {most_times} "
             f"time{'s' if most_times != 1 else ''}. They fell in {len(steps)} of the {span} steps "
             f"from step {steps[0]} to step {steps[-1]}, and none after, while the run went on to step {run.num_steps - 1}.")
    if most_times >= THRASH_REPEATS:
        return (f"Yes. {facts} Evicting the same sequence {most_times} times is the bad pattern: its work is lost "
                "(recompute) or moved (swap) each time. The cure is a bigger pool, a higher watermark or fewer "
                "admissions.", last)
    return (f"No. {facts} No request was evicted {THRASH_REPEATS} times or more: a burst of evictions that the spike "
            "caused and that ended as it drained. A steady stream, the same sequences evicted again and again, would "
            "be the bad pattern.", last)


CONTIGUOUS_PREEMPTION_RANGES = [("none", 1), ("1 to 10", 11), ("more than 10", float("inf"))]
PAGED_PREEMPTION_RANGES = [("1 to 5", 6), ("6 to 20", 21), ("21 to 50", 51), ("more than 50", float("inf"))]


def guide_steps(runs: list[Run]) -> list[guide.GuideStep]:
    """A walkthrough of the fixed burst run; every step number and every answer is read off the run.
    ``show``: the step (``step``), how far the curves are drawn (``upto``: the future stays hidden
    while a prediction is open) and the slide's figure (``figure``)."""
    contig, paged = runs
    spike = paged.first(lambda s: s.metrics.num_waiting > 10)
    full = paged.first(lambda s: s.metrics.kv_usage > FULL_USAGE, start=spike)
    full = spike if full is None else full
    preempt = paged.first(lambda s: s.metrics.step_preemptions)
    preempt = full if preempt is None else preempt
    worst = paged.at(max(range(paged.num_steps), key=lambda i: paged.at(i).metrics.step_preemptions)).step
    end = paged.num_steps - 1
    pm = paged.at(end).metrics
    cm = contig.at(contig.num_steps - 1).metrics
    pre_steps = [i for i in range(paged.num_steps) if paged.at(i).metrics.step_preemptions] or [preempt]
    contig_why = ("The contiguous allocator reserves prompt + max_tokens when it admits a request, so a running "
                  "sequence never needs memory it does not already hold" if cm.num_preemptions == 0 else
                  "Even reservations of prompt + max_tokens ran out here")
    n_req = len(paged.request_ids)
    thrash, thrash_step = thrashing_answer(paged)
    first_arrived, spike_arrived = arrived(paged, 0), arrived(paged, spike) - arrived(paged, spike - 1)
    pu = paged.at(0).metrics
    steps = [
        guide.GuideStep("A quiet start", (
            f"Step 0: {first_arrived} requests arrive. KV usage is low on the paged side ({pu.kv_usage:.0%}) and token "
            f"utilization is high ({pu.token_utilization:.0%}): the memory that is allocated holds real tokens. This is "
            f"what healthy looks like. (The guide runs its own fixed scenario, {GUIDE_WORKLOAD} on "
            f"{paged.config.pool_slots:,} slots with blocks of {paged.config.block_size}, whatever the sidebar says.)"),
            {"step": 0, "figure": "kv"}),
        guide.GuideStep("The spike", (
            f"Step {spike}: {spike_arrived} more requests arrive at once. The waiting queue jumps; the paged scheduler "
            "admits "
            "as many as the free blocks (minus the watermark) allow. The charts stop at this step: the rest is to come."),
            {"step": spike, "upto": spike, "figure": "kv"},
            predict=Prediction(
                "ops_contiguous_preemptions", "Predict: over the whole run, how many preemptions will the contiguous "
                "side have?", why=f"{contig_why}: {cm.num_preemptions} preemptions, against {pm.num_preemptions} on "
                "the paged side, which pays for its higher concurrency with evictions under a spike.",
                **range_options(cm.num_preemptions, CONTIGUOUS_PREEMPTION_RANGES)),
            reveal={"step": contig.num_steps - 1, "upto": None, "figure": "preempt"}),
        guide.GuideStep("The pool fills", (
            f"Step {full}: paged KV usage passes {FULL_USAGE:.0%}. High usage is fine while it stays below the point "
            "where "
            "running sequences can no longer grow."), {"step": full, "figure": "kv"}),
        guide.GuideStep("First preemption", (
            f"Step {preempt}: a running sequence needs a new block and none is free, so the most recently admitted "
            "running sequence (the tail of the running list) is preempted. One preemption under a spike is normal."),
            {"step": preempt, "upto": preempt, "figure": "preempt"},
            predict=Prediction(
                "ops_paged_preemptions", "Predict: how many preemptions will the paged side have by the end of the run?",
                why=f"{pm.num_preemptions} in all, in {len(pre_steps)} different steps from step {pre_steps[0]} to "
                f"{pre_steps[-1]}: while the spike lasted, a running sequence kept needing a block when none was free, "
                "and each time the most recently admitted one was evicted.",
                **range_options(pm.num_preemptions, PAGED_PREEMPTION_RANGES)),
            reveal={"step": end, "upto": None}),
        guide.GuideStep("Thrashing?", f"Is the paged side thrashing? {thrash}",
                        {"step": thrash_step if thrash_step is not None else worst, "figure": "preempt"}),
        guide.GuideStep("Blocks per sequence", (
            f"The histogram below shows how many blocks each live sequence holds at step {worst}: paged sequences "
            "hold what their tokens need; every contiguous one holds a worst-case reservation."),
            {"step": worst, "figure": "hist"}),
        guide.GuideStep("Drained", (
            f"Step {end}: the paged side has finished all {n_req} requests; the contiguous side, "
            + ("which never preempts" if cm.num_preemptions == 0 else f"with {cm.num_preemptions} preemptions")
            + f" but runs fewer requests at once ({sum(contig.metric('num_running')) / contig.num_steps:.1f} on average "
            f"against {sum(paged.metric('num_running')) / paged.num_steps:.1f}), needs until step {contig.num_steps - 1}."),
            {"step": end, "figure": "kv"}),
    ]
    return sorted(steps, key=lambda g: g.show["step"])  # forward through the run, never back


def slide(runs: list[Run], show: dict) -> None:
    """Presenter mode: the step's one figure (KV usage, preemptions, or blocks per sequence)."""
    n = max(r.num_steps for r in runs)
    step, upto, which = int(show["step"]), show.get("upto"), show.get("figure", "kv")
    if which == "preempt":
        fig = preemption_chart(runs, n, step, upto)
    elif which == "hist":
        hists = [blocks_histogram(r, step) for r in runs]
        fig = presenter.side_by_side([h for h in hists if h is not None],
                                     [f"{r.allocator}: blocks (or reserved slots) per sequence" for r, h in zip(runs, hists)
                                      if h is not None], f"Memory held per live sequence at step {step}", heatmaps=False)
    else:
        fig = kv_figure(runs, n, step, upto)
    presenter.slide(fig, KEY)


def _series(runs: list[Run], name: str, n: int, upto: int | None, *, empty_as_none: bool = False) -> dict[str, list]:
    """Per run, one metric per step; after ``upto`` None (not drawn: the future of a guide step)."""
    out = {}
    for run in runs:
        ys = run.metric(name, steps=n, empty_as_none=empty_as_none)
        out[run.allocator] = ys if upto is None else ys[: upto + 1] + [None] * (n - upto - 1)
    return out


def kv_figure(runs: list[Run], n: int, marker: int | None, upto: int | None = None):
    fig = step_curves(range(n), _series(runs, "kv_usage", n, upto), "KV cache usage (vLLM kv_cache_usage_perc)",
                      "allocated / pool", current_step=marker)
    fig.update_xaxes(range=[0, n - 1])
    return fig


def note(healthy: str, bad: str) -> None:
    st.caption(f"**Healthy:** {healthy} **Bad pattern:** {bad}")


def dashboard(runs: list[Run], marker: int | None, upto: int | None = None) -> None:
    """The four signals over the run and the blocks-per-sequence histogram; ``marker``: the guide's
    step (a dotted line and the histogram's step), None to let a slider pick the histogram's step;
    ``upto``: draw the curves only up to that step."""
    n = max(r.num_steps for r in runs)
    steps = range(n)

    def series(name: str, *, empty_as_none: bool = False) -> dict[str, list]:
        return _series(runs, name, n, upto, empty_as_none=empty_as_none)

    def chart(fig, key: str) -> None:
        fig.update_xaxes(range=[0, n - 1])
        st.plotly_chart(fig, width="stretch", key=key, config=export.png_config(key))

    if upto is not None:
        st.caption(f"The curves stop at step {upto}: what comes next is the prediction's answer.")
    left, right = st.columns(2)
    with left:
        chart(kv_figure(runs, n, marker, upto), "ops_kv")
        note("high (70-95%) while requests wait: memory is working.",
             "near 100% with preemptions climbing means the pool is too small; low usage with a long queue means "
             "something other than memory (reservations, the token budget) is holding requests back.")
    with right:
        chart(step_curves(steps, series("token_utilization", empty_as_none=True),
                          "Token utilization: filled slots / allocated slots", "token utilization", current_step=marker),
              "ops_util")
        note("above 90%: allocated memory holds real tokens.",
             "far below means internal fragmentation or reservations for tokens that never come (the contiguous baseline).")

    left, right = st.columns(2)
    with left:
        chart(preemption_chart(runs, n, marker, upto), "ops_preempt")
        note("zero or rare single events under a load spike.",
             "a steady stream means thrashing: sequences are evicted and re-admitted over and over, and the work "
             "they lose (recompute) or move (swap) eats throughput. Raise the watermark or the pool, or admit fewer.")
    with right:
        chart(step_curves(steps, series("prefix_cache_hit_rate"),
                          "Prefix-cache hit rate (cumulative)", "hit tokens / queried tokens", current_step=marker),
              "ops_prefix")
        note("high when requests share a system prompt (try the shared_preamble workload).",
             "near zero on a workload that shares prefixes means the cache is off, blocks are evicted before reuse, or "
             "the shared part is shorter than one block.")

    st.subheader("Blocks per sequence")
    both_live = min(r.num_steps for r in runs)
    if marker is not None:
        step = marker
    elif n <= 1:  # a live run that has only its first step (a slider needs two)
        step = 0
        st.caption("The distribution at step 0, the only step so far.")
    else:
        step = st.slider("Show the distribution at step", 0, n - 1, value=max(0, both_live // 2), key="ops_step")
    blocks_histograms(runs, step)
    note("paged: a spread that follows the sequences' lengths (tokens / block size, rounded up).",
         "contiguous: every sequence holds the same worst-case reservation whatever its length; paged: a long tail "
         "of huge block tables means a few very long sequences dominate memory.")


def preemption_chart(runs: list[Run], n: int, marker: int | None, upto: int | None = None) -> go.Figure:
    """Preemptions per step (bars) and in total (a line on the right axis), per allocator; ``upto``:
    only the steps so far."""
    steps = list(range(n))
    fig = go.Figure()
    per_step_all = _series(runs, "step_preemptions", n, upto)
    totals = _series(runs, "num_preemptions", n, upto)
    for run in runs:
        per_step = [0 if v is None else v for v in per_step_all[run.allocator]]
        color = series_color(run.allocator)
        fig.add_trace(go.Bar(x=steps, y=per_step, name=f"{run.allocator}: this step", marker_color=color,
                             opacity=0.45))
        fig.add_trace(go.Scatter(x=steps, y=totals[run.allocator], name=f"{run.allocator}: total",
                                 yaxis="y2", mode="lines", line=dict(color=color, width=2)))
    most_per_step = max((v or 0 for ys in per_step_all.values() for v in ys), default=0)
    most_total = max((v or 0 for ys in totals.values() for v in ys), default=0)
    fig.update_layout(title=dict(text="Preemptions (vLLM num_preemptions)", x=0, font=dict(size=15)), height=320,
                      margin=dict(l=50, r=50, t=40, b=40),
                      yaxis=dict(title="this step", **integer_ticks(most_per_step)),  # counts: whole-number ticks
                      yaxis2=dict(title="total", overlaying="y", side="right", showgrid=False, **integer_ticks(most_total)))
    legend_below(fig, rows=2)
    fig.update_xaxes(title_text="engine step", range=[0, n - 1])
    if marker is not None:
        fig.add_vline(x=marker, line_dash="dot", line_color="#555")
    return fig


def _unit(run: Run) -> str:
    return "reserved slots" if run.kind == "contiguous" else f"blocks of {run.at(0).block_size}"


def blocks_histogram(run: Run, step: int) -> go.Figure | None:
    """How many blocks (or reserved slots) each live sequence holds at ``step``; None when none does."""
    snap = run.at(step)
    alive = snap.seq_num_blocks[snap.seq_num_blocks > 0]
    if not len(alive):
        return None
    fig = go.Figure(go.Histogram(x=alive, nbinsx=30, marker_color=series_color(run.allocator)))
    fig.update_layout(title=dict(text=f"{run.allocator}: {len(alive)} sequences holding memory at step {snap.step}",
                                 x=0, font=dict(size=15)), height=300, margin=dict(l=50, r=10, t=40, b=40), bargap=0.05)
    fig.update_xaxes(title_text=f"{_unit(run)} per sequence")
    fig.update_yaxes(title_text="sequences", **integer_ticks(np.histogram(alive, bins=30)[0].max()))
    return fig


def blocks_histograms(runs: list[Run], step: int) -> None:
    """One histogram per run: how many blocks (or reserved slots) each live sequence holds at ``step``."""
    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        snap = run.at(step)
        fig = blocks_histogram(run, step)
        if fig is None:
            col.markdown(f"**{run.allocator}**: no sequence holds memory at step {snap.step} (the run has ended).")
            continue
        alive = snap.seq_num_blocks[snap.seq_num_blocks > 0]
        col.plotly_chart(fig, width="stretch", key=f"ops_hist_{run.allocator}", config=export.png_config(f"ops-hist-{run.allocator}"))
        col.caption(f"mean {np.mean(alive):.1f}, max {int(np.max(alive))} {_unit(run)} per sequence")


def guide_view(runs: list[Run], show: dict) -> None:
    """A guide step: the dashboard with the step marked and the curves cut at ``upto``."""
    dashboard(runs, show["step"], show.get("upto"))


def explore(runs: list[Run]) -> None:
    """The dashboard over the whole of the current runs."""
    if any(r.engine is not None and r.num_steps == 0 for r in runs):
        st.info("The live run has no steps yet: press Play on *Reserve or page* first.")
        st.stop()
    dashboard(runs, None, None)


def export_files(runs: list[Run]) -> Export | None:
    """The runs' heatmaps as one animated HTML file, once they are done."""
    return Export(runs, "Ops dashboard: the KV pools of the run", "ops") if all(r.done for r in runs) else None


LESSON = Lesson(key=KEY, title="Ops dashboard", help=GUIDE_HELP,
                scenario=sidebar_or_guided(guided_runs), guide_steps=guide_steps,
                guide_view=guide_view, slide=slide, explore=explore, export=export_files)
