"""Ops: the signals an operator watches on a serving loop, over the steps of the current run."""
import numpy as np
import plotly.graph_objects as go
import streamlit as st

from pagedkv_core.config import EngineConfig
from pagedkv_core.workloads import build_workload
from pages import guide
from pages.runs import current_runs, scripted_run
from pages.viz import series_color, step_curves

KEY = "ops"

st.title("Ops dashboard")
st.markdown(
    "The signals of a healthy serving loop, named as vLLM exports them, for the current settings and "
    "workload on both allocators. Each chart says what healthy looks like and what a bad pattern means."
)



def guide_steps(runs) -> list[guide.GuideStep]:
    """A walkthrough of the fixed burst run; every step number is read off the run itself."""
    contig, paged = runs
    spike = next(s.step for s in paged.snapshots if s.metrics.num_waiting > 10)
    full = next((s.step for s in paged.snapshots[spike:] if s.metrics.kv_usage > 0.9), spike)
    preempt = next((s.step for s in paged.snapshots if s.metrics.step_preemptions), full)
    worst = max(paged.snapshots, key=lambda s: s.metrics.step_preemptions).step
    end = len(paged.snapshots) - 1
    pm = paged.snapshots[-1].metrics
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
            f"but runs few requests at once, needs until step {len(contig.snapshots) - 1}."), {"step": end}),
    ]


guided = guide.mode(KEY, help="A fixed walkthrough of the burst workload (2,048 slots, block size 16, recompute, seed 0).")
if guided:
    workload = build_workload("burst", seed=0)
    runs = [scripted_run(EngineConfig(allocator=a, pool_slots=2048, block_size=16), workload, a)
            for a in ("contiguous", "paged")]
    marker = guide.nav(KEY, guide_steps(runs)).show["step"]
else:
    runs = current_runs()
    marker = None
if runs is None:
    st.stop()
if any(r.engine is not None and len(r.snapshots) == 0 for r in runs):
    st.info("The live run has no steps yet: press Play on *Reserve or page* first.")
    st.stop()
n = max(len(r.snapshots) for r in runs)
steps = range(n)


def series(field, *, empty_as_none=False):
    out = {}
    for run in runs:
        vals = []
        for i in steps:
            m = run.at(i).metrics if i < len(run.snapshots) else None
            if m is None or (empty_as_none and not m.allocated_slots):
                vals.append(None)
            else:
                vals.append(getattr(m, field))
        out[run.allocator] = vals
    return out


def note(healthy: str, bad: str) -> None:
    st.caption(f"**Healthy:** {healthy} **Bad pattern:** {bad}")


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
    fig = go.Figure()
    for run in runs:
        per_step = [run.at(i).metrics.step_preemptions if i < len(run.snapshots) else 0 for i in steps]
        color = series_color(run.allocator)
        fig.add_trace(go.Bar(x=list(steps), y=per_step, name=f"{run.allocator}: this step", marker_color=color,
                             opacity=0.45))
        fig.add_trace(go.Scatter(x=list(steps), y=series("num_preemptions")[run.allocator], name=f"{run.allocator}: total",
                                 yaxis="y2", mode="lines", line=dict(color=color, width=2)))
    fig.update_layout(title=dict(text="Preemptions (vLLM num_preemptions)", x=0, font=dict(size=15)), height=300,
                      margin=dict(l=50, r=50, t=40, b=40), legend=dict(orientation="h", y=-0.25),
                      yaxis=dict(title="this step", rangemode="tozero"),
                      yaxis2=dict(title="total", overlaying="y", side="right", rangemode="tozero"))
    fig.update_xaxes(title_text="engine step")
    if marker is not None:
        fig.add_vline(x=marker, line_dash="dot", line_color="#555")
    st.plotly_chart(fig, width="stretch", key="ops_preempt")
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
both_live = min(len(r.snapshots) for r in runs)
if marker is not None:
    step = marker
else:
    step = st.slider("Show the distribution at step", 0, max(0, n - 1), value=max(0, both_live // 2), key="ops_step")
cols = st.columns(len(runs))
for col, run in zip(cols, runs):
    snap = run.at(step)
    alive = snap.seq_num_blocks[snap.seq_num_blocks > 0]
    unit = "reserved slots" if run.allocator == "contiguous" else f"blocks of {snap.block_size}"
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
note("paged: a spread that follows the sequences' lengths (tokens / block size, rounded up).",
     "contiguous: every sequence holds the same worst-case reservation whatever its length; paged: a long tail "
     "of huge block tables means a few very long sequences dominate memory.")
