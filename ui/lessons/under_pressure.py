"""Lesson 4, under pressure: the same load spike on a pool too small for it, run twice on the real
model, once preempting by swap and once by recompute. This module is the lesson: both runs drawn
at one step, the guide's narration and predictions, its slides, and the :class:`~ui.lesson.Lesson`.
Its parts, one job each: the scenario (:mod:`ui.lessons.pressure_scenario`), the bill, what each
mode's work cost (:mod:`ui.lessons.pressure_bill`), and the figures
(:mod:`ui.lessons.pressure_figures`)."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.events import ADMIT, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN
from pagedkv_core.sizing.kv_math import format_bytes
from ui import export, player, presenter, settings
from ui.costs import CostModel, rate
from ui.pool_cells import LEGEND
from ui.guide import GuideStep
from ui.lesson import Export, Lesson
from ui.lessons.pressure_bill import Bill, cost_model, costs, measured_cost_model  # noqa: F401 (cost_model: tests)
from ui.lessons.pressure_figures import cost_figure, free_figure, pool_figure, steptime_figure, timeline_figure
from ui.lessons.pressure_scenario import (  # noqa: F401 (pressure_pair, pressure_run: the scenario, for tests)
    GUIDE_BLOCK, GUIDE_POOL, GUIDE_WATERMARK, MODES, POOL_CHOICES, PRESSURE_FIRST, PRESSURE_MAX_TOKENS,
    PRESSURE_POOL_SLOTS, PRESSURE_QUESTIONS, PRESSURE_SPIKE_STEP, pressure_pair, pressure_run, recorded_runs)
from ui.models import token_text_lookup
from ui.predict import Prediction
from ui.timed_runs import TimedRun
from ui.live_chart import show_chart

KEY = "pressure"


def settings_for(guided: bool) -> tuple[int, int, float, bool]:
    """(block size, pool slots, watermark, prefix caching): the guide's fixed ones, or this page's
    pool and watermark widgets with the sidebar's block size and prefix caching."""
    if guided:
        return GUIDE_BLOCK, GUIDE_POOL, GUIDE_WATERMARK, True
    c = st.columns([2, 2, 3])
    pool_slots = c[0].select_slider("Pool for this lesson (token slots)", POOL_CHOICES, value=PRESSURE_POOL_SLOTS,
                                    key=f"{KEY}_pool", help="Small on purpose, so that the spike overflows it. "
                                    "The sidebar's pool size is for the workload pages.")
    watermark = c[1].slider("Watermark (share of blocks admissions leave free)", 0.0, 0.3, GUIDE_WATERMARK, 0.05,
                            key=f"{KEY}_watermark")
    block_size = int(settings.current("block_size"))
    prefix_caching = bool(settings.current("prefix_caching"))
    c[2].caption(f"Block size {block_size} and prefix caching {'on' if prefix_caching else 'off'} come from the "
                 f"sidebar. Guide mode uses blocks of {GUIDE_BLOCK}, {GUIDE_POOL} slots, watermark {GUIDE_WATERMARK}.")
    return block_size, pool_slots, watermark, prefix_caching


def events_at(rec: TimedRun, step: int) -> list[str]:
    """What the scheduler did at ``step``, one phrase per preemption, swap-in, admission or finish."""
    out = []
    for e in rec.at(step).events:
        if e.kind == PREEMPT_SWAP:
            out.append(f"{e.request_id} swapped out: {len(e.detail['host_blocks'])} blocks to host")
        elif e.kind == PREEMPT_RECOMPUTE:
            out.append(f"{e.request_id} preempted: {len(e.detail['blocks'])} blocks freed")
        elif e.kind == SWAP_IN:
            out.append(f"{e.request_id} swapped in: {len(e.detail['host_blocks'])} blocks back")
        elif e.kind == ADMIT and e.detail.get("recompute"):
            out.append(f"{e.request_id} re-admitted to recompute ({e.detail['cached_tokens']} tokens still cached)")
        elif e.kind == ADMIT:
            out.append(f"{e.request_id} admitted")
        elif e.kind == FINISH:
            out.append(f"{e.request_id} finished")
    return out


