"""Lesson 4's figures: one run's pool, each request's state per step, free blocks against the
watermark, both runs' measured step times, and the bill's bars (modelled beside measured)."""
from __future__ import annotations

from pagedkv_core.events import PREEMPT_RECOMPUTE, PREEMPT_SWAP
from ui.costs import PCIE_NAME, CostModel, seconds
from ui.figures import ALLOCATOR_COLORS
from ui.lesson_figures import lines, status_timeline, value_bars
from ui.lessons.pressure_bill import work_steps
from ui.pool_cells import snapshot_heatmap
from ui.timed_runs import TimedRun


def pool_figure(rec: TimedRun, mode: str, step: int, text_of):
    """The run's KV pool at ``step``; hovering a cell shows its token (``text_of``: token id -> text)."""
    snap = rec.at(step)
    return snapshot_heatmap(snap, rec.request_ids, f"{mode}: {snap.num_slots} KV slots at step {snap.step}",
                            token_text=text_of, height=260)[0]


def timeline_figure(rec: TimedRun, mode: str, step: int):
    """Each request's state per step up to ``step``, its preemptions marked."""
    pre = [(s, e.request_id) for s, e in rec.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE, upto=step)]
    return status_timeline(rec, rec.request_ids, f"{mode}: each request's state per step (✕ = preempted)",
                           current_step=step, preemptions=pre, upto=step)


def free_figure(rec: TimedRun, mode: str, step: int, reserve: int):
    """Free blocks after each step, the watermark's ``reserve`` of blocks drawn as a line."""
    blocks = rec.at(0).num_blocks  # the recorded usage per step, not every step's snapshot rebuilt for each frame
    free = [blocks - round(u * blocks) for u in rec.metric("kv_usage")]
    return lines(range(len(free)), {"free blocks": free}, f"{mode}: free blocks after each step", "engine step", "blocks",
                 colors={"free blocks": ALLOCATOR_COLORS[mode]},
                 hline=(reserve, f"watermark reserve: {reserve} block{'s' if reserve != 1 else ''}"),
                 current_x=step, height=260, markers=False)


def steptime_figure(recs: dict[str, TimedRun], step: int):
    """The measured time of each engine step of both runs."""
    n = max(r.num_steps for r in recs.values())
    return lines(range(n), {m: [r.wall_s[i] * 1000 if i < len(r.wall_s) else None for i in range(n)]
                            for m, r in recs.items()},
                 "Measured time of each engine step (ms), the two runs stepped in turn: spikes are prefills",
                 "engine step", "milliseconds", colors=ALLOCATOR_COLORS, current_x=step, height=300, markers=False)


def cost_figure(recs: dict[str, TimedRun], m: CostModel):
    """The modelled cost of each mode's work beside what the runs' own step times measured."""
    sw, rc = recs["swap"], recs["recompute"]
    labels = ["swap: modelled, this machine's copy", f"swap: modelled, over {PCIE_NAME}", "swap: measured in the run",
              "recompute: modelled, this machine's matmul", "recompute: measured in the run"]
    values = [m.swap_s, m.swap_pcie_s, max(0.0, sw.excess_wall_s(work_steps(sw))), m.recompute_s,
              max(0.0, rc.excess_wall_s(work_steps(rc)))]
    swap_c, rec_c = ALLOCATOR_COLORS["swap"], ALLOCATOR_COLORS["recompute"]
    return value_bars(labels, [v * 1000 for v in values],
                      "What each mode's work cost (ms): modelled at the measured rates, and measured in the runs",
                      "milliseconds (measured: time of the steps that did the work, beyond the run's median step)",
                      lambda v: seconds(v / 1000), colors=[swap_c, "#5eead4", "#99f6e4", rec_c, "#f0abfc"], height=340)
