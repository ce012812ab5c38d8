"""Reserve or page: the same requests on the same memory, contiguous reservations beside paged blocks."""
import streamlit as st

from pagedkv_core.config import EngineConfig
from pagedkv_core.workloads import build_workload
from pages import guide, player
from pages.runs import REAL_MAX_TOKENS, Run, current_runs, live_texts, scripted_run, step_live
from pages.viz import LEGEND, pool_heatmap, slot_hover_text, step_curves

KEY = "rop"

st.title("Reserve or page")
st.markdown(
    "The same requests arrive at the same KV memory twice. **Left**: each request reserves room for its "
    "longest possible answer in one contiguous piece. **Right**: vLLM-style paging hands out small "
    "blocks as tokens arrive. Press **Play** and watch who gets to run."
)

def side(run: Run, step: int) -> None:
    snap = run.at(step)
    m = snap.metrics
    label = "Contiguous (reserve the maximum)" if run.allocator == "contiguous" else f"Paged (blocks of {snap.block_size})"
    if run.label.startswith("trace"):
        label = f"{label}, from {run.label}"
    st.subheader(label)
    c = st.columns(3) + st.columns(3)
    c[0].metric("running", m.num_running, help="sequences computed in this step")
    c[1].metric("waiting", m.num_waiting, help="requests queued for admission")
    c[2].metric("tokens this step", m.step_tokens, help="prefill + decode tokens computed in this step")
    c[3].metric("token utilization", f"{m.token_utilization:.0%}", help="slots holding a token / allocated slots")
    c[4].metric("KV usage", f"{m.kv_usage:.0%}", help="allocated (reserved) slots / pool")
    c[5].metric("preemptions", m.num_preemptions, help="sequences evicted so far (swap or recompute)")
    text = slot_hover_text(snap, run.request_ids, run.token_text.get if run.token_text else None)
    shared = snap.slot_state == 4
    fig = pool_heatmap(snap.slot_state, snap.slot_owner, text, max(snap.block_size, 1),
                       f"{snap.num_slots:,} KV slots at step {snap.step}", shared_mask=shared)
    st.plotly_chart(fig, width="stretch", key=f"{KEY}_heat_{run.allocator}",
                    config={"displayModeBar": False})
    st.caption(f"waiting queue: {queue_text(snap, run.request_ids)} · finished {m.num_finished} · "
               f"rejected {m.num_rejected} · swapped {m.num_swapped}"
               + (f" · fragmented slots {m.fragmented_slots}" if run.allocator == "contiguous" else ""))


def queue_text(snap, request_ids, shown: int = 6) -> str:
    """The head of the waiting queue, in FCFS order, by request id."""
    if not snap.waiting:
        return "empty"
    by_seq = dict(zip(snap.seq_id.tolist(), snap.seq_request.tolist()))
    names = [request_ids[by_seq[s]] if by_seq.get(s, -1) in range(len(request_ids)) else str(s) for s in snap.waiting]
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def draw(runs: list[Run], step: int) -> None:
    """Both pools at ``step``, the legend, and the utilization curves (shared by play and guide)."""
    n = max(len(r.snapshots) for r in runs)
    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        with col:
            side(run, step)
    st.caption(LEGEND)
    series = {}
    for run in runs:
        ys = [s.metrics.token_utilization if s.metrics.allocated_slots else None for s in run.snapshots]
        series[f"{run.allocator} token utilization"] = ys
    fig = step_curves(range(n), series, "Token utilization over the run: filled slots / allocated slots",
                      "token utilization", current_step=step)
    st.plotly_chart(fig, width="stretch", key=f"{KEY}_curves", config={"displayModeBar": False})
    real = [r for r in runs if r.engine is not None]
    if real:
        st.markdown(f"**SmolLM2's answers so far** (greedy, so both allocators produce the same text; each "
                    f"request may ask for up to {REAL_MAX_TOKENS} tokens, and that is what the contiguous side reserves)")
        texts = {r.allocator: live_texts(r) for r in real}
        paged = texts.get("paged") or next(iter(texts.values()))
        contig = dict((rid, t) for rid, t, _ in texts.get("contiguous", []))
        rows = [{"request": rid, "paged": text, "contiguous": contig.get(rid, ""), "status": why}
                for rid, text, why in paged]
        st.dataframe(rows, hide_index=True, width="stretch", height=300)