VICTIM_RULE = ("the engine preempts the most recently admitted running sequence: the tail of its running list, "
               "which it keeps in admission order (a sequence swapped back in or re-admitted joins the tail), as vLLM "
               "v1 does under first-come-first-served")
RECOMPUTE_OPTIONS = ("all of them", "some: the prefix cache still holds the rest", "none")


class PressureView:
    """Draws both runs (``recs``: mode -> run) side by side; ``text_of`` maps a token id to its text;
    ``model``: the modelled costs at the measured rates (None: not measured)."""

    def __init__(self, recs: dict[str, TimedRun], text_of, model: CostModel | None = None):
        self.recs = recs
        self.text_of = text_of
        self.model = model
        config = recs["swap"].config
        self.block_size = config.block_size
        self.num_blocks = config.num_blocks
        self.reserve = config.watermark_blocks
        self.bpb = recs["swap"].bytes_per_block
        self.bill = Bill(recs, model)

    def preemption_lines(self, rec: TimedRun, upto: int | None = None) -> list[str]:
        """One sentence per preemption up to step ``upto``: the victim, what happened to its blocks, and
        why it was chosen (several preemptions in one step take the running list's tail one after the other)."""
        out = []
        running, at_step = [], None
        for p in rec.preemptions(upto):
            if p["step"] != at_step:
                running, at_step = list(p["running_before"]), p["step"]
            what = (f"{p['blocks']} blocks copied to host ({format_bytes(p['blocks'] * self.bpb)})" if p["mode"] == "swap"
                    else f"{p['blocks']} blocks freed, to be recomputed")
            if running and running[-1] == p["victim"]:
                why = f"of the running {', '.join(running)} (in admission order), it was admitted last"
                running.pop()
            else:
                why = "evicted to make room"
            if p["mode"] == "recompute" and p["reason"] == "host pool full":
                why += "; the host pool was full, so it fell back to recompute"
            out.append(f"step {p['step']}: **{p['victim']}**, {what}. Why: {why}.")
        return out

    # ------------------------------------------------------------------------ drawing
    def side(self, mode: str, step: int) -> None:
        rec = self.recs[mode]
        k = costs(rec, step)
        st.subheader(f"Preempt by {mode}")
        c = st.columns(3)
        c[0].metric("preemptions", k["preemptions"], help="so far, up to this step")
        if mode == "swap":
            c[1].metric("moved to host", format_bytes(k["bytes to host"]), help="so far: blocks swapped out × bytes per block")
            c[2].metric("moved back", format_bytes(k["bytes back"]), help="so far: blocks swapped in × bytes per block")
        else:
            c[1].metric("tokens evicted", k["tokens lost"],
                        help="so far: tokens whose K/V the victims held when they were evicted")
            c[2].metric("tokens recomputed", k["tokens recomputed"],
                        help="so far: prefilled again on return (blocks still in the prefix cache are not recomputed)")
        c = st.columns(3)
        c[0].metric("engine steps", k["steps"])
        c[1].metric("whole-run time (measured)", f"{k['total s']:.1f} s", help="sum of the measured wall time of every "
                    "engine.step(), decodes and prefills included (the two runs were stepped in turn, so the machine's "
                    "load weighs on both alike); the bill compares the modelled cost of the preemption work alone")
        c[2].metric("mean step time", f"{k['mean step s'] * 1000:.0f} ms")
        show_chart(pool_figure(rec, mode, step, self.text_of), f"{KEY}_heat_{mode}",
                   config=export.png_config(f"{KEY}-{mode}-pool"))
        show_chart(timeline_figure(rec, mode, step), f"{KEY}_timeline_{mode}",
                   config=export.png_config(f"{KEY}-{mode}-timeline"))
        show_chart(free_figure(rec, mode, step, self.reserve), f"{KEY}_free_{mode}",
                   config=export.png_config(f"{KEY}-{mode}-free"))
        rows = self.preemption_lines(rec, step)
        st.markdown(f"**{mode}: preemptions so far, and why each victim**")
        if rows:
            st.markdown("\n".join(f"- {r}" for r in rows))
            st.caption(f"Which one goes: {VICTIM_RULE}. So the sequences admitted first keep running, finish and free their "
                       "blocks.")
        else:
            st.caption("No preemption yet at this step." if rec.preemptions() else
                       "No preemption: with these settings the spike fits (or waits in the queue).")

    def compare(self, step: int) -> None:
        recs = self.recs
        c = st.columns(2)
        for col, m in zip(c, MODES):
            with col:
                ev = events_at(recs[m], step)
                st.markdown(f"**{m}, step {min(step, recs[m].last_step)}:** " + ("; ".join(ev) if ev else "decode only"))
        c = st.columns(2)
        for col, m in zip(c, MODES):
            with col:
                self.side(m, step)
        st.caption(LEGEND)
        show_chart(steptime_figure(self.recs, step), f"{KEY}_steptime", config=export.png_config(f"{KEY}-step-times"))
        st.caption("Wall-clock times are measured on this machine. The two runs were stepped in turn (a swap step, a "
                   "recompute step, and so on), so load from anything else running weighs on both alike; the bytes, "
                   "blocks and token counts do not depend on the machine at all.")

    def outputs_table(self) -> None:
        a, b = self.recs["swap"], self.recs["recompute"]
        rows = []
        same_all = True
        for rid in a.request_ids:
            ta, tb = a.output_ids(rid), b.output_ids(rid)
            same = ta == tb
            same_all &= same
            text = "".join(self.text_of(t) for t in (ta[0] if ta else [])).replace("\n", " ")
            rows.append({"request": rid, "same token ids in both runs": "✓ identical" if same else "✗ differ",
                         "tokens": len(ta[0]) if ta else 0, "question": a.requests[rid].text,
                         "SmolLM2's answer (swap run)": text})
        if same_all:
            st.success("Both runs produced exactly the same token ids for every request: preemption changes when a "
                       "sequence runs, never what it says.", icon=":material/check_circle:")
        else:
            st.error("The two runs produced different tokens for at least one request (see the table).")
        st.dataframe(rows, hide_index=True, width="stretch")

    def answers(self, with_costs: bool) -> None:
        """Both runs' answers, compared; then what each mode cost and when each wins (``with_costs``),
        or a line saying that the bill comes with the guide."""
        st.markdown("**The answers, and whether both runs agree**")
        self.outputs_table()
        if with_costs:
            self.bill.when_each_wins()
        else:
            st.caption("What each mode cost, and when each wins, come with the guide's bill, after you have predicted it.")

    # ------------------------------------------------------------------------ guide
    def guide_steps(self) -> list[GuideStep]:
        """The walkthrough; every step number and every answer is read off the two runs (and the
        measured rates). ``show``: the step, the slide's figure, and ``costs`` once the bill is out."""
        sw, rc = self.recs["swap"], self.recs["recompute"]
        pre_s = sw.preemptions()
        first = pre_s[0]
        second = pre_s[1] if len(pre_s) > 1 else first
        back = sw.events(SWAP_IN)[0][0] if sw.events(SWAP_IN) else first["step"] + 1
        readmit = [s for s, e in rc.events(ADMIT) if e.detail.get("recompute")]
        readmit_step = readmit[0] if readmit else back
        cs, cr = costs(sw), costs(rc)
        spike = PRESSURE_SPIKE_STEP
        admitted = [e.request_id for e in sw.at(spike).events if e.kind == ADMIT]
        waiting = sw.at(spike).metrics.num_waiting
        n_req = len(PRESSURE_QUESTIONS)
        reserve, bpb = self.reserve, self.bpb
        end = max(sw.num_steps, rc.num_steps) - 1
        before = first["step"] - 1
        free_before = sw.at(before).num_blocks - round(sw.at(before).metrics.kv_usage * sw.at(before).num_blocks)
        running = first["running_before"]
        lost, recomputed, hits = cr["tokens lost"], cr["tokens recomputed"], cr["tokens from the cache"]
        needed = cr["tokens needed again"]
        same_victims = [p["victim"] for p in pre_s] == [p["victim"] for p in rc.preemptions()]
        same_answers = all(sw.output_ids(rid) == rc.output_ids(rid) for rid in sw.request_ids)
        rc_answer = (RECOMPUTE_OPTIONS[2] if recomputed == 0 else
                     RECOMPUTE_OPTIONS[0] if recomputed >= lost else RECOMPUTE_OPTIONS[1])
        steps = [
            GuideStep("A small pool", f"The pool holds {self.num_blocks} blocks of {self.block_size} token slots. The "
                      f"watermark keeps {reserve} block{'s' if reserve != 1 else ''} free for running sequences to grow "
                      f"into: admissions may not use it. {PRESSURE_FIRST} requests start. (The guide uses this small pool "
                      "and its own requests, whatever the sidebar says.)", {"step": 0, "figure": "free"}),
            GuideStep("The spike", f"{n_req - PRESSURE_FIRST} requests arrive at once. {len(admitted)} are admitted "
                      f"({', '.join(admitted) or 'none'}); {waiting} wait. Every running sequence grows by a token per step and "
                      "takes a new block whenever its last one is full.", {"step": spike, "figure": "timeline"}),
            GuideStep("Who goes?", f"Step {before}: {', '.join(running)} are running, listed in the order they were "
                      f"admitted, and {free_before} block{'s are' if free_before != 1 else ' is'} free. At the next step "
                      "a running sequence will need a block that is not there, and the scheduler must evict one.",
                      {"step": before, "figure": "timeline"},
                      predict=Prediction(
                          "pressure_victim", "Predict: which sequence will the scheduler preempt?", first["victim"],
                          f"The engine evicts the most recently admitted running sequence, the tail of its running list "
                          f"(vLLM v1's rule under first-come-first-served): of {', '.join(running)}, "
                          f"{first['victim']} was admitted last.", options=tuple(dict.fromkeys(running))),
                      reveal={"step": first["step"]}),
            GuideStep("The first preemption", f"At step {first['step']} the running sequences need more blocks than are "
                      f"free. The scheduler evicts {first['victim']}: {VICTIM_RULE}, so the sequences admitted first finish and "
                      f"free their memory. Swap copies its {first['blocks']} blocks "
                      f"({format_bytes(first['blocks'] * bpb)}) to host memory; recompute frees them.",
                      {"step": first["step"], "figure": "timeline"}),
            GuideStep("Again", f"At step {second['step']} it happens again: {second['victim']} goes, for the same reason. The ✕ "
                      "marks in the timelines show every preemption; "
                      + ("both modes choose the same victims, in the same order." if same_victims else
                         f"the two modes' victims differ: swap evicts {', '.join(p['victim'] for p in pre_s)}, recompute "
                         f"{', '.join(p['victim'] for p in rc.preemptions())}."),
                      {"step": second["step"], "figure": "timeline"}),
        ]
        if readmit:
            steps.append(GuideStep(
                "Coming back", f"When blocks free up, swap copies a victim's blocks back (step {back}), its K/V intact. "
                f"Recompute re-admits it (step {readmit_step}) and must prefill its tokens again; the victims held "
                f"{lost} tokens of K/V when they were evicted, and each also comes back with the token it had just "
                f"sampled, whose K/V was never written: {needed} tokens in all need their K/V again. Their freed full "
                "blocks kept their hashes.",
                {"step": max(0, readmit_step - 1), "figure": "steptime"},
                predict=Prediction(
                    "pressure_recomputed", f"Predict: of the {lost} evicted tokens, how many will the recompute run "
                    "prefill again?", rc_answer,
                    f"Of the {needed} tokens needed again ({lost} evicted + {needed - lost} sampled but not yet "
                    f"written), {hits} came back from the prefix cache and {recomputed} were prefilled again: a "
                    "victim's full blocks keep their hash after they are freed, and nothing had reused them yet.",
                    options=RECOMPUTE_OPTIONS),
                reveal={"step": readmit_step}))
        if self.model is not None:
            m = self.model
            options = ("swap: copying the blocks out and back", "recompute: prefilling the tokens again", "about the same")
            answer = options[2] if m.factor < 1.5 else options[0] if m.winner == "swap" else options[1]
            steps.append(GuideStep(
                "The bill", f"Swap moved {format_bytes(cs['bytes to host'])} to host and {format_bytes(cs['bytes back'])} "
                f"back. Recompute prefilled {recomputed} tokens again at {m.flops_per_token / 1e9:.2f} GFLOP each. This "
                f"machine copies memory at {rate(m.rates.copy_bytes_per_s, 'B')} and multiplies matrices at "
                f"{rate(m.rates.flops_per_s, 'FLOP')} (measured just now).", {"step": end, "figure": "steptime"},
                predict=Prediction("pressure_cheaper", "Predict: for this spike, which mode's preemption work (copying "
                                   "blocks, or prefilling evicted tokens again) costs less on this machine?",
                                   answer, self.bill.verdict().replace("**", "") + " " + self.bill.measured_note()
                                   + " " + self.bill.whole_run_note(), options=options,
                                   source="Modelled from this run's work at this machine's measured rates"),
                reveal={"figure": "costs", "costs": True}))
        steps.append(GuideStep("Same answers", (f"Both runs produce exactly the same tokens for all {n_req} requests (the "
                               "table below compares token ids): preemption changes when a sequence runs, not what it "
                               "says.") if same_answers else "The two runs' tokens differ for at least one request "
                               "(the table below compares token ids): that would be a bug, since preemption should "
                               "change only when a sequence runs.",
                               {"step": end, "figure": "costs" if self.model is not None else "steptime", "costs": True}))
        return steps

    def slide(self, show: dict) -> None:
        """Presenter mode: the step's one figure (both timelines, free blocks, step times or the costs)."""
        step, which = int(show["step"]), show.get("figure", "timeline")
        if which == "costs" and self.model is not None:
            presenter.slide(cost_figure(self.recs, self.model), KEY, self.bill.verdict().replace("**", ""))
        elif which == "steptime":
            presenter.slide(steptime_figure(self.recs, step), KEY)
        elif which == "free":
            presenter.slide(presenter.side_by_side([free_figure(self.recs[m], m, step, self.reserve) for m in MODES],
                                                   [f"{m}: free blocks" for m in MODES], f"Free blocks, step {step}",
                                                   heatmaps=False), KEY)
        else:
            presenter.slide(presenter.side_by_side([timeline_figure(self.recs[m], m, step) for m in MODES],
                                                   [f"preempt by {m}" for m in MODES],
                                                   f"Each request's state per step, step {step} (✕ = preempted)",
                                                   heatmaps=False), KEY,
                            "grey = waiting · blue = running · teal = swapped out to host · magenta = preempted, waits to "
                            "recompute · blank = finished")

    def explore(self) -> None:
        n_steps = max(r.num_steps for r in self.recs.values())
        runs = [self.recs[m] for m in MODES]
        player.controls(KEY, n_steps, runs=runs)

        @st.fragment(run_every=player.interval(KEY))
        def show() -> None:
            step = player.tick(KEY, n_steps)
            player.slider(KEY, n_steps, runs=runs)
            self.compare(step)

        show()


