"""Lesson 1, reserve or page: the same requests on the same memory, contiguous reservations beside
paged blocks. Both sides, their curves, the live text, the guide over explainer40, and the player."""
from __future__ import annotations

import time

import streamlit as st

from pagedkv_core.events import FINISH
from pagedkv_core.workloads.scenarios import build_workload
from ui import export, guide, player, pool_view, presenter, run_events
from ui.figures import step_curves
from ui.pool_cells import LEGEND, SLIDE_LEGEND, free_pool_heatmap, snapshot_heatmap
from ui.predict import Prediction, range_options
from ui.lesson import Export, Lesson, sidebar_or_guided
from ui.models import tokenizer
from ui.runs.live import REAL_MAX_TOKENS, LiveRun, live_texts
from ui.runs.model import Run, allocator_title, still_stepping
from ui.runs.scripted import scripted_pair
from ui.runs.session import advance_live
from ui.live_chart import show_chart

KEY = "rop"
GUIDE_WORKLOAD, GUIDE_POOL, GUIDE_BLOCK, GUIDE_SEED = "explainer40", 2048, 16, 0
GUIDE_HELP = (f"A fixed walkthrough of {GUIDE_WORKLOAD} ({GUIDE_POOL:,} slots, block size {GUIDE_BLOCK}, seed {GUIDE_SEED}) "
              "with Next / Previous, whatever the sidebar says.")


def side_label(run: Run) -> str:
    label = allocator_title(run.allocator, run.at(0).block_size)
    return f"{label}, from {run.label}" if run.label.startswith("trace") else label


def empty_pool_figure(run: Run, height: int = 420):
    """The pool before step 0: every slot free (what a prediction asks about is still to come)."""
    snap = run.at(0)
    return free_pool_heatmap(snap.num_slots, max(snap.block_size, 1),
                             f"{snap.num_slots:,} KV slots before step 0: all free, {len(run.request_ids)} requests waiting",
                             height=height)[0]


POOL_HEIGHT = 360  # px: the pools start above the fold at 1280 x 720, under one row of player buttons


def side(run: Run, step: int, conceal: bool = False, window=None, grid_block: int | None = None) -> None:
    """One allocator's pool at ``step``, its numbers under it (the pool first: it is what a class
    looks at, and at 1280 x 720 it starts above the fold). ``grid_block``: the grid both sides share."""
    snap = run.at(step)
    m = snap.metrics
    st.markdown(f"#### {side_label(run)}")
    if conceal:
        show_chart(empty_pool_figure(run, POOL_HEIGHT), f"{KEY}_heat_{run.allocator}",
                   config=export.png_config(f"{KEY}-{run.allocator}"))
        st.caption(f"{len(run.request_ids)} requests waiting. Answer the prediction above to run step 0.")
        return
    pool_view.pool_chart(snap, run.request_ids, f"{snap.num_slots:,} KV slots at step {snap.step}",
                         key=f"{KEY}_heat_{run.allocator}", window=window, token_text=run.token_text if isinstance(run, LiveRun) else None,
                         png_name=f"{KEY}-{run.allocator}", height=POOL_HEIGHT,
                         grid_block=grid_block)
    c = st.columns(3) + st.columns(3)
    c[0].metric("running", m.num_running, help="sequences running at the end of this step (one that finished in "
                "it counts as finished): running + waiting + swapped + finished + rejected = the requests arrived")
    c[1].metric("waiting", m.num_waiting, help="requests queued for admission")
    c[2].metric("tokens this step", m.step_tokens, help="prefill + decode tokens computed in this step")
    c[3].metric("token utilization", f"{m.token_utilization:.0%}", help="slots holding a token / allocated slots")
    c[4].metric("KV usage", f"{m.kv_usage:.0%}", help="allocated (reserved) slots / pool")
    c[5].metric("preemptions", m.num_preemptions, help="sequences evicted so far (swap or recompute)")
    st.caption(f"waiting queue: {queue_text(snap, run.request_ids)} · finished {m.num_finished} · "
               f"rejected {m.num_rejected} · swapped {m.num_swapped}"
               + (f" · {admission_note(m)}" if run.kind == "contiguous" else ""))


