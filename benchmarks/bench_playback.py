"""Server time of one playback step of the "Reserve or page" page: a 2,048-slot pair of heatmaps
(cells, hover, figures), the event strip and the utilization curves, each as the JSON the page's
live charts send (``ui.live_chart.figure_json``). Target < 150 ms.

    .venv/bin/python -m benchmarks.bench_playback
"""
from __future__ import annotations

import json
import statistics
import time

from benchmarks.common import print_table, write_result
from pagedkv_core.config import EngineConfig
from pagedkv_core.workloads.scenarios import build_workload
from ui.figures import step_curves
from ui.live_chart import figure_json
from ui.pool_cells import snapshot_heatmap
from ui.run_events import event_strip
from ui.runs.model import Run
from ui.runs.scripted import play_scripted

TARGET_MS = 150.0


def recorded_run(allocator: str) -> Run:
    """The page's run: explainer40 played to the end, kept as the page keeps it."""
    return play_scripted(EngineConfig(allocator=allocator, pool_slots=2048, block_size=16), build_workload("explainer40"),
                         allocator)


def playback_step(runs: list[Run], step: int) -> int:
    """The figures the page's fragment builds for one step; returns the bytes of their JSON."""
    sent = 0
    n = max(r.num_steps for r in runs)
    unit = max(max(1, r.at(0).block_size) for r in runs)  # one grid for both pools, as the page draws them
    for run in runs:
        fig = snapshot_heatmap(run.at(min(step, run.num_steps - 1)), run.request_ids, "x", grid_block=unit)[0]
        sent += len(json.dumps(figure_json(fig)))
    sent += len(json.dumps(figure_json(event_strip(runs, n, step))))
    series = {run.allocator: run.metric("token_utilization") for run in runs}
    sent += len(json.dumps(figure_json(step_curves(range(n), series, "t", "y", current_step=step))))
    return sent


def run(quick: bool = False, steps: int = 60) -> dict:
    """The ``bench playback`` payload: median and p90 server time of one playback step."""
    if quick:
        steps = 5
    runs = [recorded_run("contiguous"), recorded_run("paged")]
    playback_step(runs, 0)  # warm-up (imports, plotly validators)
    times, sizes = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        sizes.append(playback_step(runs, step * 7))
        times.append((time.perf_counter() - t0) * 1000)
    median = statistics.median(times)
    return {
        "setup": {"pool_slots": 2048, "block_size": 16, "workload": "explainer40", "steps_timed": steps,
                  "work": "heatmap figure (cells and their hover) for both pools, the event strip and the utilization "
                          "curves, each as the JSON the page sends"},
        "median_ms": round(median, 1),
        "p90_ms": round(sorted(times)[int(0.9 * len(times))], 1),
        "bytes_per_step": int(statistics.median(sizes)),
        "targets": [{"name": "server time of one playback step's figures, 2,048-slot pair of heatmaps, event strip, curves (median)",
                     "value": round(median, 1), "target": f"< {TARGET_MS:.0f} ms", "pass": median < TARGET_MS}],
    }


def print_result(result: dict) -> None:
    row = {k: result[k] for k in ("median_ms", "p90_ms", "bytes_per_step")}
    print_table([row], list(row))


if __name__ == "__main__":
    res = run()
    print_result(res)
    write_result("playback", {"command": "python -m benchmarks.bench_playback", **res})
