"""Allocation: paged vs contiguous on the scripted token source (no model, deterministic).

For ``explainer40``, ``shared_preamble`` and ``trickle`` (seed 0, each workload's own pool of
2,048 slots): the paged allocator at block sizes 1, 2, 4, ..., 128 and the contiguous baseline
(which reserves prompt + max_tokens per request, so block size does not apply). Per run: mean
token utilization (filled / allocated slots), mean KV usage (allocated / pool), peak concurrency
(sequences in one step's batch) and steps to finish. These figures are counts, not timings: they
are exact and the same on every machine.

    .venv/bin/python -m pagedkv_core bench allocation
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedkv_core.config import EngineConfig  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.scripted import ScriptedSource  # noqa: E402
from pagedkv_core.workloads import build_workload  # noqa: E402

WORKLOADS = ("explainer40", "shared_preamble", "trickle")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def run_one(workload_name: str, allocator: str, block_size: int | None, seed: int = 0) -> dict:
    workload = build_workload(workload_name, seed)
    cfg = EngineConfig(pool_slots=workload.pool_slots, allocator=allocator, block_size=block_size or 16)
    engine = Engine(cfg, ScriptedSource())
    workload.submit(engine)
    s = engine.run()
    return {
        "workload": workload_name,
        "allocator": allocator,
        "block_size": block_size if allocator == "paged" else None,
        "pool_slots": cfg.pool_slots,
        "requests": s.requests,
        "finished": s.finished,
        "rejected": len(s.rejected),
        "steps": s.steps,
        "mean_token_utilization": round(s.mean_token_utilization, 4),
        "mean_kv_usage": round(s.mean_kv_usage, 4),
        "peak_running": s.peak_running,
        "mean_running": round(s.mean_running, 2),
        "preemptions": s.preemptions,
        "prefix_cache_hit_rate": round(s.prefix_cache_hit_rate, 4),
        "tokens_generated": s.tokens_generated,
    }


def run(quick: bool = False, seed: int = 0) -> dict:
    rows = []
    sizes = (1, 16, 128) if quick else BLOCK_SIZES
    for name in WORKLOADS:
        rows.append(run_one(name, "contiguous", None, seed))
        for bs in sizes:
            rows.append(run_one(name, "paged", bs, seed))
    summary = {}
    for name in WORKLOADS:
        cont = next(r for r in rows if r["workload"] == name and r["allocator"] == "contiguous")
        p16 = next((r for r in rows if r["workload"] == name and r["block_size"] == 16), None)
        if p16:
            summary[name] = {
                "paged16_token_utilization": p16["mean_token_utilization"],
                "contiguous_token_utilization": cont["mean_token_utilization"],
                "paged16_peak_running": p16["peak_running"],
                "contiguous_peak_running": cont["peak_running"],
                "paged16_steps": p16["steps"],
                "contiguous_steps": cont["steps"],
            }
    return {"seed": seed, "block_sizes": list(sizes), "workloads": list(WORKLOADS), "rows": rows,
            "summary_block16": summary, "targets": []}


TABLE_COLUMNS = ["workload", "allocator", "block_size", "mean_token_utilization", "mean_kv_usage",
                 "peak_running", "steps", "preemptions"]


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    rows = [{**r, "block_size": r["block_size"] if r["block_size"] is not None else "-"} for r in result["rows"]]
    print_table(rows, TABLE_COLUMNS)


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("allocation", {"command": "python benchmarks/bench_allocation.py", **res}))
