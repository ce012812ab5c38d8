"""``python -m pagedkv_core simulate``: a workload through the engine with instant, scripted tokens.

    python -m pagedkv_core simulate --workload explainer40 --allocator contiguous --json
    python -m pagedkv_core simulate --workload-file requests.json --trace-out run.trace
    python -m pagedkv_core simulate --workload-file requests.csv --log-start 500 --log-count 200 \
        --allocator contiguous --contiguous-policy pow2 --json
    python -m pagedkv_core simulate --workload-file conversation_trace.jsonl --log-count 500 \
        --length-scale 1/16 --block-size 32 --pool-slots 65536 --eviction belady --json

Prints the run summary as a table (or one JSON object with ``--json``), with the memory-waste
breakdown of the vLLM paper's Figure 2 (``waste_breakdown``: token, reservation, internal,
external, free, shares of the pool averaged over the steps in which anything is allocated, and
``token_share`` = token / (pool - free)) and the prefix cache's hit rate with its token counts
(``prefix_cache_hit_tokens`` / ``prefix_cache_queried_tokens``: the prompt tokens served from
the cache / the prompt tokens of admitted requests, a re-admission after recompute counted apart
as vLLM does); ``--trace-out`` streams every step into a trace (a recorded run) for
the app's trace viewer and ``replay``. Every flag is checked before the workload is built, and
the workload before the run.

A request log (a CSV, or Mooncake's JSON lines with prefix hashes) is a workload file like any
other; ``--log-start`` and ``--log-count`` pick its window (``--trace-start`` and
``--trace-count``, their former spellings, still work). A log in time order is streamed: checked
whole first, then read again as the run goes and fed to the engine shortly before each request
arrives (:meth:`~pagedkv_core.engine.Engine.feed`), finished requests forgotten, so a log of up to
1,000,000 requests runs in the memory of the requests alive. Its trace lists each request in the
step it arrives (its lengths; the prompt ids are the log's seeded tokens). Idle stretches pass in
one engine step (``Engine(skip_idle=True)``; the summary counts every step), and so do stretches
of steps that are nothing but plain decodes (``Engine(coalesce=True)``: the same summary to the
bit, but for the token source's time; a trace keeps such a run as one frame and its loader
rebuilds the steps).
"""
from __future__ import annotations

import argparse
import json
import sys

from ..config import ConfigError, setting_spec
from ..engine import Engine
from ..sources.scripted import ScriptedSource
from ..safe_io import check_writable
from ..record.waste import CLASSES, Released, measure_run
from ..workloads.hashed_log import DEFAULT_CONTEXT as HASHED_LOG_CONTEXT
from ..workloads.scenarios import OVERLONG, WORKLOADS, LogOptions, LogStream, build_workload, load_workload_file, stream_workload_file
from .flags import add_engine_args, config_from_args
from .kv_events import add_kv_events_args, check_kv_events, open_kv_events
from .parsing import add_renamed, length_scale, trace_writer
from .progress import ProgressLine
from .summary import summary_table


LOG_FLAGS = {"start": "log_start", "count": "log_count", "seconds_per_step": "seconds_per_step", "rate": "rate",
               "max_tokens": "max_tokens", "max_context": "max_context", "length_scale": "length_scale",
               "overlong": "overlong"}
