"""Lesson 1, reserve or page: the same requests on the same memory, contiguous reservations beside
paged blocks. Both sides, their curves, the live text, the guide over explainer40, and the player."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.events import FINISH
from pagedkv_core.workloads import build_workload
from ui import export, guide, player, pool_view, presenter
from ui.figures import LEGEND, free_pool_heatmap, snapshot_heatmap, step_curves
from ui.predict import Prediction, range_options
from ui.runs import REAL_MAX_TOKENS, Run, advance_live, allocator_title, live_texts, scripted_pair

KEY = "rop"
GUIDE_HELP = "A fixed walkthrough of explainer40 (2,048 slots, block size 16, seed 0) with Next / Previous."


def side_label(run: Run) -> str:
    label = allocator_title(run.allocator, run.at(0).block_size)
    return f"{label}, from {run.label}" if run.label.startswith("trace") else label


def empty_pool_figure(run: Run, height: int = 420):
    """The pool before step 0: every slot free (what a prediction asks about is still to come)."""
    snap = run.at(0)
    return free_pool_heatmap(snap.num_slots, max(snap.block_size, 1),
                             f"{snap.num_slots:,} KV slots before step 0: all free, {len(run.request_ids)} requests waiting",
                             height=height)[0]


def side(run: Run, step: int, conceal: bool = False, window=None) -> None:
    snap = run.at(step)
    m = snap.metrics
    st.subheader(side_label(run))
    if conceal:
        st.plotly_chart(empty_pool_figure(run), width="stretch", key=f"{KEY}_heat_{run.allocator}",
                        config=export.png_config(f"{KEY}-{run.allocator}"))
        st.caption(f"{len(run.request_ids)} requests waiting. Answer the prediction above to run step 0.")
        return
    c = st.columns(3) + st.columns(3)
    c[0].metric("running", m.num_running, help="sequences computed in this step")
    c[1].metric("waiting", m.num_waiting, help="requests queued for admission")
    c[2].metric("tokens this step", m.step_tokens, help="prefill + decode tokens computed in this step")
    c[3].metric("token utilization", f"{m.token_utilization:.0%}", help="slots holding a token / allocated slots")
    c[4].metric("KV usage", f"{m.kv_usage:.0%}", help="allocated (reserved) slots / pool")
    c[5].metric("preemptions", m.num_preemptions, help="sequences evicted so far (swap or recompute)")
    pool_view.pool_chart(snap, run.request_ids, f"{snap.num_slots:,} KV slots at step {snap.step}",
                         key=f"{KEY}_heat_{run.allocator}", window=window, token_text=run.token_text or None,
                         png_name=f"{KEY}-{run.allocator}")
    st.caption(f"waiting queue: {queue_text(snap, run.request_ids)} · finished {m.num_finished} · "
               f"rejected {m.num_rejected} · swapped {m.num_swapped}"
               + (f" · fragmented slots {m.fragmented_slots}" if run.kind == "contiguous" else ""))


def queue_text(snap, request_ids, shown: int = 6) -> str:
    """The head of the waiting queue, in FCFS order, by request id."""
    if not snap.waiting:
        return "empty"
    by_seq = dict(zip(snap.seq_id.tolist(), snap.seq_request.tolist()))
    names = [request_ids[by_seq[s]] if by_seq.get(s, -1) in range(len(request_ids)) else str(s) for s in snap.waiting]
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def utilization_series(runs: list[Run], upto: int | None = None) -> dict[str, list]:
    """Each run's token utilization per step; ``upto``: only the steps so far (None after it), so a
    prediction's situation does not show the answer."""
    n = max(r.num_steps for r in runs)
    out = {}
    for run in runs:
        ys = run.metric("token_utilization", steps=n, empty_as_none=True)
        out[f"{run.allocator} token utilization"] = ys if upto is None else ys[: upto + 1] + [None] * (n - upto - 1)
    return out


