"""Lesson 4's bill: what each preemption mode's work cost in the two runs of
:mod:`ui.lessons.pressure_scenario`. The work is counted from the engine's events (bytes moved,
tokens prefilled again); which mode is cheaper is decided by that work at this machine's measured
copy bandwidth and FLOP rate (:mod:`ui.costs`), not by two wall-clock totals that a busy neighbour
can skew 30-fold. The runs' own step times are reported beside the model, said as what they are."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.events import ADMIT, PREEMPT_SWAP, SWAP_IN
from pagedkv_core.sizing.kv_math import format_bytes
from ui.costs import COPY_BYTES, MATMUL_N, PCIE_NAME, CostModel, Rates, flops_per_token, measure_rates, rate, seconds
from ui.models import loaded_model
from ui.timed_runs import TimedRun


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


@st.cache_resource(show_spinner=False, ttl=600)
def machine_rates() -> Rates:
    """This machine's copy bandwidth and FLOP rate, measured once per process every ten minutes."""
    return measure_rates()


def model_flops_per_token() -> float | None:
    """2 x the loaded model's parameters (None when the model cannot load)."""
    lm = loaded_model()
    if lm is None:
        return None
    return flops_per_token(lm.num_parameters)


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


class Bill:
    """The bill of both runs (``recs``: mode -> run); ``model``: the modelled costs at the measured
    rates (None: not measured)."""

    def __init__(self, recs: dict[str, TimedRun], model: CostModel | None = None):
        self.recs = recs
        self.model = model
        self.block_size = recs["swap"].config.block_size
        self.bpb = recs["swap"].bytes_per_block

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