def admission_note(m) -> str:
    """What decides the head of the queue's admission on a contiguous pool, from one step's metrics:
    it needs ``next_reservation`` slots in one free run. Runs shorter than that are external
    fragmentation (dusty red) whatever their size; a run that long (grey) takes it at the next step."""
    if not m.num_waiting:
        return f"nobody waits: no free slot is fragmented (largest free run {m.largest_free_run:,})"
    need, largest = m.next_reservation, m.largest_free_run
    if largest >= need:
        return (f"the head of the queue needs {need:,} slots in one run; the largest free run, {largest:,}, holds it, "
                f"so it is admitted at the next step")
    return (f"the head of the queue needs {need:,} slots in one run and the largest free run is {largest:,}: it waits, "
            f"and the {m.fragmented_slots:,} free slots in runs shorter than {need:,} are external fragmentation")


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


# While playing, the curves are drawn again at most this often (seconds): the pools change every
# step, the curves by a point, and the browser's time goes to the pools.
CURVES_EVERY_S = 1.0


def draw(runs: list[Run], step: int, *, conceal: bool = False, upto: int | None = None, scrub=None,
         playing: bool = False) -> None:
    """Both pools at ``step``, the legend, and the utilization curves (shared by play and guide).
    ``conceal``: the pools before step 0; ``upto``: the curves only up to that step; ``scrub``:
    drawn right under the pools (the player's slider and event strip, as under a video);
    ``playing``: the curves may lag the pools by up to :data:`CURVES_EVERY_S`."""
    n = max(r.num_steps for r in runs)
    unit = max(max(1, r.at(0).block_size) for r in runs)  # one grid: the contiguous side on the paged one's
    window = None if conceal else pool_view.zoom_control(KEY, runs[0].at(0).num_slots, unit)
    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        with col:
            side(run, step, conceal, window, unit)
    st.caption(LEGEND)
    if scrub is not None:
        scrub()
    if conceal:
        return
    def curves():
        fig = step_curves(range(n), utilization_series(runs, upto), "Token utilization over the run: filled slots / "
                          "allocated slots" + (f" (up to step {upto}: the rest is still to come)" if upto is not None else ""),
                          "token utilization", current_step=step)
        # a run still stepping: the axis of the event strip above (whole chunks of steps), so the
        # two charts' steps stay one above the other
        return fig.update_xaxes(range=[0, run_events.strip_extent(runs, n) - 1])

    show_chart(curves, f"{KEY}_curves", config=export.png_config(f"{KEY}-utilization"),
               hold_s=CURVES_EVERY_S if playing else None)
    real = [r for r in runs if r.engine is not None]
    if real:
        st.markdown(f"**SmolLM2's answers so far** (greedy, so both allocators produce the same text; each "
                    f"request may ask for up to {REAL_MAX_TOKENS} tokens, and that is what the contiguous side reserves)")
        st.dataframe(answers(real, held_s=ANSWERS_EVERY_S if playing else None), hide_index=True, width="stretch",
                     height=300)


# While playing, the answers table is read again at most this often (seconds), as the curves are: a
# table that changes by a token a request every step costs the server its decoding and the browser a
# new grid every frame.
ANSWERS_EVERY_S = 1.0
_ANSWERS = "rop_answers_held"


def answers(real: list[LiveRun], *, held_s: float | None = None) -> list[dict]:
    """The live runs' answers so far, one row a request (its paged and contiguous text, and its
    status); ``held_s``: the rows read less than this many seconds ago for the same runs are
    returned as they were (the same list, so the table's data is the same)."""
    now, who = time.monotonic(), tuple(id(r) for r in real)
    held = st.session_state.get(_ANSWERS)
    if held_s is not None and held is not None and held[1] == who and now - held[0] < held_s:
        return held[2]
    texts = {r.kind: live_texts(r, tokenizer()) for r in real}
    paged = texts.get("paged") or next(iter(texts.values()))
    contig = dict((rid, t) for rid, t, _ in texts.get("contiguous", []))
    rows = [{"request": rid, "paged": text, "contiguous": contig.get(rid, ""), "status": why}
            for rid, text, why in paged]
    st.session_state[_ANSWERS] = (now, who, rows)
    return rows


FINISH_RANGES = [("sooner than the paged side", 1.0), ("up to 2× as many steps", 2.0),
                 ("2× to 3× as many steps", 3.0), ("more than 3× as many steps", float("inf"))]
UTILIZATION_STEP = 10  # the step the second prediction asks about
UTILIZATION_RANGES = [("under 25%", 0.25), ("25% to 50%", 0.5), ("50% to 75%", 0.75), ("over 75%", float("inf"))]