def guide_steps(runs: list[Run]) -> list[guide.GuideStep]:
    """The walkthrough over the fixed run; every step number is read off the run itself."""
    contig, paged = runs
    first_finish = next(s.step for s in contig.snapshots if any(e.kind == "finish" for e in s.events))
    blocked = next((s.step for s in contig.snapshots[first_finish + 1:] if s.metrics.fragmented_slots > 0
                    and s.metrics.num_waiting > 0), None)
    preempt = next((s.step for s in paged.snapshots if s.metrics.step_preemptions), None)
    paged_end, contig_end = len(paged.snapshots) - 1, len(contig.snapshots) - 1
    c0, p0 = contig.snapshots[0].metrics, paged.snapshots[0].metrics
    steps = [
        guide.GuideStep("Forty requests arrive", (
            f"Step 0: all 40 requests of explainer40 arrive at once at a pool of 2,048 token slots. The contiguous "
            f"side must reserve prompt + max_tokens slots for each, so only {c0.num_running} fit; paging admits "
            f"{p0.num_running}, because each request only takes the blocks its prompt fills."), {"step": 0}),
        guide.GuideStep("Reservation waste", (
            "Orange on the left is reserved but empty: room kept for tokens an answer might produce. Most answers "
            f"stop early, so the left side's token utilization is {contig.at(10).metrics.token_utilization:.0%} "
            f"at step 10 against {paged.at(10).metrics.token_utilization:.0%} on the right."), {"step": 10}),
        guide.GuideStep("A request finishes", (
            f"Step {first_finish}: the first contiguous reservation is released. The next request in line needs a "
            f"whole reservation in one piece; only a run of free slots that long will do."), {"step": first_finish}),
    ]
    if blocked is not None:
        steps.append(guide.GuideStep("External fragmentation", (
            f"Step {blocked}: dusty-red slots are free, but they lie in holes too small for the next reservation, "
            f"so the queue waits although memory is free ({contig.at(blocked).metrics.fragmented_slots} slots)."),
            {"step": blocked}))
    if preempt is not None:
        steps.append(guide.GuideStep("Paging under pressure", (
            f"Step {preempt}: paging admitted so many requests that the pool is already full, and a running "
            "sequence needs a new block, so the scheduler "
            "preempts the most recently admitted sequence (recompute: its blocks are freed and it is prefilled "
            "again later). Contiguous never preempts: it paid for that safety up front."), {"step": preempt}))
    steps.append(guide.GuideStep("Internal fragmentation only", (
        "On the right, orange appears only at the end of each sequence's last block: paging wastes less than one "
        f"block per sequence. At step {paged_end // 2} the paged side holds "
        f"{paged.at(paged_end // 2).metrics.num_running} running sequences."), {"step": paged_end // 2}))
    steps.append(guide.GuideStep("Same work, fewer steps", (
        f"The paged side finishes all 40 requests at step {paged_end}; the contiguous side needs until step "
        f"{contig_end}. Same model, same memory: only the allocation policy differs."), {"step": paged_end}))
    return sorted(steps, key=lambda g: g.show["step"])  # scrubbing forward, like the run itself


def guided_runs() -> list[Run]:
    """The fixed, seeded scenario of the guide, whatever the sidebar says."""
    workload = build_workload("explainer40", seed=0)
    return [scripted_run(EngineConfig(allocator=a, pool_slots=2048, block_size=16), workload, a)
            for a in ("contiguous", "paged")]


if guide.mode(KEY, help="A fixed walkthrough of explainer40 (2,048 slots, block size 16, seed 0) with Next / Previous."):
    runs = guided_runs()
    draw(runs, guide.nav(KEY, guide_steps(runs)).show["step"])
else:
    runs = current_runs()
    if runs is None:
        st.stop()
    if runs[0].label.startswith("trace"):
        st.info(f"Replaying {runs[0].label} ({len(runs[0].snapshots)} steps). Remove the upload in the sidebar to run the engine again.")

    live = any(r.engine is not None and not r.done for r in runs)
    num_steps = max(len(r.snapshots) for r in runs)
    player.controls(KEY, num_steps, can_grow=live)
    for r in runs:
        if not r.done and r.engine is None:
            st.warning(f"The {r.label} run was cut short after {len(r.snapshots)} steps.")

    @st.fragment(run_every=player.interval(KEY))
    def show() -> None:
        if live and player.is_playing(KEY):
            step_live(runs, int(st.session_state.get(f"{KEY}_step", 0)))
        n = max(len(r.snapshots) for r in runs)
        step = player.tick(KEY, n, can_grow=live)
        player.slider(KEY, n)
        draw(runs, step)

    show()

st.markdown(
    """
**What you are looking at**
- **Reservation waste** (orange on the left): the contiguous allocator reserves prompt + `max_tokens`
  slots at admission. Most answers stop long before `max_tokens`, so most of each reservation never
  holds a token, yet nobody else may use it.
- **External fragmentation** (dusty red on the left): free slots between reservations, in holes too
  small for the next request's reservation. The queue waits although memory is free.
- **Internal fragmentation** (orange on the right): paging allocates one block at a time, so only the
  unfilled end of each sequence's last block is empty: less than one block per sequence.
- The result: the paged side runs many more requests at once (*running*) and finishes the same work in
  fewer steps.
"""
)
cols = st.columns(len(runs))
for col, run in zip(cols, runs):
    col.download_button(f"Download the {run.allocator} trace (.jsonl)", run.trace_bytes() if run.done else b"",
                        file_name=f"pagedkv-{run.allocator}.jsonl", mime="application/jsonl",
                        disabled=not run.done, key=f"{KEY}_dl_{run.allocator}")
