"""Lesson 4, under pressure: the same load spike on a pool too small for it, run twice on the real
model, once preempting by swap and once by recompute. The scenario, the costs read from both runs
(bytes moved, tokens recomputed, measured step times), the drawing, and the guide's narration."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.events import ADMIT, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN
from pagedkv_core.kv_math import format_bytes
from pagedkv_core.sampling import SamplingParams
from ui import guide, player, settings
from ui.figures import ALLOCATOR_COLORS, LEGEND, pool_heatmap, slot_hover_text
from ui.guide import GuideStep
from ui.lesson_figures import lines, status_timeline
from ui.models import chat_prompt
from ui.timed_runs import TimedRun, cached, new_timed_run

KEY = "pressure"
MODES = ("swap", "recompute")

# ---------------------------------------------------------------------------- the scenario
# A load spike on a pool too small for it; greedy, so both modes must agree.
PRESSURE_QUESTIONS = [
    "Explain what a CPU does.",
    "Why is the sky blue?",
    "How do plants make food?",
    "Why do we have seasons?",
    "Describe a cat to someone who has never seen one.",
    "What does a librarian do?",
]
PRESSURE_FIRST = 2  # requests at step 0; the rest arrive together at PRESSURE_SPIKE_STEP
PRESSURE_SPIKE_STEP = 2
PRESSURE_MAX_TOKENS = 32
PRESSURE_POOL_SLOTS = 256
GUIDE_BLOCK, GUIDE_POOL, GUIDE_WATERMARK = 16, PRESSURE_POOL_SLOTS, 0.1
POOL_CHOICES = [128, 160, 192, 224, 256, 320, 384, 512]


def pressure_run(make_engine, tokenizer, config: EngineConfig, max_tokens: int = PRESSURE_MAX_TOKENS) -> TimedRun:
    rec = new_timed_run(config.preemption, config, make_engine)
    for i, q in enumerate(PRESSURE_QUESTIONS):
        arrival = 0 if i < PRESSURE_FIRST else PRESSURE_SPIKE_STEP
        rec.add(f"r{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=max_tokens), text=q,
                arrival_step=arrival)
    return rec.run().release()


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
                 "sidebar. Guide mode uses blocks of 16, 256 slots, watermark 0.1.")
    return block_size, pool_slots, watermark, prefix_caching


def recorded_runs(block_size: int, pool_slots: int, watermark: float, prefix_caching: bool) -> dict[str, TimedRun]:
    """The spike under each preemption mode (swap pool: the config's default, the pool's size),
    cached; shows st.error and stops when the settings are invalid or the model cannot load."""
    try:
        configs = {m: EngineConfig(block_size=block_size, pool_slots=pool_slots, watermark=watermark, preemption=m,
                                   prefix_caching=prefix_caching) for m in MODES}
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    recs = {}
    for m in MODES:
        recs[m] = cached(pressure_run, configs[m], spinner=f"Running the spike with {m} on SmolLM2 (about 50 steps)…")
        if recs[m] is None:
            st.stop()
    for m, rec in recs.items():
        for rid, reason in rec.rejected.items():
            st.error(f"{m}: request {rid} was rejected: {reason}")
    return recs


def costs(rec: TimedRun) -> dict:
    out_b, in_b = rec.swap_bytes()
    return {
        "preemptions": len(rec.preemptions()),
        "bytes to host": out_b, "bytes back": in_b,
        "tokens lost": rec.preempted_tokens(), "tokens recomputed": rec.recomputed_tokens(),
        "steps": rec.num_steps, "total s": sum(rec.wall_s),
        "mean step s": sum(rec.wall_s) / max(1, len(rec.wall_s)),
    }


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


class PressureView:
    """Draws both runs (``recs``: mode -> run) side by side; ``text_of`` maps a token id to its text."""

    def __init__(self, recs: dict[str, TimedRun], text_of):
        self.recs = recs
        self.text_of = text_of
        config = recs["swap"].config
        self.block_size = config.block_size
        self.num_blocks = config.num_blocks
        self.reserve = config.watermark_blocks
        self.bpb = recs["swap"].bytes_per_block

    def preemption_lines(self, rec: TimedRun) -> list[str]:
        """One sentence per preemption: the victim, what happened to its blocks, and why it was chosen."""
        out = []
        for p in rec.preemptions():
            running = p["running_before"]
            what = (f"{p['blocks']} blocks copied to host ({format_bytes(p['blocks'] * self.bpb)})" if p["mode"] == "swap"
                    else f"{p['blocks']} blocks freed, to be recomputed")
            if running and running[-1] == p["victim"]:
                why = f"of the running {', '.join(running)}, it was admitted last"
            else:
                why = "evicted to make room"
            if p["mode"] == "recompute" and p["reason"] == "host pool full":
                why += "; the host pool was full, so it fell back to recompute"
            out.append(f"step {p['step']}: **{p['victim']}**, {what}. Why: {why}.")
        return out

    def side(self, mode: str, step: int) -> None:
        rec = self.recs[mode]
        snap = rec.at(step)
        k = costs(rec)
        st.subheader(f"Preempt by {mode}")
        c = st.columns(3)
        c[0].metric("preemptions", k["preemptions"])
        if mode == "swap":
            c[1].metric("moved to host", format_bytes(k["bytes to host"]), help="blocks swapped out × bytes per block")
            c[2].metric("moved back", format_bytes(k["bytes back"]), help="blocks swapped in × bytes per block")
        else:
            c[1].metric("tokens evicted", k["tokens lost"],
                        help="tokens whose K/V the victims held when they were evicted")
            c[2].metric("tokens recomputed", k["tokens recomputed"],
                        help="prefilled again on return (blocks still in the prefix cache are not recomputed)")
        c = st.columns(3)
        c[0].metric("engine steps", k["steps"])
        c[1].metric("total time", f"{k['total s']:.1f} s", help="sum of the measured wall time of every engine.step()")
        c[2].metric("mean step time", f"{k['mean step s'] * 1000:.0f} ms")
        hover = slot_hover_text(snap, rec.request_ids, self.text_of)
        fig = pool_heatmap(snap.slot_state, snap.slot_owner, hover, snap.block_size,
                           f"{mode}: {snap.num_slots} KV slots at step {snap.step}", height=260)
        st.plotly_chart(fig, width="stretch", key=f"{KEY}_heat_{mode}", config={"displayModeBar": False})
        pre = [(s, e.request_id) for s, e in rec.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE)]
        fig = status_timeline(rec, rec.request_ids, f"{mode}: each request's state per step (✕ = preempted)",
                              current_step=step, preemptions=pre)
        st.plotly_chart(fig, width="stretch", key=f"{KEY}_timeline_{mode}", config={"displayModeBar": False})
        free = [s.num_blocks - round(s.metrics.kv_usage * s.num_blocks) for s in map(rec.at, range(rec.num_steps))]
        reserve = self.reserve
        fig = lines(range(len(free)), {"free blocks": free}, f"{mode}: free blocks after each step", "engine step", "blocks",
                    colors={"free blocks": ALLOCATOR_COLORS[mode]},
                    hline=(reserve, f"watermark reserve: {reserve} block{'s' if reserve != 1 else ''}"),
                    current_x=step, height=260, markers=False)
        st.plotly_chart(fig, width="stretch", key=f"{KEY}_free_{mode}", config={"displayModeBar": False})
        rows = self.preemption_lines(rec)
        st.markdown(f"**{mode}: preemptions, and why each victim**")
        if rows:
            st.markdown("\n".join(f"- {r}" for r in rows))
            st.caption("The scheduler keeps first-come-first-served order and evicts from the back: the most recently "
                       "admitted sequence goes first, so the oldest requests keep running, finish and free their blocks.")
        else:
            st.caption("No preemption: with these settings the spike fits (or waits in the queue).")

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
        n = max(r.num_steps for r in recs.values())
        fig = lines(range(n), {m: [r.wall_s[i] * 1000 if i < len(r.wall_s) else None for i in range(n)] for m, r in recs.items()},
                    "Measured time of each engine step (ms): spikes are prefills, including recomputation",
                    "engine step", "milliseconds", colors=ALLOCATOR_COLORS, current_x=step, height=300, markers=False)
        st.plotly_chart(fig, width="stretch", key=f"{KEY}_steptime", config={"displayModeBar": False})
        st.caption("Wall-clock times are measured on this machine and vary from run to run when it is busy; the bytes, "
                   "blocks and token counts above do not.")

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

    def when_each_wins(self) -> None:
        s, r = costs(self.recs["swap"]), costs(self.recs["recompute"])
        bpb, block_size = self.bpb, self.block_size
        st.markdown(
            f"""
