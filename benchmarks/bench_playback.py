"""Server time of one playback step of the "Reserve or page" page: a 2,048-slot pair of heatmaps
(hover text, figures, JSON as Streamlit sends it) plus the utilization curves. Target < 150 ms.

    .venv/bin/python -m benchmarks.bench_playback
"""
from __future__ import annotations

import statistics
import time

from benchmarks.common import print_table, write_result
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.scripted import ScriptedSource
from pagedkv_core.workloads import build_workload
from pages.viz import pool_heatmap, slot_hover_text, step_curves

TARGET_MS = 150.0


def recorded_run(allocator: str):
    engine = Engine(EngineConfig(allocator=allocator, pool_slots=2048, block_size=16), ScriptedSource())
    build_workload("explainer40").submit(engine)
    snaps = []
    while engine.has_unfinished():
        snaps.append(engine.step()[1])
    return list(engine.requests), snaps


def playback_step(runs, step: int) -> int:
    """The work the page's fragment does for one step; returns the bytes sent to the browser."""
    sent = 0
    for ids, snaps in runs:
        snap = snaps[min(step, len(snaps) - 1)]
        text = slot_hover_text(snap, ids)
        fig = pool_heatmap(snap.slot_state, snap.slot_owner, text, max(1, snap.block_size), "x",
                           shared_mask=snap.slot_state == 4)
        sent += len(fig.to_json())
    series = {f"{i}": [s.metrics.token_utilization for s in snaps] for i, (_, snaps) in enumerate(runs)}
    sent += len(step_curves(range(max(len(s) for _, s in runs)), series, "t", "y", current_step=step).to_json())
    return sent


def main(steps: int = 60) -> dict:
    runs = [recorded_run("contiguous"), recorded_run("paged")]
    playback_step(runs, 0)  # warm-up (imports, plotly validators)
    times, sizes = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        sizes.append(playback_step(runs, step * 7))
        times.append((time.perf_counter() - t0) * 1000)
    row = {
        "median_ms": round(statistics.median(times), 1),
        "p90_ms": round(sorted(times)[int(0.9 * len(times))], 1),
        "target_ms": TARGET_MS,
        "pass": statistics.median(times) < TARGET_MS,
        "bytes_per_step": int(statistics.median(sizes)),
        "steps_timed": steps,
    }
    print_table([row], list(row))
    write_result("playback", {"command": "python -m benchmarks.bench_playback", "pool_slots": 2048,
                              "workload": "explainer40", **row})
    return row


if __name__ == "__main__":
    main()
