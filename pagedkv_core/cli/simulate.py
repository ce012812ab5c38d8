"""``python -m pagedkv_core simulate``: a workload through the engine with instant, scripted tokens.

    python -m pagedkv_core simulate --workload explainer40 --allocator contiguous --json
    python -m pagedkv_core simulate --workload-file requests.json --trace-out run.jsonl
    python -m pagedkv_core simulate --workload-file trace.csv --trace-start 500 --trace-count 200 \
        --allocator contiguous --contiguous-policy pow2 --json
    python -m pagedkv_core simulate --workload-file conversation_trace.jsonl --trace-count 500 \
        --length-scale 1/16 --block-size 32 --pool-slots 65536 --eviction belady --json

Prints the run summary as a table (or one JSON object with ``--json``), with the memory-waste
breakdown of the vLLM paper's Figure 2 (``waste_breakdown``: token, reservation, internal,
external, free, shares of the pool averaged over the steps in which anything is allocated, and
``token_share`` = token / (pool - free)) and the prefix cache's hit rate with its token counts
(``prefix_cache_hit_tokens`` / ``prefix_cache_queried_tokens``: the prompt tokens served from
the cache / the prompt tokens of admitted requests, a re-admission after recompute counted apart
as vLLM does); ``--trace-out`` streams every step into a trace for
the app's trace viewer and ``replay``. Every flag is checked before the workload is built, and
the workload before the run.
"""
from __future__ import annotations

import argparse
import json
from fractions import Fraction

from ..config import ConfigError, setting_spec
from ..engine import Engine
from ..sources.scripted import ScriptedSource
from ..safe_io import check_writable
from ..record.waste import CLASSES, WasteAccumulator, final_written
from ..workloads.hashed_log import DEFAULT_CONTEXT as HASH_TRACE_CONTEXT
from ..workloads.scenarios import WORKLOADS, TraceOptions, build_workload, load_workload_file
from .flags import add_engine_args, config_from_args
from .kv_events import add_kv_events_args, check_kv_events, open_kv_events
from .parsing import trace_writer
from .summary import summary_table


TRACE_FLAGS = {"start": "trace_start", "count": "trace_count", "seconds_per_step": "seconds_per_step", "rate": "rate",
               "max_tokens": "max_tokens", "max_context": "max_context", "length_scale": "length_scale"}


def _scale(text: str) -> float:
    """A length scale: a number or a fraction (``0.0625``, ``1/16``)."""
    try:
        return float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"must be a number or a fraction such as 1/16, got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine with the scripted token source",
        description="Run a workload through the engine with instant, scripted tokens.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"built-in workload: {', '.join(WORKLOADS)}")
    src.add_argument("--workload-file", metavar="PATH",
                     help="JSON list of requests, a request trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens), "
                          "or a request trace with prefix hashes, JSON lines (.jsonl) of {timestamp, input_length, "
                          "output_length, hash_ids} as Mooncake publishes")
    t = p.add_argument_group("request traces (--workload-file *.csv or *.jsonl)")
    defaults = TraceOptions()
    t.add_argument("--trace-start", type=int, metavar="ROW", help="rows to skip (default 0)")
    t.add_argument("--trace-count", type=int, metavar="N", help="requests to take (default: the rest)")
    t.add_argument("--seconds-per-step", type=float, metavar="S",
                   help=f"trace seconds one engine step stands for (default {defaults.seconds_per_step:g})")
    t.add_argument("--rate", type=float, metavar="X", help="arrival rate multiplier (default 1)")
    t.add_argument("--max-tokens", metavar="context|answer|N",
                   help="what a request may write, i.e. what Orca (Max) reserves beyond the prompt: up to the "
                        f"max context (default, {defaults.max_context:,} tokens), the answer's own length, or a fixed cap N")
    t.add_argument("--max-context", type=int, metavar="N",
                   help=f"the model's context (default {defaults.max_context:,}; {HASH_TRACE_CONTEXT:,} for a .jsonl trace)")
    t.add_argument("--length-scale", type=_scale, metavar="F",
                   help="scale every length, e.g. 0.125 or 1/8 (default 1); in a .jsonl trace a 512-token hash block "
                        "becomes 512*F tokens, a whole number the block size must divide")
    pool = setting_spec("pool_slots").default
    add_engine_args(p, default_notes={"pool_slots": f"default: the workload's pool size, else {pool}"})
    p.add_argument("--trace-out", metavar="PATH", help="write every step's snapshot as JSON lines")
    p.add_argument("--json", action="store_true", help="print one JSON object (the run summary)")
    add_kv_events_args(p)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    # The flags first (the pool size may come from the workload), and the trace's path: a bad
    # value fails before the workload is built or run.
    check_kv_events(args, config_from_args(args, pool_slots=setting_spec("pool_slots").default).allocator)
    if args.trace_out:
        check_writable(args.trace_out, "trace")
    options = {name: getattr(args, flag) for name, flag in TRACE_FLAGS.items() if getattr(args, flag) is not None}
    if args.workload is not None:
        if options:
            raise ConfigError(f"--{TRACE_FLAGS[sorted(options)[0]].replace('_', '-')} applies only to --workload-file "
                              f"*.csv or *.jsonl")
        workload = build_workload(args.workload, args.seed)
    else:
        workload = load_workload_file(args.workload_file, args.seed, **options)
    config = config_from_args(args, pool_slots=workload.pool_slots)
    problem = workload.block_size_problem(config)
    if problem is not None:
        raise ConfigError(problem)
    writer = trace_writer(args.trace_out, {"workload": workload.name}) if args.trace_out else None
    sink = None
    try:
        sink = open_kv_events(args, config.block_size)
        engine = Engine(config, ScriptedSource(), recording=writer, kv_event_sink=sink)
        workload.submit(engine)
        if writer is not None:
            writer.set_header(engine.trace_header())
        waste = WasteAccumulator()
        while engine.has_unfinished():  # the trace writer records each step: no snapshot copies
            engine.step(snapshot=False)
            waste.add_engine(engine)
    finally:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()
    out = engine.summary().to_json()
    breakdown = waste.breakdown(final_written(engine))
    out["waste_breakdown"] = {k: breakdown[k] for k in CLASSES}
    out["token_share"] = breakdown["token_share"]
    out["workload"] = workload.name
    out["seed"] = args.seed
    if sink is not None:
        out["kv_events"] = sink.summary()
    if args.json:
        print(json.dumps(out))
    else:
        print(format_summary(out))
    return 0


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
        ("prefix-cache hit rate", f"{s['prefix_cache_hit_rate']:.1%} ({s['prefix_cache_hit_tokens']:,} of "
                                  f"{s['prefix_cache_queried_tokens']:,} prompt tokens; eviction {s['eviction']})"),
        ("memory (paper's Figure 2)", ", ".join(f"{k} {v:.1%}" for k, v in s["waste_breakdown"].items())
         + f"; token share {s['token_share']:.1%}"),
    ])
    return "\n".join([table] + [f"rejected {r['id']}: {r['reason']}" for r in s["rejected"]])
