"""Lesson 4, under pressure: the same load spike on a pool too small for it, run twice on the real
model, once preempting by swap and once by recompute. The scenario, the costs read from both runs
(bytes moved, tokens recomputed, measured step times), the drawing, and the guide's narration and
predictions.

The two runs are stepped in turn (:func:`pressure_pair`), so the machine's load weighs on both
alike, and which mode is cheaper is decided by the work each did at this machine's measured copy
bandwidth and FLOP rate (:mod:`ui.costs`), not by two wall-clock totals that a busy neighbour can
skew 30-fold."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.events import ADMIT, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.sampling import SamplingParams
from ui import export, guide, player, presenter, settings
from ui.costs import COPY_BYTES, MATMUL_N, PCIE_NAME, CostModel, Rates, flops_per_token, measure_rates, rate, seconds
from ui.figures import ALLOCATOR_COLORS
from ui.guide import GuideStep
from ui.lesson_figures import lines, status_timeline, value_bars
from ui.models import chat_prompt, loaded_model
from ui.pool_cells import LEGEND, snapshot_heatmap
from ui.predict import Prediction
from ui.timed_runs import TimedRun, cached, new_timed_run, run_interleaved
from ui.live_chart import show_chart

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


def add_pressure_requests(rec: TimedRun, tokenizer, max_tokens: int = PRESSURE_MAX_TOKENS) -> TimedRun:
    for i, q in enumerate(PRESSURE_QUESTIONS):
        arrival = 0 if i < PRESSURE_FIRST else PRESSURE_SPIKE_STEP
        rec.add(f"r{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=max_tokens), text=q, arrival_step=arrival)
    return rec


def pressure_run(make_engine, tokenizer, config: EngineConfig, max_tokens: int = PRESSURE_MAX_TOKENS) -> TimedRun:
    """The spike under ``config``'s preemption mode, alone."""
    rec = add_pressure_requests(new_timed_run(config.preemption, config, make_engine), tokenizer, max_tokens)
    return rec.run().release()


def pressure_pair(make_engine, tokenizer, swap_config: EngineConfig, recompute_config: EngineConfig,
                  max_tokens: int = PRESSURE_MAX_TOKENS) -> dict[str, TimedRun]:
    """The spike under both modes, run interleaved step by step (:func:`ui.timed_runs.run_interleaved`)
    so that their measured step times share the machine's load."""
    recs = {m: add_pressure_requests(new_timed_run(m, cfg, make_engine), tokenizer, max_tokens)
            for m, cfg in (("swap", swap_config), ("recompute", recompute_config))}
    run_interleaved(list(recs.values()))
    return {m: r.release() for m, r in recs.items()}


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


def recorded_runs(block_size: int, pool_slots: int, watermark: float, prefix_caching: bool) -> dict[str, TimedRun]:
    """The spike under each preemption mode (swap pool: the config's default, the pool's size),
    cached; shows st.error and stops when the settings are invalid or the model cannot load."""
    try:
        configs = {m: EngineConfig(block_size=block_size, pool_slots=pool_slots, watermark=watermark, preemption=m,
                                   prefix_caching=prefix_caching) for m in MODES}
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    try:
        recs = cached(pressure_pair, configs["swap"], configs["recompute"],
                      spinner="Running the spike with swap and with recompute on SmolLM2, a step of each in turn…")
    except ConfigError as exc:  # the pools would not fit the memory budget (BudgetError)
        st.error(str(exc))
        st.stop()
    if recs is None:
        st.stop()
    for m, rec in recs.items():
        for rid, reason in rec.rejected.items():
            st.error(f"{m}: request {rid} was rejected: {reason}")
    return recs