def mean_reservation(run: Run, step: int = 0) -> float:
    """Mean slots held per sequence that holds any: for the contiguous allocator, its reservation."""
    held = run.at(step).seq_num_blocks
    held = held[held > 0]
    return float(held.mean()) if len(held) else 0.0


def guide_steps(runs: list[Run]) -> list[guide.GuideStep]:
    """The walkthrough over the fixed run; every step number and every answer is read off the run."""
    contig, paged = runs
    first_finish, finisher = contig.events(FINISH)[0]

    def head_waits(s) -> bool:  # free runs exist, but none is as long as the head's reservation
        m = s.metrics
        return m.num_waiting > 0 and 0 < m.largest_free_run < m.next_reservation

    blocked = contig.first(head_waits, start=first_finish)
    opens = None if blocked is None else contig.first(
        lambda s: s.metrics.num_waiting > 0 and s.metrics.largest_free_run >= s.metrics.next_reservation, start=blocked)
    preempt = paged.first(lambda s: s.metrics.step_preemptions)
    paged_end, contig_end = paged.num_steps - 1, contig.num_steps - 1
    c0, p0 = contig.at(0).metrics, paged.at(0).metrics
    n_req = len(contig.request_ids)
    pool = contig.at(0).num_slots
    reserve = mean_reservation(contig)
    u10 = contig.at(UTILIZATION_STEP).metrics.token_utilization
    ratio = (contig_end + 1) / (paged_end + 1)
    mean_c = sum(contig.metric("num_running")) / contig.num_steps
    mean_p = sum(paged.metric("num_running")) / paged.num_steps
    cfg = paged.config
    steps = [
        guide.GuideStep(f"{n_req} requests arrive", (
            f"Before step 0: all {n_req} requests of {GUIDE_WORKLOAD} wait at an empty pool of {pool:,} token slots. The "
            "contiguous side must reserve prompt + max_tokens slots for each request, in one piece, before it runs; "
            f"paging takes only the blocks each prompt fills. (The guide runs this fixed scenario, blocks of "
            f"{cfg.block_size} and seed {GUIDE_SEED}, whatever the sidebar says.)"), {"step": 0, "conceal": True},
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
                "rop_contiguous_utilization", f"Predict: at step {UTILIZATION_STEP}, what share of the contiguous side's reserved slots "
                "will hold a token?", why=f"Most answers stop long before max_tokens, so a reservation stays mostly "
                f"orange: {u10:.0%} at step {UTILIZATION_STEP}, against "
                f"{paged.at(UTILIZATION_STEP).metrics.token_utilization:.0%} on the paged side.",
                **range_options(u10, UTILIZATION_RANGES)),
            reveal={"step": UTILIZATION_STEP, "upto": UTILIZATION_STEP}),
        guide.GuideStep("A request finishes", (
            f"Step {first_finish}: {finisher.request_id} finishes, the first on the contiguous side, and its "
            "reservation is released. The next request in line needs a whole reservation in one piece; only a run of "
            "free slots that long will do."), {"step": first_finish}),
    ]
    if blocked is not None:
        snap = contig.at(blocked)
        bm = snap.metrics
        head = queue_text(snap, contig.request_ids, shown=1).split(" ")[0].rstrip(",")
        free = bm.fragmented_slots  # every free run is shorter than the head's reservation here
        later = ""
        if opens is not None:
            om = contig.at(opens).metrics
            later = (f" At step {opens} a finish leaves a free run of {om.largest_free_run:,} slots (grey: long enough), "
                     f"and the head of the queue is admitted into it at step {opens + 1}: admission happens at the "
                     "start of a step, on the pool the step before left.")
        steps.append(guide.GuideStep("External fragmentation", (
            f"Step {blocked}: {free:,} slots are free, but the largest free run is {bm.largest_free_run:,} slots and "
            f"the head of the queue, {head}, needs {bm.next_reservation:,} in one piece (prompt + max_tokens). So "
            f"every free slot is dusty red, external fragmentation, and the queue waits although memory is free."
            + later), {"step": blocked}))
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
        f"The paged side finishes all {n_req} requests at step {paged_end}, its last: {paged_end + 1:,} steps in all "
        "(counting from step 0). Same model, same memory, same requests: only the allocation policy differs."),
        {"step": paged_end, "upto": paged_end},
        predict=Prediction(
            "rop_contiguous_finish", "Predict: compared with the paged side, how many steps will the contiguous side "
            "need to finish the same work?", why=f"The contiguous side's last step is step {contig_end}: "
            f"{contig_end + 1:,} steps against the paged side's {paged_end + 1:,}, {ratio:.1f}× as many. On average "
            f"{mean_c:.1f} requests ran at a time on the contiguous side, {mean_p:.1f} on the paged side.",
            **range_options(ratio, FINISH_RANGES)),
        reveal={"step": contig_end, "upto": None}))
    return sorted(steps, key=lambda g: g.show["step"])  # scrubbing forward, like the run itself