MAX_REJECTIONS_LISTED = 20  # the text summary's rejection lines (--json lists them all)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine with the scripted token source",
        description="Run a workload through the engine with instant, scripted tokens.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"built-in workload: {', '.join(WORKLOADS)}")
    src.add_argument("--workload-file", metavar="PATH",
                     help="JSON list of requests, a request log CSV (TIMESTAMP, ContextTokens, GeneratedTokens), "
                          "or a request log with prefix hashes, JSON lines (.jsonl) of {timestamp, input_length, "
                          "output_length, hash_ids} as Mooncake publishes")
    t = p.add_argument_group("request logs (--workload-file *.csv or *.jsonl)")
    defaults = LogOptions()
    add_renamed(t, "--log-start", "--trace-start", type=int, metavar="ROW", help="rows to skip (default 0)")
    add_renamed(t, "--log-count", "--trace-count", type=int, metavar="N", help="requests to take (default: the rest)")
    t.add_argument("--seconds-per-step", type=float, metavar="S",
                   help=f"the log's seconds one engine step stands for (default {defaults.seconds_per_step:g})")
    t.add_argument("--rate", type=float, metavar="X", help="arrival rate multiplier (default 1)")
    t.add_argument("--max-tokens", metavar="context|answer|N",
                   help="what a request may write, i.e. what Orca (Max) reserves beyond the prompt: up to the "
                        f"max context (default, {defaults.max_context:,} tokens), the answer's own length, or a fixed cap N")
    t.add_argument("--max-context", type=int, metavar="N",
                   help=f"the model's context (default {defaults.max_context:,}; {HASHED_LOG_CONTEXT:,} for a .jsonl log)")
    t.add_argument("--overlong", choices=OVERLONG,
                   help="a row longer than the context (--max-tokens context): serve it (default: its answer cut at "
                        "the context; rejected, with the reason, when its prompt alone fills it) or leave it out "
                        "(counted in the summary's left_out)")
    t.add_argument("--length-scale", type=length_scale, metavar="F",
                   help="scale every length, e.g. 0.125 or 1/8 (default 1); in a .jsonl log a 512-token hash block "
                        "becomes 512*F tokens, a whole number the block size must divide")
    pool = setting_spec("pool_slots").default
    add_engine_args(p, default_notes={"pool_slots": f"default: the workload's pool size, else {pool}"})
    p.add_argument("--trace-out", metavar="PATH",
                   help="record the run as a pagedkv trace (every step; a JSON header line, then binary frames) for replay and the app")
    p.add_argument("--json", action="store_true", help="print one JSON object (the run summary)")
    add_kv_events_args(p)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    # The flags first (the pool size may come from the workload), and the trace's path: a bad
    # value fails before the workload is built or run.
    flags = config_from_args(args, pool_slots=setting_spec("pool_slots").default)
    check_kv_events(args, flags.allocator)
    if args.trace_out:
        check_writable(args.trace_out, "trace")
    options = {name: getattr(args, flag) for name, flag in LOG_FLAGS.items() if getattr(args, flag) is not None}
    if args.workload is not None:
        if options:
            raise ConfigError(f"--{LOG_FLAGS[sorted(options)[0]].replace('_', '-')} applies only to --workload-file "
                              f"*.csv or *.jsonl")
        workload = build_workload(args.workload, args.seed)
    else:
        load = load_workload_file if flags.eviction == "belady" else stream_workload_file  # Belady needs all up front
        workload = load(args.workload_file, args.seed, **options)
    config = config_from_args(args, pool_slots=workload.pool_slots)
    problem = workload.block_size_problem(config)
    if problem is not None:
        raise ConfigError(problem)
    # The trace is written by a process of its own where a second core is there: encoding and
    # deflating a step cost about as much as the step (record/trace_process.py).
    writer = trace_writer(args.trace_out, {"workload": workload.name}, background=True) if args.trace_out else None
    sink = None
    try:
        sink = open_kv_events(args, config.block_size)
        # No pool view unless a trace is written: the waste split reads the allocator, and
        # nothing else here reads the per-slot arrays.
        engine = Engine(config, ScriptedSource(), recording=writer, kv_event_sink=sink, snapshots=False, skip_idle=True,
                        coalesce=True)  # a trace keeps a decode run as one frame
        released = Released()  # a streamed run forgets finished sequences: the waste split needs their ends
        if isinstance(workload, LogStream):
            engine.feed(workload.requests() if writer is None else _listed(workload.requests(), writer),
                        on_release=released)
        else:
            workload.submit(engine)
        if writer is not None:
            writer.set_header(engine.trace_header())  # a streamed run's requests: in their steps
        progress = ProgressLine(sys.stderr) if sys.stderr.isatty() else None  # a terminal sees the run go
        try:
            summary, breakdown = measure_run(engine, released=released, on_step=progress)  # the trace writer records each step
        finally:
            if progress is not None:
                progress.clear()
    finally:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()
    out = summary.to_json()
    out["waste_breakdown"] = {k: breakdown[k] for k in CLASSES}
    out["token_share"] = breakdown["token_share"]
    out["workload"] = workload.name
    out["seed"] = args.seed
    if workload.left_out is not None:  # log rows never submitted: reported beside the rejections
        out["left_out"] = workload.left_out.to_json()
    if sink is not None:
        out["kv_events"] = sink.summary()
    if args.json:
        print(json.dumps(out))
    else:
        print(format_summary(out))
    return 0


class _Listed:
    """A streamed request that, when the engine submits it, is listed in that step of the trace."""

    __slots__ = ("request", "writer")

    def __init__(self, request, writer):
        self.request = request
        self.writer = writer

    @property
    def arrival_step(self) -> int:
        return self.request.arrival_step

    def submit(self, engine) -> None:
        self.request.submit(engine)
        self.writer.add_requests([self.request.trace_entry()])


def _listed(requests, writer):
    return (_Listed(r, writer) for r in requests)


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
    left_out = [f"left out: {s['left_out']['rows']:,} rows of the log, {s['left_out']['reason']}"] if "left_out" in s else []
    rejected = s["rejected"]
    listed = [f"rejected {r['id']}: {r['reason']}" for r in rejected[:MAX_REJECTIONS_LISTED]]
    if len(rejected) > MAX_REJECTIONS_LISTED:  # a whole log can have thousands: the JSON lists every one
        listed.append(f"... and {len(rejected) - MAX_REJECTIONS_LISTED:,} more rejected (--json lists every one)")
    return "\n".join([table] + listed + left_out)

