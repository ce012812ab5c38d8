"""Server time of one playback step of the "Reserve or page" page: a 2,048-slot pair of heatmaps
(cells, hover, figures, JSON as Streamlit sends it) plus the utilization curves. Target < 150 ms.

    .venv/bin/python -m benchmarks.bench_playback
"""
from __future__ import annotations

import statistics
import time

from benchmarks.common import print_table, write_result
from pagedkv_core.config import EngineConfig
from pagedkv_core.workloads.scenarios import build_workload
from ui.figures import step_curves
from ui.pool_cells import snapshot_heatmap
from ui.runs.model import Run
from ui.runs.scripted import play_scripted

TARGET_MS = 150.0


def recorded_run(allocator: str) -> Run:
    """The page's run: explainer40 played to the end, kept as the page keeps it."""
    return play_scripted(EngineConfig(allocator=allocator, pool_slots=2048, block_size=16), build_workload("explainer40"),
                         allocator)


def playback_step(runs: list[Run], step: int) -> int:
    """The work the page's fragment does for one step; returns the bytes sent to the browser."""
    sent = 0
    for run in runs:
        snap = run.at(step)
        fig = snapshot_heatmap(snap, run.request_ids, "x")[0]
        sent += len(fig.to_json())
    series = {run.allocator: run.metric("token_utilization") for run in runs}
    sent += len(step_curves(range(max(r.num_steps for r in runs)), series, "t", "y", current_step=step).to_json())
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
                  "work": "heatmap figure (cells and their hover) + JSON for both pools, plus the utilization curves"},
        "median_ms": round(median, 1),
        "p90_ms": round(sorted(times)[int(0.9 * len(times))], 1),
        "bytes_per_step": int(statistics.median(sizes)),
        "targets": [{"name": "server time of one playback step, 2,048-slot pair of heatmaps (median)",
                     "value": round(median, 1), "target": f"< {TARGET_MS:.0f} ms", "pass": median < TARGET_MS}],
    }


def print_result(result: dict) -> None:
    row = {k: result[k] for k in ("median_ms", "p90_ms", "bytes_per_step")}
    print_table([row], list(row))


if __name__ == "__main__":
    res = run()
    print_result(res)
    write_result("playback", {"command": "python -m benchmarks.bench_playback", **res})