def draw_step(runs: list[Run], show: dict) -> None:
    """What a guide step shows (see :func:`guide_steps`): the step, concealed or with its curves cut."""
    draw(runs, int(show["step"]), conceal=bool(show.get("conceal")), upto=show.get("upto"))


def slide(runs: list[Run], show: dict) -> None:
    """Presenter mode: the two pools side by side in one figure, a line of numbers under each."""
    pools_slide(runs, int(show["step"]), conceal=bool(show.get("conceal")))


def pools_slide(runs: list[Run], step: int, *, conceal: bool = False) -> None:
    """The two pools at ``step`` side by side in one large figure (the guide's slide, and free play
    in presenter mode)."""
    unit = max(max(1, r.at(0).block_size) for r in runs)
    if conceal:
        figs = [empty_pool_figure(r) for r in runs]
        titles = [f"{side_label(r)}: {len(r.request_ids)} waiting" for r in runs]
    else:
        figs, titles = [], []
        for r in runs:
            snap = r.at(step)
            m = snap.metrics
            figs.append(snapshot_heatmap(snap, r.request_ids, "", grid_block=unit)[0])
            titles.append(f"{side_label(r)}: {m.num_running} running, {m.num_waiting} waiting, "
                          f"{m.token_utilization:.0%} of allocated slots hold a token")
    head = "before step 0" if conceal else f"step {step}"
    notes = [] if conceal else [f"{side_label(r)}: {admission_note(r.at(step).metrics)}" for r in runs
                                if r.kind == "contiguous"]
    presenter.slide(presenter.side_by_side(figs, titles, f"{runs[0].at(0).num_slots:,} KV slots each, {head}"), KEY,
                    " · ".join([SLIDE_LEGEND] + notes))


def guided_runs() -> list[Run]:
    """The fixed, seeded scenario of the guide, whatever the sidebar says."""
    return scripted_pair(build_workload(GUIDE_WORKLOAD, seed=GUIDE_SEED), pool_slots=GUIDE_POOL, block_size=GUIDE_BLOCK)


def explore(runs: list[Run]) -> None:
    """The player over the sidebar's runs: live runs step while playing, finished ones scrub."""
    if runs[0].label.startswith("trace"):
        st.info(f"Replaying {runs[0].label} ({runs[0].num_steps} steps). Remove the upload in the sidebar to run "
                "the engine again.")
    live = any(still_stepping(r) for r in runs)
    player.controls(KEY, max(r.num_steps for r in runs), can_grow=live, runs=runs)
    for r in runs:
        if not r.done and r.engine is None:
            st.warning(f"The {r.label} run was cut short after {r.num_steps} steps.")

    @st.fragment(run_every=player.interval(KEY, computing=live))
    def show() -> None:
        if live:  # the engines step on their own thread; this asks for the steps to show next
            shown, playing = int(st.session_state.get(f"{KEY}_step", 0)), player.is_playing(KEY)
            # Play: the step after the one shown, and a second's worth more computed while this draws.
            # Step asked for the step after the last recorded: that one only. Paused: nothing more.
            advance_live(runs, shown + 1 if playing else shown, ahead=player.speed(KEY) if playing else 0)
        n = max(r.num_steps for r in runs)
        step = player.tick(KEY, n, can_grow=live)
        if presenter.on(KEY):  # free play on a projector: both pools in one figure, the slider under it
            presenter.fit(False)
            pools_slide(runs, step)
            player.slider(KEY, n, runs=runs)
            return
        draw(runs, step, scrub=lambda: player.slider(KEY, n, runs=runs), playing=player.is_playing(KEY))

    show()


def export_files(runs: list[Run]) -> Export:
    """Each run's trace, and both runs' heatmaps as one animated HTML file."""
    return Export(runs, "Reserve or page: contiguous reservations beside paged blocks", "reserve-or-page", traces=True)


LESSON = Lesson(key=KEY, title="Reserve or page", help=GUIDE_HELP,
                scenario=sidebar_or_guided(guided_runs), guide_steps=guide_steps,
                guide_view=draw_step, slide=slide, explore=explore, export=export_files)
