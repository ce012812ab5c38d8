"""``python -m pagedkv_core simulate``: a workload through the engine with instant, scripted tokens.

    python -m pagedkv_core simulate --workload explainer40 --allocator contiguous --json
    python -m pagedkv_core simulate --workload-file requests.json --trace-out run.jsonl

Prints the run summary as a table (or one JSON object with ``--json``); ``--trace-out`` streams
every step into a trace (JSON lines) for the app's trace viewer and ``replay``. Every flag is
checked before the workload is built, and the workload before the run.
"""
from __future__ import annotations

import argparse
import json

from ..config import ConfigError, setting_spec
from ..engine import Engine
from ..scripted import ScriptedSource
from ..safe_io import check_writable
from ..trace import TraceWriter
from ..workloads import WORKLOADS, build_workload, load_workload_file
from .flags import add_engine_args, config_from_args
from .summary import summary_table


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine with the scripted token source",
        description="Run a workload through the engine with instant, scripted tokens.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"built-in workload: {', '.join(WORKLOADS)}")
    src.add_argument("--workload-file", metavar="PATH", help="JSON list of requests")
    pool = setting_spec("pool_slots").default
    add_engine_args(p, default_notes={"pool_slots": f"default: the workload's pool size, else {pool}"})
    p.add_argument("--trace-out", metavar="PATH", help="write every step's snapshot as JSON lines")
    p.add_argument("--json", action="store_true", help="print one JSON object (the run summary)")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    # The flags first (the pool size may come from the workload), and the trace's path: a bad
    # value fails before the workload is built or run.
    config_from_args(args, pool_slots=setting_spec("pool_slots").default)
    if args.trace_out:
        check_writable(args.trace_out, "trace")
    if args.workload is not None:
        workload = build_workload(args.workload, args.seed)
    else:
        workload = load_workload_file(args.workload_file, args.seed)
    config = config_from_args(args, pool_slots=workload.pool_slots)
    writer = _trace_writer(args.trace_out, workload.name) if args.trace_out else None
    try:
        engine = Engine(config, ScriptedSource(), recording=writer)
        workload.submit(engine)
        if writer is not None:
            writer.set_header(engine.trace_header())
        while engine.has_unfinished():  # the trace writer records each step: no snapshot copies
            engine.step(snapshot=False)
    finally:
        if writer is not None:
            writer.close()
    out = engine.summary().to_json()
    out["workload"] = workload.name
    out["seed"] = args.seed
    if args.json:
        print(json.dumps(out))
    else:
        print(format_summary(out))
    return 0


def _trace_writer(path: str, workload: str) -> TraceWriter:
    """A trace streamed as the run goes (only the last step is held in memory)."""
    try:
        return TraceWriter(path, {"workload": workload})
    except OSError as exc:
        raise ConfigError(f"cannot write trace {path!r}: {exc.strerror}") from None


def format_summary(s: dict) -> str:
    table = summary_table(s, [
        ("workload", f"{s['workload']} (seed {s['seed']})"),
        "allocator",
        "steps",
        ("requests", f"{s['requests']} ({s['finished']} finished, {len(s['rejected'])} rejected)"),
        ("tokens generated", s["tokens_generated"]),
        "running",
        "KV usage (mean)",
        "token utilization (mean)",
        "preemptions",
        "prefix-cache hit rate",
    ])
    return "\n".join([table] + [f"rejected {r['id']}: {r['reason']}" for r in s["rejected"]])
