"""Simulator throughput: engine steps per second with snapshots on (numpy only, no torch).

Closed loop: a 2,048-slot pool with 40 live requests at all times (a finished request is
replaced at once by a new one), scripted tokens, a StepSnapshot built every step. Reports
both allocators, plus whole ``explainer40`` runs. Target: >= 10,000 steps/s (issue 55; issue 25 asked 5,000).

    .venv/bin/python benchmarks/bench_simulator.py [--steps N] [--repeats R] [--out-dir DIR]
    .venv/bin/python -m pagedkv_core bench simulator

``run()`` is what ``bench simulator`` calls (the target is judged on the median run).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedkv_core.kv.registry import allocator_kind  # noqa: E402
from pagedkv_core.config import EngineConfig  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.sampling import SamplingParams  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402
from pagedkv_core.workloads.scenarios import build_workload  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "simulator.json"
POOL_SLOTS = 2048
LIVE_REQUESTS = 40


def closed_loop(allocator: str, steps: int, warmup: int = 200, block_size: int = 16, seed: int = 0) -> dict:
    """Steps/s with ``LIVE_REQUESTS`` requests live at every step."""
    rng = np.random.default_rng(seed)
    engine = Engine(EngineConfig(pool_slots=POOL_SLOTS, block_size=block_size, allocator=allocator), ScriptedSource())
    max_tokens = 320 if allocator_kind(allocator) == "paged" else 40  # contiguous: let 40 reservations fit the pool
    counter = 0

    def add() -> None:
        nonlocal counter
        prompt = rng.integers(3, 49152, size=int(rng.integers(8, 24))).tolist()
        output_len = int(min(max_tokens, max(2, rng.lognormal(np.log(30), 0.8))))
        engine.add_request(f"c{counter}", prompt, SamplingParams(max_tokens=max_tokens), output_len=output_len)
        counter += 1

    for _ in range(LIVE_REQUESTS):
        add()
    live_counts, running_counts = [], []
    elapsed = cpu = 0.0
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        outputs, snap = engine.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i >= warmup:
            elapsed += dt
            cpu += dc
            live_counts.append(len(snap.seq_id))
            running_counts.append(snap.metrics.num_running)
        for out in outputs:
            if out.finished:
                add()
    return {
        "allocator": allocator,
        "block_size": engine.allocator.block_size,
        "pool_slots": POOL_SLOTS,
        "live_requests": LIVE_REQUESTS,
        "mean_live_sequences": float(np.mean(live_counts)),
        "mean_running": float(np.mean(running_counts)),
        "steps": steps,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "steps_per_s": steps / elapsed,
        "steps_per_cpu_s": steps / cpu if cpu else None,
    }


def best_of(repeats: int, fn, *args) -> dict:
    """The fastest of ``repeats`` runs (the least disturbed by other processes)."""
    runs = [fn(*args) for _ in range(repeats)]
    best = max(runs, key=lambda r: r["steps_per_s"])
    best["repeats_steps_per_s"] = [round(r["steps_per_s"]) for r in runs]
    return best


def explainer_run(allocator: str) -> dict:
    workload = build_workload("explainer40", 0)
    engine = Engine(EngineConfig(pool_slots=workload.pool_slots, allocator=allocator), ScriptedSource())
    workload.submit(engine)
    t0 = time.perf_counter()
    summary = engine.run()
    elapsed = time.perf_counter() - t0
    return {"allocator": allocator, "steps": summary.steps, "seconds": elapsed, "steps_per_s": summary.steps / elapsed}


def run_benchmark(steps: int = 3000, out: Path | None = RESULTS, repeats: int = 3) -> dict:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {
        "benchmark": "simulator steps per second, snapshots on",
        "target_steps_per_s": TARGET_STEPS_PER_S,
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_start": load,
        },
        "closed_loop": [best_of(repeats, closed_loop, "paged", steps), best_of(repeats, closed_loop, "contiguous", steps)],
        "explainer40": [best_of(repeats, explainer_run, "paged"), best_of(repeats, explainer_run, "contiguous")],
    }
    result["closed_loop_paged_steps_per_s"] = result["closed_loop"][0]["steps_per_s"]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


TARGET_STEPS_PER_S = 10_000  # issue 55 (issue 25 asked 5,000)


def run(quick: bool = False, steps: int = 3000, repeats: int = 5) -> dict:
    """The ``bench simulator`` payload: closed loop (paged and contiguous) and explainer40, with
    the target judged on the paged closed loop's median over ``repeats`` runs (best reported too)."""
    if quick:
        steps, repeats = 300, 1
    from benchmarks.bench_replay_speed import cpu_info

    load_start = os.getloadavg()[0]
    r = run_benchmark(steps, out=None, repeats=repeats)
    paged = r["closed_loop"][0]
    median = float(np.median(paged["repeats_steps_per_s"]))
    return {
        "setup": {"pool_slots": POOL_SLOTS, "live_requests": LIVE_REQUESTS, "block_size": paged["block_size"],
                  "steps_per_run": steps, "repeats": repeats, "snapshots": True, "token_source": "scripted",
                  "numpy": np.__version__},
        **cpu_info(),
        "load_average_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],  # at the start and the end
        "closed_loop": r["closed_loop"],
        "explainer40": r["explainer40"],
        "paged_steps_per_s_median": round(median, 1),
        "paged_steps_per_s_best": round(paged["steps_per_s"], 1),
        "paged_steps_per_cpu_s_best": round(paged["steps_per_cpu_s"], 1) if paged["steps_per_cpu_s"] else None,
        "targets": [{"name": "simulator steps/s, 2,048 slots, 40 live requests, snapshots on (median of runs)",
                     "value": round(median, 1), "target": f">= {TARGET_STEPS_PER_S}",
                     "pass": median >= TARGET_STEPS_PER_S}],
    }


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    rows = [{"run": f"closed loop {r['allocator']}", "steps/s (best)": round(r["steps_per_s"]),
             "steps/s (runs)": r["repeats_steps_per_s"], "live seqs": round(r["mean_live_sequences"], 1),
             "running": round(r["mean_running"], 1)} for r in result["closed_loop"]]
    rows += [{"run": f"explainer40 {r['allocator']}", "steps/s (best)": round(r["steps_per_s"]),
              "steps/s (runs)": r["repeats_steps_per_s"], "live seqs": "", "running": ""} for r in result["explainer40"]]
    print_table(rows, ["run", "steps/s (best)", "steps/s (runs)", "live seqs", "running"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=5, help="runs per figure (median judged, fastest reported)")
    p.add_argument("--out-dir", type=Path, default=RESULTS.parent, help="where simulator.json goes")
    args = p.parse_args(argv)
    from benchmarks.common import write_result

    result = run(steps=args.steps, repeats=args.repeats)
    print_result(result)
    cmd = "python benchmarks/bench_simulator.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path = write_result("simulator", {"command": cmd.strip(), **result}, out_dir=args.out_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