def draw(runs: list[Run], step: int, *, conceal: bool = False, upto: int | None = None) -> None:
    """Both pools at ``step``, the legend, and the utilization curves (shared by play and guide).
    ``conceal``: the pools before step 0; ``upto``: the curves only up to that step."""
    n = max(r.num_steps for r in runs)
    window = None if conceal else pool_view.zoom_control(KEY, runs[0].at(0).num_slots, max(r.at(0).block_size for r in runs))
    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        with col:
            side(run, step, conceal, window)
    st.caption(LEGEND)
    if conceal:
        return
    fig = step_curves(range(n), utilization_series(runs, upto), "Token utilization over the run: filled slots / allocated slots"
                      + (f" (up to step {upto}: the rest is still to come)" if upto is not None else ""),
                      "token utilization", current_step=step)
    fig.update_xaxes(range=[0, n - 1])
    st.plotly_chart(fig, width="stretch", key=f"{KEY}_curves", config=export.png_config(f"{KEY}-utilization"))
    real = [r for r in runs if r.engine is not None]
    if real:
        st.markdown(f"**SmolLM2's answers so far** (greedy, so both allocators produce the same text; each "
                    f"request may ask for up to {REAL_MAX_TOKENS} tokens, and that is what the contiguous side reserves)")
        texts = {r.kind: live_texts(r) for r in real}
        paged = texts.get("paged") or next(iter(texts.values()))
        contig = dict((rid, t) for rid, t, _ in texts.get("contiguous", []))
        rows = [{"request": rid, "paged": text, "contiguous": contig.get(rid, ""), "status": why}
                for rid, text, why in paged]
        st.dataframe(rows, hide_index=True, width="stretch", height=300)


FINISH_RANGES = [("sooner than the paged side", 1.0), ("up to 2× as many steps", 2.0),
                 ("2× to 3× as many steps", 3.0), ("more than 3× as many steps", float("inf"))]
UTILIZATION_RANGES = [("under 25%", 0.25), ("25% to 50%", 0.5), ("50% to 75%", 0.75), ("over 75%", float("inf"))]


def mean_reservation(run: Run, step: int = 0) -> float:
    """Mean slots held per sequence that holds any: for the contiguous allocator, its reservation."""
    held = run.at(step).seq_num_blocks
    held = held[held > 0]
    return float(held.mean()) if len(held) else 0.0