def scenario(guided: bool) -> PressureView:
    """The spike under both modes (the guide's fixed pool, or this page's widgets), with the bill
    at this machine's measured rates."""
    recs = recorded_runs(*settings_for(guided))
    return PressureView(recs, token_text_lookup(), measured_cost_model(recs))


def lesson_steps(view: PressureView) -> list[GuideStep]:
    try:
        return view.guide_steps()
    except (IndexError, KeyError):
        st.error("The guide's fixed run did not preempt anything, so there is nothing to walk through.")
        st.stop()


def guide_view(view: PressureView, show: dict) -> None:
    """A guide step: both runs at its step, the answers, and the bill once it is out."""
    view.compare(int(show["step"]))
    view.answers(bool(show.get("costs")))


def explore(view: PressureView) -> None:
    """Free play: the player over both runs, the answers and the bill."""
    view.explore()
    view.answers(True)


def export_files(view: PressureView) -> Export:
    return Export([view.recs[m] for m in MODES], "Under pressure: the spike preempted by swap and by recompute",
                  "under-pressure")


LESSON = Lesson(key=KEY, title="Under pressure: swap versus recompute", scenario=scenario, guide_steps=lesson_steps,
                guide_view=guide_view, slide=lambda view, show: view.slide(show), explore=explore, export=export_files)