def costs(rec: TimedRun, upto: int | None = None) -> dict:
    """What the run cost: the counts up to step ``upto`` (None: the whole run); the times over the whole run."""
    out_b, in_b = rec.swap_bytes(upto)
    return {
        "preemptions": len(rec.preemptions(upto)),
        "bytes to host": out_b, "bytes back": in_b,
        "tokens lost": rec.preempted_tokens(upto), "tokens recomputed": rec.recomputed_tokens(upto),
        "tokens from the cache": rec.recompute_cache_hits(upto), "tokens needed again": rec.readmitted_tokens(upto),
        "steps": rec.num_steps, "total s": sum(rec.wall_s),
        "mean step s": sum(rec.wall_s) / max(1, len(rec.wall_s)),
    }


# ---------------------------------------------------------------------------- honest costs
@st.cache_resource(show_spinner=False, ttl=600)
def machine_rates() -> Rates:
    """This machine's copy bandwidth and FLOP rate, measured once per process every ten minutes."""
    return measure_rates()


def model_flops_per_token() -> float | None:
    """2 x the loaded model's parameters (None when the model cannot load)."""
    lm = loaded_model()
    if lm is None:
        return None
    return flops_per_token(sum(p.numel() for p in lm.model.parameters()))


def work_steps(rec: TimedRun) -> list[int]:
    """The steps in which a run did its mode's extra work: swapping blocks out or in, or prefilling
    a recompute victim again (freeing a victim's blocks costs nothing)."""
    steps = {s for s, _ in rec.events(PREEMPT_SWAP, SWAP_IN)}
    steps |= {s for s, e in rec.events(ADMIT) if e.detail.get("recompute")}
    return sorted(steps)


def cost_model(recs: dict[str, TimedRun], fpt: float, rates: Rates) -> CostModel:
    """The work each run did (bytes out and back; tokens prefilled again) at the measured rates."""
    out_b, in_b = recs["swap"].swap_bytes()
    return CostModel(out_b + in_b, recs["recompute"].recomputed_tokens(), fpt, rates)


