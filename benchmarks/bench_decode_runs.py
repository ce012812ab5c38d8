"""Decode runs side by side: whole request logs with and without ``Engine(coalesce=True)``.

``simulate`` takes a stretch of steps that are nothing but plain decodes in one call (a *decode
run*), and with ``--trace-out`` writes it as one trace frame. This runs ``bench replay-speed``'s
logs (262,144 slots, paged, the scripted source) as ``simulate`` runs them (streamed, idle
stretches skipped, the memory-waste split measured; with ``--trace``, the trace written by a
second process as ``--trace-out`` writes it), alternately without and with decode runs in the
same process, and reports each run's wall and CPU seconds (with a trace: both processes'), the
steps taken in runs, the trace's bytes, and whether the two give the same summary and split
(everything but the token source's time).

    python benchmarks/bench_decode_runs.py [--log mooncake-conv] [--count N] [--repeats R] [--trace] [--out FILE]
"""
from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.whole_logs import log_parser, parse, stream_log, write_result  # noqa: E402
from pagedkv_core.cli.simulate import _listed  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.record.trace_process import open_trace_writer  # noqa: E402
from pagedkv_core.record.waste import Released, measure_run  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402


def _children_cpu() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


def one_run(log: str, coalesce: bool, requests: int | None = None, trace: Path | None = None) -> dict:
    """The log as ``simulate --workload-file LOG --pool-slots 262144 [--trace-out TRACE]`` runs it."""
    workload, config = stream_log(log, requests)
    t, c, cc = time.perf_counter(), time.process_time(), _children_cpu()
    writer = open_trace_writer(trace, {"workload": workload.name}) if trace is not None else None
    engine = Engine(config, ScriptedSource(), recording=writer, snapshots=False, skip_idle=True, coalesce=coalesce)
    released = Released()
    engine.feed(workload.requests() if writer is None else _listed(workload.requests(), writer), on_release=released)
    try:
        if writer is not None:
            writer.set_header(engine.trace_header())
        summary, breakdown = measure_run(engine, released=released)
    finally:
        if writer is not None:
            writer.close()
    wall, cpu = time.perf_counter() - t, time.process_time() - c + _children_cpu() - cc
    figures = {**summary.to_json(), "waste_breakdown": breakdown}
    figures.pop("mean_execute_s")  # the token source's time: the one figure a decode run changes
    out = {"coalesce": coalesce, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "steps": summary.steps,
           "steps_in_runs": engine.coalesced_steps, "figures": figures}
    if trace is not None:
        out["trace_bytes"] = trace.stat().st_size
    return out


def compare(log: str, repeats: int, requests: int | None = None, trace: Path | None = None) -> dict:
    """``repeats`` pairs, each without then with decode runs."""
    runs = [one_run(log, coalesce, requests, trace) for _ in range(repeats) for coalesce in (False, True)]
    plain, coalesced = runs[0::2], runs[1::2]
    same = all(r["figures"] == runs[0]["figures"] for r in runs)
    best = lambda rs, key: min(r[key] for r in rs)  # noqa: E731  (the least disturbed run)
    row = {"log": log, "requests": requests or "all", "repeats": repeats, "trace": trace is not None, "steps": runs[0]["steps"],
            "steps_in_runs": coalesced[0]["steps_in_runs"], "same_figures": same,
            "wall_s_without": [r["wall_s"] for r in plain], "wall_s_with": [r["wall_s"] for r in coalesced],
            "cpu_s_without": [r["cpu_s"] for r in plain], "cpu_s_with": [r["cpu_s"] for r in coalesced],
            "speedup_best_wall": round(best(plain, "wall_s") / best(coalesced, "wall_s"), 2),
            "speedup_best_cpu": round(best(plain, "cpu_s") / best(coalesced, "cpu_s"), 2)}
    if trace is not None:
        row["trace_bytes_without"], row["trace_bytes_with"] = plain[0]["trace_bytes"], coalesced[0]["trace_bytes"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = log_parser(__doc__)
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs, each without then with decode runs")
    p.add_argument("--trace", action="store_true", help="write each run's trace as simulate --trace-out does")
    args = parse(p, argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    with tempfile.TemporaryDirectory(prefix="pagedkv-decode-runs-") as tmp:
        trace = Path(tmp) / "run.trace" if args.trace else None
        rows = [compare(log, args.repeats, args.count, trace) for log in args.log]
    for r in rows:
        print(f"{r['log']}{' with a trace' if r['trace'] else ''}: {r['steps_in_runs']:,} of {r['steps']:,} steps in "
              f"decode runs; wall s without {r['wall_s_without']}, with {r['wall_s_with']} ({r['speedup_best_wall']}x, "
              f"best of each); the same figures: {r['same_figures']}")
    what = "simulate --trace-out" if args.trace else "simulate without a trace"
    write_result("bench_decode_runs.py", f"decode runs (Engine(coalesce=True)) side by side, {what}", argv, rows, args.out)
    return 0 if all(r["same_figures"] for r in rows) else 1

if __name__ == "__main__":
    sys.exit(main())