**When each wins**
- **Swap** moves bytes: each preempted token costs its K and V in every layer
  ({format_bytes(bpb // max(1, block_size))} per token for this model in fp32, {format_bytes(bpb)} per block of
  {block_size}), out and back. Here: {format_bytes(s['bytes to host'])} out and {format_bytes(s['bytes back'])} back.
  The cost grows linearly with the context and takes no compute, so swap wins for **long contexts** and for
  **forked groups** (parallel samples, beam search): recompute would re-prefill every sample's whole context, the shared
  prompt once per sample.
- **Recompute** spends compute: the victims' {r['tokens lost']} tokens must be prefilled again
  ({r['tokens recomputed']} after prefix-cache hits on its own freed blocks). A prefill runs all its tokens in parallel,
  so for **moderate prompts** it is cheap and needs no host memory or transfers; its attention cost grows with the
  square of the context, so long contexts make it expensive.
- On this CPU the "host pool" is the same RAM, so a swap is a plain memory copy; on a GPU it crosses PCIe
  (tens of GB/s), which is why vLLM defaults to recompute and keeps swap for the cases above.
- Total measured time here: swap {s['total s']:.1f} s in {s['steps']} steps, recompute {r['total s']:.1f} s in
  {r['steps']} steps.
"""
        )

    # ------------------------------------------------------------------------ guide
    def guide_steps(self) -> list[GuideStep]:
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
        return [
            GuideStep("A small pool", f"The pool holds {self.num_blocks} blocks of {self.block_size} token slots. The "
                      f"watermark keeps {reserve} block{'s' if reserve != 1 else ''} free for running sequences to grow "
                      f"into: admissions may not use it. {PRESSURE_FIRST} requests start.", {"step": 0}),
            GuideStep("The spike", f"{n_req - PRESSURE_FIRST} requests arrive at once. {len(admitted)} are admitted "
                      f"({', '.join(admitted) or 'none'}); {waiting} wait. Every running sequence grows by a token per step and "
                      "takes a new block whenever its last one is full.", {"step": spike}),
            GuideStep("The first preemption", f"At step {first['step']} the running sequences need more blocks than are free. "
                      f"The scheduler evicts {first['victim']}, the most recently admitted of "
                      f"{', '.join(first['running_before'])}: evicting from the back of the arrival order lets the oldest "
                      "requests finish and free their memory. Swap copies its "
                      f"{first['blocks']} blocks ({format_bytes(first['blocks'] * bpb)}) to host memory; recompute frees them.",
                      {"step": first["step"]}),
            GuideStep("Again", f"At step {second['step']} it happens again: {second['victim']} goes, for the same reason. The ✕ "
                      "marks in the timelines show every preemption; both modes choose the same victims.", {"step": second["step"]}),
            GuideStep("Coming back", f"When blocks free up, swap copies the victim's blocks back (step {back}), with its K/V "
                      f"intact; recompute re-admits it (step {readmit_step}) and prefills its tokens again. Look at the step-time "
                      "chart: the recompute run's re-admission steps are prefills.", {"step": back}),
            GuideStep("The bill", f"Swap moved {format_bytes(cs['bytes to host'])} to host and {format_bytes(cs['bytes back'])} "
                      f"back. Recompute lost {cr['tokens lost']} tokens of K/V and computed {cr['tokens recomputed']} again (the "
                      f"rest were still in the prefix cache). Measured totals: swap {cs['total s']:.1f} s, recompute "
                      f"{cr['total s']:.1f} s.", {"step": end}),
            GuideStep("Same answers", "Both runs produce exactly the same tokens for every request (the table below compares "
                      "token ids): preemption changes when a sequence runs, not what it says.", {"step": end}),
        ]

    def show_guide(self) -> None:
        try:
            steps = self.guide_steps()
        except (IndexError, KeyError):
            st.error("The guide's fixed run did not preempt anything, so there is nothing to walk through.")
            st.stop()
        self.compare(int(guide.nav(KEY, steps).show["step"]))

    def explore(self) -> None:
        n_steps = max(r.num_steps for r in self.recs.values())
        player.controls(KEY, n_steps)

        @st.fragment(run_every=player.interval(KEY))
        def show() -> None:
            step = player.tick(KEY, n_steps)
            player.slider(KEY, n_steps)
            self.compare(step)

        show()
