"""Lesson 6, the ops dashboard: the signals an operator watches on a serving loop, over the steps
of a run on both allocators, each with what healthy looks like and what a bad pattern means."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from pagedkv_core.workloads import build_workload
from ui import guide
from ui.figures import series_color, step_curves
from ui.runs import Run, scripted_pair

KEY = "ops"
GUIDE_HELP = "A fixed walkthrough of the burst workload (2,048 slots, block size 16, recompute, seed 0)."


def guided_runs() -> list[Run]:
    """The fixed, seeded burst run of the guide, whatever the sidebar says."""
    return scripted_pair(build_workload("burst", seed=0), pool_slots=2048, block_size=16)


def guide_steps(runs: list[Run]) -> list[guide.GuideStep]:
    """A walkthrough of the fixed burst run; every step number is read off the run itself."""
    contig, paged = runs
    spike = paged.first(lambda s: s.metrics.num_waiting > 10)
    full = paged.first(lambda s: s.metrics.kv_usage > 0.9, start=spike)
    full = spike if full is None else full
    preempt = paged.first(lambda s: s.metrics.step_preemptions)
    preempt = full if preempt is None else preempt
    worst = paged.at(max(range(paged.num_steps), key=lambda i: paged.at(i).metrics.step_preemptions)).step
    end = paged.num_steps - 1
    pm = paged.at(end).metrics
    return [
        guide.GuideStep("A quiet start", (
            "Step 0: eight requests arrive. KV usage is low on the paged side and token utilization is high: "
            "the memory that is allocated holds real tokens. This is what healthy looks like."), {"step": 0}),
        guide.GuideStep("The spike", (
            f"Step {spike}: 32 more requests arrive at once. The waiting queue jumps; the paged scheduler admits "
            "as many as the free blocks (minus the watermark) allow."), {"step": spike}),
        guide.GuideStep("The pool fills", (
            f"Step {full}: paged KV usage passes 90%. High usage is fine while it stays below the point where "
            "running sequences can no longer grow."), {"step": full}),
        guide.GuideStep("First preemption", (
            f"Step {preempt}: a running sequence needs a new block and none is free, so the most recently admitted "
            "one is preempted. One preemption under a spike is normal."), {"step": preempt}),
        guide.GuideStep("Thrashing?", (
            f"Step {worst} has the most preemptions in one step ({paged.at(worst).metrics.step_preemptions}). A steady "
            f"stream of them is the bad pattern: the run ends with {pm.num_preemptions} preemptions in all, each one "
            "work lost (recompute) or moved (swap). The cure is a bigger pool, a higher watermark or fewer admissions."),
            {"step": worst}),
        guide.GuideStep("Blocks per sequence", (
            f"The histogram below shows how many blocks each live sequence holds at step {worst}: paged sequences "
            "hold what their tokens need; every contiguous one holds a worst-case reservation."), {"step": worst}),
        guide.GuideStep("Drained", (
            f"Step {end}: the paged side has finished all 40 requests; the contiguous side, which never preempts "
            f"but runs few requests at once, needs until step {contig.num_steps - 1}."), {"step": end}),
    ]


def note(healthy: str, bad: str) -> None:
    st.caption(f"**Healthy:** {healthy} **Bad pattern:** {bad}")


def dashboard(runs: list[Run], marker: int | None) -> None:
    """The four signals over the run and the blocks-per-sequence histogram; ``marker``: the guide's
    step (a dotted line and the histogram's step), None to let a slider pick the histogram's step."""
    n = max(r.num_steps for r in runs)
    steps = range(n)

    def series(name: str, *, empty_as_none: bool = False) -> dict[str, list]:
        return {run.allocator: run.metric(name, steps=n, empty_as_none=empty_as_none) for run in runs}

    left, right = st.columns(2)
    with left:
        st.plotly_chart(step_curves(steps, series("kv_usage"), "KV cache usage (vLLM kv_cache_usage_perc)",
                                    "allocated / pool", current_step=marker), width="stretch", key="ops_kv")
        note("high (70-95%) while requests wait: memory is working.",
             "near 100% with preemptions climbing means the pool is too small; low usage with a long queue means "
             "something other than memory (reservations, the token budget) is holding requests back.")
    with right:
        st.plotly_chart(step_curves(steps, series("token_utilization", empty_as_none=True),
                                    "Token utilization: filled slots / allocated slots", "token utilization",
                                    current_step=marker),
                        width="stretch", key="ops_util")
        note("above 90%: allocated memory holds real tokens.",
             "far below means internal fragmentation or reservations for tokens that never come (the contiguous baseline).")

    left, right = st.columns(2)
    with left:
        st.plotly_chart(preemption_chart(runs, n, marker), width="stretch", key="ops_preempt")
        note("zero or rare single events under a load spike.",
             "a steady stream means thrashing: sequences are evicted and re-admitted over and over, and the work "
             "they lose (recompute) or move (swap) eats throughput. Raise the watermark or the pool, or admit fewer.")
    with right:
        st.plotly_chart(step_curves(steps, series("prefix_cache_hit_rate"),
                                    "Prefix-cache hit rate: hit tokens / queried tokens (cumulative)", "hit rate",
                                    current_step=marker),
                        width="stretch", key="ops_prefix")
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


def preemption_chart(runs: list[Run], n: int, marker: int | None) -> go.Figure:
    """Preemptions per step (bars) and in total (a line on the right axis), per allocator."""
    steps = list(range(n))
    fig = go.Figure()
    for run in runs:
        per_step = [0 if v is None else v for v in run.metric("step_preemptions", steps=n)]
        color = series_color(run.allocator)
        fig.add_trace(go.Bar(x=steps, y=per_step, name=f"{run.allocator}: this step", marker_color=color,
                             opacity=0.45))
        fig.add_trace(go.Scatter(x=steps, y=run.metric("num_preemptions", steps=n), name=f"{run.allocator}: total",
                                 yaxis="y2", mode="lines", line=dict(color=color, width=2)))
    fig.update_layout(title=dict(text="Preemptions (vLLM num_preemptions)", x=0, font=dict(size=15)), height=300,
                      margin=dict(l=50, r=50, t=40, b=40), legend=dict(orientation="h", y=-0.25),
                      yaxis=dict(title="this step", rangemode="tozero"),
                      yaxis2=dict(title="total", overlaying="y", side="right", rangemode="tozero"))
    fig.update_xaxes(title_text="engine step")
    if marker is not None:
        fig.add_vline(x=marker, line_dash="dot", line_color="#555")
    return fig


def blocks_histograms(runs: list[Run], step: int) -> None:
    """One histogram per run: how many blocks (or reserved slots) each live sequence holds at ``step``."""
    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        snap = run.at(step)
        alive = snap.seq_num_blocks[snap.seq_num_blocks > 0]
        unit = "reserved slots" if run.kind == "contiguous" else f"blocks of {snap.block_size}"
        if not len(alive):
            col.markdown(f"**{run.allocator}**: no sequence holds memory at step {snap.step} (the run has ended).")
            continue
        fig = go.Figure(go.Histogram(x=alive, nbinsx=30, marker_color=series_color(run.allocator)))
        fig.update_layout(title=dict(text=f"{run.allocator}: {len(alive)} sequences holding memory at step {snap.step}",
                                     x=0, font=dict(size=15)), height=300, margin=dict(l=50, r=10, t=40, b=40), bargap=0.05)
        fig.update_xaxes(title_text=f"{unit} per sequence")
        fig.update_yaxes(title_text="sequences")
        col.plotly_chart(fig, width="stretch", key=f"ops_hist_{run.allocator}")
        col.caption(f"mean {np.mean(alive):.1f}, max {int(np.max(alive))} {unit} per sequence")