def guide_steps(runs: list[Run]) -> list[guide.GuideStep]:
    """The walkthrough over the fixed run; every step number and every answer is read off the run."""
    contig, paged = runs
    first_finish = contig.events(FINISH)[0][0]
    blocked = contig.first(lambda s: s.metrics.fragmented_slots > 0 and s.metrics.num_waiting > 0, start=first_finish + 1)
    preempt = paged.first(lambda s: s.metrics.step_preemptions)
    paged_end, contig_end = paged.num_steps - 1, contig.num_steps - 1
    c0, p0 = contig.at(0).metrics, paged.at(0).metrics
    n_req = len(contig.request_ids)
    pool = contig.at(0).num_slots
    reserve = mean_reservation(contig)
    u10 = contig.at(10).metrics.token_utilization
    ratio = (contig_end + 1) / (paged_end + 1)
    steps = [
        guide.GuideStep("Forty requests arrive", (
            f"Before step 0: all {n_req} requests of explainer40 wait at an empty pool of {pool:,} token slots. The "
            "contiguous side must reserve prompt + max_tokens slots for each request, in one piece, before it runs; "
            "paging takes only the blocks each prompt fills."), {"step": 0, "conceal": True},
            predict=Prediction(
                "rop_contiguous_running", f"Predict: how many of the {n_req} requests will the contiguous side run at once?",
                c0.num_running, f"Each reservation is prompt + max_tokens, {reserve:,.0f} slots on average here, so only "
                f"{c0.num_running} fit in {pool:,} slots; paging admitted {p0.num_running} in the same step, because each "
                "request takes only the blocks its prompt fills.", tolerance=1, unit="requests"),
            reveal={"conceal": False}),
        guide.GuideStep("Reservation waste", (
            "Orange on the left is reserved but empty: room kept for tokens an answer might produce, which nobody else "
            "may use. Each running request adds one token per step."), {"step": 0, "upto": 0},
            predict=Prediction(
                "rop_contiguous_utilization", "Predict: at step 10, what share of the contiguous side's reserved slots "
                "will hold a token?", why=f"Most answers stop long before max_tokens, so a reservation stays mostly "
                f"orange: {u10:.0%} at step 10, against {paged.at(10).metrics.token_utilization:.0%} on the paged side.",
                **range_options(u10, UTILIZATION_RANGES)),
            reveal={"step": 10, "upto": 10}),
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
            "sequence needs a new block, so the scheduler preempts the most recently admitted running sequence, the "
            "tail of its running list (vLLM v1's rule under first-come-first-served; recompute here: its blocks are "
            "freed and it is prefilled again later). Contiguous never preempts: it paid for that safety up front."),
            {"step": preempt}))
    steps.append(guide.GuideStep("Internal fragmentation only", (
        "On the right, orange appears only at the end of each sequence's last block: paging wastes less than one "
        f"block per sequence. At step {paged_end // 2} the paged side holds "
        f"{paged.at(paged_end // 2).metrics.num_running} running sequences."), {"step": paged_end // 2}))
    steps.append(guide.GuideStep("Same work, fewer steps", (
        f"The paged side finishes all {n_req} requests at step {paged_end}. Same model, same memory, same requests: "
        "only the allocation policy differs."), {"step": paged_end, "upto": paged_end},
        predict=Prediction(
            "rop_contiguous_finish", "Predict: compared with the paged side, how many steps will the contiguous side "
            "need to finish the same work?", why=f"The contiguous side ends at step {contig_end}, {ratio:.1f}× the paged "
            f"side's {paged_end + 1} steps: it ran about {c0.num_running} requests at a time where paging ran "
            f"{p0.num_running}.", **range_options(ratio, FINISH_RANGES)),
        reveal={"step": contig_end, "upto": None}))
    return sorted(steps, key=lambda g: g.show["step"])  # scrubbing forward, like the run itself


def draw_step(runs: list[Run], show: dict) -> None:
    """What a guide step shows (see :func:`guide_steps`): the step, concealed or with its curves cut."""
    draw(runs, int(show["step"]), conceal=bool(show.get("conceal")), upto=show.get("upto"))


def slide(runs: list[Run], show: dict) -> None:
    """Presenter mode: the two pools side by side in one figure, a line of numbers under each."""
    step = int(show["step"])
    if show.get("conceal"):
        figs = [empty_pool_figure(r) for r in runs]
        titles = [f"{side_label(r)}: {len(r.request_ids)} waiting" for r in runs]
    else:
        figs, titles = [], []
        for r in runs:
            snap = r.at(step)
            m = snap.metrics
            figs.append(snapshot_heatmap(snap, r.request_ids, "")[0])
            titles.append(f"{side_label(r)}: {m.num_running} running, {m.num_waiting} waiting, "
                          f"{m.token_utilization:.0%} of allocated slots hold a token")
    head = "before step 0" if show.get("conceal") else f"step {step}"
    presenter.slide(presenter.side_by_side(figs, titles, f"{runs[0].at(0).num_slots:,} KV slots each, {head}"), KEY,
                    LEGEND)


def guided_runs() -> list[Run]:
    """The fixed, seeded scenario of the guide, whatever the sidebar says."""
    return scripted_pair(build_workload("explainer40", seed=0), pool_slots=2048, block_size=16)


def explore(runs: list[Run]) -> None:
    """The player over the sidebar's runs: live runs step while playing, finished ones scrub."""
    if runs[0].label.startswith("trace"):
        st.info(f"Replaying {runs[0].label} ({runs[0].num_steps} steps). Remove the upload in the sidebar to run "
                "the engine again.")
    live = any(r.engine is not None and not r.done for r in runs)
    player.controls(KEY, max(r.num_steps for r in runs), can_grow=live, runs=runs)
    for r in runs:
        if not r.done and r.engine is None:
            st.warning(f"The {r.label} run was cut short after {r.num_steps} steps.")

    @st.fragment(run_every=player.interval(KEY))
    def show() -> None:
        if live:  # the engines step on their own thread; this asks for the steps to show next
            shown, playing = int(st.session_state.get(f"{KEY}_step", 0)), player.is_playing(KEY)
            # Play: the step after the one shown, and a second's worth more computed while this draws.
            # Step asked for the step after the last recorded: that one only. Paused: nothing more.
            advance_live(runs, shown + 1 if playing else shown, ahead=player.speed(KEY) if playing else 0)
        n = max(r.num_steps for r in runs)
        step = player.tick(KEY, n, can_grow=live)
        player.slider(KEY, n, runs=runs)
        draw(runs, step)

    show()


def download_buttons(runs: list[Run]) -> None:
    """Each run's trace, and both runs' heatmaps as one animated HTML file."""
    cols = st.columns(len(runs) + 1)
    with cols[-1]:
        export.download_animation(runs, KEY, "Reserve or page: contiguous reservations beside paged blocks",
                                  "reserve-or-page")
    for col, run in zip(cols, runs):
        col.download_button(f"Download the {run.allocator} trace (.jsonl)", run.trace_bytes if run.done else b"",
                            file_name=f"pagedkv-{run.allocator}.jsonl", mime="application/jsonl",
                            disabled=not run.done, key=f"{KEY}_dl_{run.allocator}", on_click="ignore")