def measured_cost_model(recs: dict[str, TimedRun]) -> CostModel | None:
    """:func:`cost_model` at this machine's rates (measured once every ten minutes) for the loaded
    model; None when the model cannot load."""
    fpt = model_flops_per_token()
    if fpt is None:
        return None
    with st.spinner("Measuring this machine's memory-copy bandwidth and FLOP rate…"):
        rates = machine_rates()
    return cost_model(recs, fpt, rates)


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

    # ------------------------------------------------------------------------ figures
    def timeline_figure(self, mode: str, step: int):
        rec = self.recs[mode]
        pre = [(s, e.request_id) for s, e in rec.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE, upto=step)]
        return status_timeline(rec, rec.request_ids, f"{mode}: each request's state per step (✕ = preempted)",
                               current_step=step, preemptions=pre, upto=step)

    def free_figure(self, mode: str, step: int):
        rec = self.recs[mode]
        free = [s.num_blocks - round(s.metrics.kv_usage * s.num_blocks) for s in map(rec.at, range(rec.num_steps))]
        reserve = self.reserve
        return lines(range(len(free)), {"free blocks": free}, f"{mode}: free blocks after each step", "engine step", "blocks",
                     colors={"free blocks": ALLOCATOR_COLORS[mode]},
                     hline=(reserve, f"watermark reserve: {reserve} block{'s' if reserve != 1 else ''}"),
                     current_x=step, height=260, markers=False)

    def steptime_figure(self, step: int):
        recs = self.recs
        n = max(r.num_steps for r in recs.values())
        return lines(range(n), {m: [r.wall_s[i] * 1000 if i < len(r.wall_s) else None for i in range(n)]
                                for m, r in recs.items()},
                     "Measured time of each engine step (ms), the two runs stepped in turn: spikes are prefills",
                     "engine step", "milliseconds", colors=ALLOCATOR_COLORS, current_x=step, height=300, markers=False)

    def cost_figure(self):
        """The modelled cost of each mode's work beside what the runs' own step times measured."""
        m = self.model
        sw, rc = self.recs["swap"], self.recs["recompute"]
        labels = ["swap: modelled, this machine's copy", f"swap: modelled, over {PCIE_NAME}", "swap: measured in the run",
                  "recompute: modelled, this machine's matmul", "recompute: measured in the run"]
        values = [m.swap_s, m.swap_pcie_s, max(0.0, sw.excess_wall_s(work_steps(sw))), m.recompute_s,
                  max(0.0, rc.excess_wall_s(work_steps(rc)))]
        swap_c, rec_c = ALLOCATOR_COLORS["swap"], ALLOCATOR_COLORS["recompute"]
        return value_bars(labels, [v * 1000 for v in values],
                          "What each mode's work cost (ms): modelled at the measured rates, and measured in the runs",
                          "milliseconds (measured: time of the steps that did the work, beyond the run's median step)",
                          lambda v: seconds(v / 1000), colors=[swap_c, "#5eead4", "#99f6e4", rec_c, "#f0abfc"], height=340)

    # ------------------------------------------------------------------------ drawing
    def side(self, mode: str, step: int) -> None:
        rec = self.recs[mode]
        snap = rec.at(step)
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
        fig = snapshot_heatmap(snap, rec.request_ids, f"{mode}: {snap.num_slots} KV slots at step {snap.step}",
                               token_text=self.text_of, height=260)[0]
        show_chart(fig, f"{KEY}_heat_{mode}", config=export.png_config(f"{KEY}-{mode}-pool"))
        show_chart(self.timeline_figure(mode, step), f"{KEY}_timeline_{mode}",
                   config=export.png_config(f"{KEY}-{mode}-timeline"))
        show_chart(self.free_figure(mode, step), f"{KEY}_free_{mode}", config=export.png_config(f"{KEY}-{mode}-free"))
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
        show_chart(self.steptime_figure(step), f"{KEY}_steptime", config=export.png_config(f"{KEY}-step-times"))
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

    # ------------------------------------------------------------------------ costs
    def verdict(self) -> str:
        """Which mode the measured rates make cheaper for the work done here, with the numbers."""
        m = self.model
        cheaper, dearer = ("swap", "recompute") if m.winner == "swap" else ("recompute", "swap")
        return (f"Modelled cost of the preemption work alone (swap: copying the blocks out and back; recompute: "
                f"prefilling the evicted tokens again), at this machine's measured rates: **{cheaper}** is cheaper, "
                f"{seconds(min(m.swap_s, m.recompute_s))} against {seconds(max(m.swap_s, m.recompute_s))} by {dearer}, "
                f"{m.factor:,.0f}× less.")

    def whole_run_note(self) -> str:
        """The measured wall time of each whole run, said as such: it includes every step's decodes and
        prefills, which both runs share, so it need not agree with the modelled preemption work."""
        s, r = costs(self.recs["swap"]), costs(self.recs["recompute"])
        ts, tr = s["total s"], r["total s"]
        faster = "swap" if ts < tr else "recompute" if tr < ts else None
        text = (f"Measured wall time over the whole run (every step, the two runs interleaved): swap {ts:.1f} s in "
                f"{s['steps']} steps, recompute {tr:.1f} s in {r['steps']} steps")
        if faster is None:
            return text + "."
        text += f", so {faster} was faster over the whole run."
        if self.model is not None and faster != self.model.winner:
            text += (f" That is not the modelled verdict: the two whole-run times differ by {seconds(abs(ts - tr))}, "
                     f"and besides the preemption work (modelled: {seconds(self.model.swap_s)} swap, "
                     f"{seconds(self.model.recompute_s)} recompute) they time every decode and prefill both runs share, "
                     "and the machine's load while they ran.")
        return text

    def measured_note(self) -> str:
        """What the runs' own step times say beside the model, in one or two sentences."""
        sw, rc = self.recs["swap"], self.recs["recompute"]
        xs, xr = sw.excess_wall_s(work_steps(sw)), rc.excess_wall_s(work_steps(rc))
        m = self.model
        text = (f"Measured in the runs themselves, the steps that swapped took {seconds(max(xs, 0.0))} more than a plain "
                f"step, the step that recomputed {seconds(max(xr, 0.0))} more.")
        if xs > 2 * m.swap_s:
            text += (" Swap's steps cost more than its bandwidth model because the CPU engine copies the blocks of every "
                     "layer's K pool and V pool separately, with a fixed cost per copy"
                     + (", yet still less than recompute." if xs < xr else ", and at this size that overhead, not the "
                        "bytes, makes it the dearer of the two here."))
        return text

    def costs_panel(self) -> None:
        """Measured work beside its modelled cost, the measured engine times, and the verdict."""
        m, s, r = self.model, costs(self.recs["swap"]), costs(self.recs["recompute"])
        if m is None:
            st.caption("The costs could not be modelled: the model's parameter count is unknown.")
            return
        rates = m.rates
        st.markdown("**What each mode cost, measured so that load cannot decide it**")
        bpt = self.bpb // max(1, self.block_size)
        rows = [
            {"": "work (counted from the engine's events)",
             "swap": f"{format_bytes(s['bytes to host'])} to host + {format_bytes(s['bytes back'])} back = "
                     f"{format_bytes(m.bytes_moved)} ({bpt:,} B per token)",
             "recompute": f"{m.tokens_recomputed} tokens prefilled again: of the {r['tokens needed again']} tokens the "
                          f"victims had on return ({r['tokens lost']} whose K/V they held when evicted + "
                          f"{r['tokens needed again'] - r['tokens lost']} sampled but not yet written), "
                          f"{r['tokens from the cache']} were found in the prefix cache"},
            {"": "rate measured on this machine",
             "swap": f"{rate(rates.copy_bytes_per_s, 'B')}: a {format_bytes(COPY_BYTES)} host copy",
             "recompute": f"{rate(rates.flops_per_s, 'FLOP')}: a {MATMUL_N} × {MATMUL_N} float32 matmul"},
            {"": "modelled cost = work / rate",
             "swap": f"{format_bytes(m.bytes_moved)} / {rate(rates.copy_bytes_per_s, 'B')} = **{seconds(m.swap_s)}**",
             "recompute": f"{m.tokens_recomputed} × {m.flops_per_token / 1e9:.2f} GFLOP = {m.recompute_flops / 1e9:,.1f} GFLOP "
                          f"/ {rate(rates.flops_per_s, 'FLOP')} = **{seconds(m.recompute_s)}**"},
            {"": f"on a GPU ({PCIE_NAME}, about {rate(m.pcie_bytes_per_s, 'B')})",
             "swap": f"{format_bytes(m.bytes_moved)} / {rate(m.pcie_bytes_per_s, 'B')} = {seconds(m.swap_pcie_s)}",
             "recompute": f"cheaper than that at a prefill rate above {rate(m.gpu_break_even_flops_per_s, 'FLOP')}"},
            {"": "measured: time of the steps that did this work, beyond the run's median step",
             "swap": self._excess(self.recs["swap"]), "recompute": self._excess(self.recs["recompute"])},
            {"": "measured engine time, whole run (steps interleaved)",
             "swap": f"{s['total s']:.2f} s in {s['steps']} steps", "recompute": f"{r['total s']:.2f} s in {r['steps']} steps"},
        ]
        st.markdown("| | swap | recompute |\n| --- | --- | --- |\n"
                    + "\n".join(f"| {row['']} | {row['swap']} | {row['recompute']} |" for row in rows))
        st.caption(f"Rates: medians of {rates.repeats} timings of each, alternated so that both see the same load "
                   f"({rates.threads} threads). FLOPs per token = 2 × the model's parameters (a multiply and an add "
                   "per weight); attention over the context adds a term that grows with its length, small at these "
                   "lengths.")
        st.success(self.verdict() + " " + self.measured_note() + " " + self.whole_run_note(), icon=":material/balance:")

    @staticmethod
    def _excess(rec: TimedRun) -> str:
        steps = work_steps(rec)
        if not steps:
            return "no such step"
        extra = rec.excess_wall_s(steps)
        where = f"{len(steps)} step{'s' if len(steps) != 1 else ''} ({', '.join(map(str, steps[:6]))}{'…' if len(steps) > 6 else ''})"
        return f"{seconds(extra)} over {where}" if extra >= 1e-3 else f"none measurable over {where}"

    def when_each_wins(self) -> None:
        m = self.model
        bpb, block_size = self.bpb, self.block_size
        bpt = bpb // max(1, block_size)
        self.costs_panel()
        if m is None:
            return
        per_token_swap = 2 * bpt / m.rates.copy_bytes_per_s
        per_token_recompute = m.flops_per_token / m.rates.flops_per_s
        st.markdown(
            f"""
**When each wins**
- **Swap** moves bytes: each preempted token costs its K and V in every layer ({format_bytes(bpt)} per token for this
  model in fp32, {format_bytes(bpb)} per block of {block_size}), out and back: {seconds(per_token_swap)} per token at
  this machine's {rate(m.rates.copy_bytes_per_s, 'B')}. It takes no compute, and its cost grows only linearly with the
  context, so swap wins for **long contexts** and for **forked groups** (parallel samples, beam search), where
  recompute would prefill every sample's whole context again.
- **Recompute** spends compute: {m.flops_per_token / 1e9:.2f} GFLOP per token, {seconds(per_token_recompute)} per token
  at this machine's {rate(m.rates.flops_per_s, 'FLOP')}, and it needs no host memory. Its attention term grows with the
  square of the context, so long contexts make it expensive; the prefix cache cuts it (here
  {costs(self.recs['recompute'])['tokens from the cache']} tokens came back from the cache instead).
- **Here**, per token, swap costs {seconds(per_token_swap)} and recompute {seconds(per_token_recompute)}: on this CPU
  the "host pool" is the same RAM, so a swap is a plain memory copy; for this spike's preemption work the model
  favours {m.winner}, {m.factor:,.0f}× cheaper (modelled, not the whole run's measured time).
- **On a GPU** the swap crosses {PCIE_NAME} (about {rate(m.pcie_bytes_per_s, 'B')}): {seconds(m.swap_pcie_s)} for these
  {format_bytes(m.bytes_moved)}, while a GPU computes the {m.recompute_flops / 1e9:,.1f} GFLOP of the recompute faster
  than that once it sustains more than {rate(m.gpu_break_even_flops_per_s, 'FLOP')} on the prefill. That is why vLLM
  defaults to recompute and keeps swap for the cases above.
"""
        )

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
                                   answer, self.verdict().replace("**", "") + " " + self.measured_note() + " "
                                   + self.whole_run_note(), options=options,
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
            presenter.slide(self.cost_figure(), KEY, self.verdict().replace("**", ""))
        elif which == "steptime":
            presenter.slide(self.steptime_figure(step), KEY)
        elif which == "free":
            presenter.slide(presenter.side_by_side([self.free_figure(m, step) for m in MODES],
                                                   [f"{m}: free blocks" for m in MODES], f"Free blocks, step {step}",
                                                   heatmaps=False), KEY)
        else:
            presenter.slide(presenter.side_by_side([self.timeline_figure(m, step) for m in MODES],
                                                   [f"preempt by {m}" for m in MODES],
                                                   f"Each request's state per step, step {step} (✕ = preempted)",
                                                   heatmaps=False), KEY,
                            "grey = waiting · blue = running · teal = swapped out to host · magenta = preempted, waits to "
                            "recompute · blank = finished")

    def show_guide(self) -> dict:
        """Draw the guide's current step; returns its ``show``."""
        try:
            steps = self.guide_steps()
        except (IndexError, KeyError):
            st.error("The guide's fixed run did not preempt anything, so there is nothing to walk through.")
            st.stop()
        show = guide.nav(KEY, steps).show
        if presenter.on(KEY):
            self.slide(show)
            st.stop()
        self.compare(int(show["step"]))
        return show

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
