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

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.whole_logs import log_parser, parse, stream_log, write_result  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.record.waste import Released, measure_run  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402


def one_run(log: str, coalesce: bool, requests: int | None = None) -> dict:
    """The log as ``simulate --workload-file LOG --pool-slots 262144`` runs it without a trace."""
    workload, config = stream_log(log, requests)
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
    p = log_parser(__doc__)
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs, each without then with decode runs")
    args = parse(p, argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    rows = [compare(log, args.repeats, args.count) for log in args.log]
    for r in rows:
        print(f"{r['log']}: {r['steps_in_runs']:,} of {r['steps']:,} steps in decode runs; wall s without "
              f"{r['wall_s_without']}, with {r['wall_s_with']} ({r['speedup_best_wall']}x, best of each); "
              f"the same figures: {r['same_figures']}")
    write_result("bench_decode_runs.py", "decode runs (Engine(coalesce=True)) side by side, simulate without a trace",
                 argv, rows, args.out)
    return 0 if all(r["same_figures"] for r in rows) else 1

if __name__ == "__main__":
    sys.exit(main())
