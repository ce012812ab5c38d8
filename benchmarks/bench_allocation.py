"""Allocation: paged vs contiguous on the scripted token source (no model, deterministic).

For ``explainer40``, ``shared_preamble`` and ``trickle`` (seed 0, each workload's own pool of
2,048 slots): the paged allocator at block sizes 1, 2, 4, ..., 128 and the contiguous baseline
(which reserves prompt + max_tokens per request, so block size does not apply). Per run: mean
token utilization (filled / allocated slots), mean KV usage (allocated / pool), peak concurrency
(sequences in one step's batch) and steps to finish. These figures are counts, not timings: they
are exact and the same on every machine.

Then the production request log (``azure-conv``: 1,000 requests of the Azure LLM inference trace 2023 into
65,536 slots, block size 16) on the vLLM paper's four allocators: Orca Max, Pow2, Oracle and
paged, each with the paper's Figure 2 memory breakdown (token, reservation, internal, external,
free; averaged over the steps in which anything is allocated), token share, steps to finish, and
peak and mean running. ``--quick`` uses ``azure-conv-small`` instead.

    .venv/bin/python -m pagedkv_core bench allocation
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedkv_core.kv.registry import allocator_kind  # noqa: E402
from pagedkv_core.config import EngineConfig, setting_spec  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402
from pagedkv_core.record.waste import measure_run  # noqa: E402
from pagedkv_core.workloads.scenarios import build_workload  # noqa: E402

WORKLOADS = ("explainer40", "shared_preamble", "trickle")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def run_one(workload_name: str, allocator: str, block_size: int | None, seed: int = 0) -> dict:
    workload = build_workload(workload_name, seed)
    cfg = EngineConfig(pool_slots=workload.pool_slots, allocator=allocator, block_size=block_size or setting_spec("block_size").default)
    engine = Engine(cfg, ScriptedSource())
    workload.submit(engine)
    s = engine.run()
    return {
        "workload": workload_name,
        "allocator": allocator,
        "block_size": block_size if allocator_kind(allocator) == "paged" else None,
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


PAPER_ALLOCATORS = {"Orca (Max)": "contiguous", "Orca (Pow2)": "contiguous-pow2",
                    "Orca (Oracle)": "contiguous-oracle", "vLLM (paged)": "paged"}
PAPER_TOKEN_SHARE = {"Orca (Max)": 0.204, "Orca (Pow2)": 0.268, "Orca (Oracle)": 0.382, "vLLM (paged)": 0.963}


def run_paper_allocators(workload_name: str, seed: int = 0) -> list[dict]:
    """The four allocators of the paper's comparison on one request-log workload, with the breakdown."""
    rows = []
    for label, allocator in PAPER_ALLOCATORS.items():
        workload = build_workload(workload_name, seed)
        engine = Engine(EngineConfig(pool_slots=workload.pool_slots, allocator=allocator), ScriptedSource())
        workload.submit(engine)
        s, waste = measure_run(engine)
        rows.append({
            "workload": workload_name, "allocator": label, "pool_slots": workload.pool_slots,
            "token_share": round(waste["token_share"], 4), "paper_token_share": PAPER_TOKEN_SHARE[label],
            **{k: round(waste[k], 4) for k in ("token", "reservation", "internal", "external", "free")},
            "steps": s.steps, "peak_running": s.peak_running, "mean_running": round(s.mean_running, 2),
            "preemptions": s.preemptions, "finished": s.finished, "rejected": len(s.rejected),
        })
    return rows


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
    paper = run_paper_allocators("azure-conv-small" if quick else "azure-conv", seed)
    shares = [r["token_share"] for r in paper]
    targets = [{"name": "trace token share orders Max < Pow2 < Oracle < paged, paged >= 0.9",
                "value": shares, "target": "increasing, last >= 0.9",
                "pass": all(a < b for a, b in zip(shares, shares[1:])) and shares[-1] >= 0.9}]
    return {"seed": seed, "block_sizes": list(sizes), "workloads": list(WORKLOADS), "rows": rows,
            "summary_block16": summary, "trace_rows": paper, "targets": targets}  # "trace_rows": the key stored results have


PAPER_COLUMNS = ["workload", "allocator", "token_share", "paper_token_share", "token", "reservation", "internal",
                 "external", "free", "steps", "peak_running", "mean_running"]
TABLE_COLUMNS = ["workload", "allocator", "block_size", "mean_token_utilization", "mean_kv_usage",
                 "peak_running", "steps", "preemptions"]


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    rows = [{**r, "block_size": r["block_size"] if r["block_size"] is not None else "-"} for r in result["rows"]]
    print_table(rows, TABLE_COLUMNS)
    print()
    print_table(result["trace_rows"], PAPER_COLUMNS)


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("allocation", {"command": "python benchmarks/bench_allocation.py", "quick": "--quick" in sys.argv, **res}))
