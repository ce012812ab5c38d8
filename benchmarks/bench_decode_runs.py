"""Decode runs side by side: whole request logs with and without ``Engine(coalesce=True)``.

``simulate`` without ``--trace-out`` takes a stretch of steps that are nothing but plain decodes in
one call (a *decode run*). This runs ``bench replay-speed``'s logs (262,144 slots, paged, the
scripted source) as ``simulate`` runs them without a trace (streamed, idle stretches skipped,
the memory-waste split measured), alternately without and with decode runs in the same process,
and reports each run's wall and CPU seconds, the steps taken in runs, and whether the two give
the same summary and split (everything but the token source's time).

    python benchmarks/bench_decode_runs.py [--log mooncake-conv] [--count N] [--repeats R] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_replay_speed import LOGS, PAGED_BLOCK_SIZE, POOL, cpu_info  # noqa: E402
from benchmarks.quiet_steps import QUIET_LOGS  # noqa: E402
from pagedkv_core.cli.parsing import length_scale  # noqa: E402
from pagedkv_core.config import EngineConfig  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.record.waste import Released, measure_run  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402
from pagedkv_core.workloads.scenarios import stream_workload_file  # noqa: E402


def one_run(log: str, coalesce: bool, requests: int | None = None) -> dict:
    """The log as ``simulate --workload-file LOG --pool-slots 262144`` runs it without a trace."""
    path, extra = LOGS[log]
    options = {"count": requests} if requests else {}
    if extra[:1] == ["--length-scale"]:  # the flags bench replay-speed gives simulate for this log
        options["length_scale"] = length_scale(extra[1])
    workload = stream_workload_file(path, 0, **options)
    config = EngineConfig(pool_slots=POOL, **({"block_size": PAGED_BLOCK_SIZE[log]} if log in PAGED_BLOCK_SIZE else {}))
    engine = Engine(config, ScriptedSource(), snapshots=False, skip_idle=True, coalesce=coalesce)
    released = Released()
    engine.feed(workload.requests(), on_release=released)
    t, c = time.perf_counter(), time.process_time()
    summary, breakdown = measure_run(engine, released=released)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    figures = {**summary.to_json(), "waste_breakdown": breakdown}
    figures.pop("mean_execute_s")  # the token source's time: the one figure a decode run changes
    return {"coalesce": coalesce, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "steps": summary.steps,
            "steps_in_runs": engine.coalesced_steps, "figures": figures}


def compare(log: str, repeats: int, requests: int | None = None) -> dict:
    """``repeats`` pairs, each without then with decode runs."""
    runs = [one_run(log, coalesce, requests) for _ in range(repeats) for coalesce in (False, True)]
    plain, coalesced = runs[0::2], runs[1::2]
    same = all(r["figures"] == runs[0]["figures"] for r in runs)
    best = lambda rs, key: min(r[key] for r in rs)  # noqa: E731  (the least disturbed run)
    return {"log": log, "requests": requests or "all", "repeats": repeats, "steps": runs[0]["steps"],
            "steps_in_runs": coalesced[0]["steps_in_runs"], "same_figures": same,
            "wall_s_without": [r["wall_s"] for r in plain], "wall_s_with": [r["wall_s"] for r in coalesced],
            "cpu_s_without": [r["cpu_s"] for r in plain], "cpu_s_with": [r["cpu_s"] for r in coalesced],
            "speedup_best_wall": round(best(plain, "wall_s") / best(coalesced, "wall_s"), 2),
            "speedup_best_cpu": round(best(plain, "cpu_s") / best(coalesced, "cpu_s"), 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", choices=QUIET_LOGS, action="append", help="default: both")
    p.add_argument("--count", type=int, default=None, help="the log's first N requests (default: all)")
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs, each without then with decode runs")
    p.add_argument("--out", type=Path, default=None, help="a JSON file for the result")
    args = p.parse_args(argv)
    if args.count is not None and args.count < 1:
        p.error("--count must be >= 1")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    rows = [compare(log, args.repeats, args.count) for log in (args.log or QUIET_LOGS)]
    result = {"benchmark": "decode runs (Engine(coalesce=True)) side by side, simulate without a trace",
              "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), **cpu_info(),
              "command": " ".join(["python benchmarks/bench_decode_runs.py", *(argv if argv is not None else sys.argv[1:])]),
              "rows": rows}
    for r in rows:
        print(f"{r['log']}: {r['steps_in_runs']:,} of {r['steps']:,} steps in decode runs; wall s without "
              f"{r['wall_s_without']}, with {r['wall_s_with']} ({r['speedup_best_wall']}x, best of each); "
              f"the same figures: {r['same_figures']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(r["same_figures"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
