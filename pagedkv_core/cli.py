"""Command line: ``python -m pagedkv_core <subcommand> ...``.

Adding a subcommand: write ``register(subparsers)`` that calls ``subparsers.add_parser(...)``,
sets ``func=handler`` with ``set_defaults`` (``handler(args) -> int`` exit code), and append
it to :data:`SUBCOMMANDS`. Engine flags shared by every subcommand that builds an engine come
from :func:`add_engine_args` and :func:`config_from_args`.

Any invalid setting or workload exits with code 2 and one line on stderr naming the bad
value, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import json
import sys
from collections.abc import Callable

from .config import ALLOCATORS, PREEMPTION_MODES, ConfigError, EngineConfig
from .engine import Engine
from .scripted import ScriptedSource
from .trace import write_trace
from .workloads import WORKLOADS, build_workload, load_workload_file

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command line; the message is one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) and exit with code 2."""

    def error(self, message: str):  # noqa: D401
        raise UsageError(f"{self.prog}: {message}")


def add_engine_args(parser: argparse.ArgumentParser, pool_default: int | None = None) -> None:
    """The engine flags (see EngineConfig). ``--pool-slots`` defaults to ``pool_default``
    (None: the workload's suggestion, else EngineConfig's default)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--allocator", default="paged", help=f"KV allocator: {' | '.join(ALLOCATORS)} (default paged)")
    g.add_argument("--pool-slots", type=int, default=pool_default, metavar="N", help="device KV slots")
    g.add_argument("--block-size", type=int, default=16, metavar="B", help="slots per block (default 16)")
    g.add_argument("--watermark", type=float, default=0.01, metavar="F", help="pool fraction admissions leave free (default 0.01)")
    g.add_argument("--preemption", default="recompute", help=f"{' | '.join(PREEMPTION_MODES)} (default recompute)")
    g.add_argument("--swap-slots", type=int, default=None, metavar="N", help="host slots for swapped blocks (default: the pool size; generate caps it at 1 GiB of K/V)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    g.add_argument("--max-batch-tokens", type=int, default=None, metavar="N", help="tokens per step (default unlimited)")
    g.add_argument("--seed", type=int, default=0, metavar="S", help="workload seed (default 0)")


def engine_settings(args: argparse.Namespace) -> dict:
    """The EngineConfig fields that the flags of :func:`add_engine_args` set (pool size aside)."""
    return dict(
        block_size=args.block_size,
        watermark=args.watermark,
        preemption=args.preemption,
        swap_slots=args.swap_slots,
        prefix_caching=not args.no_prefix_caching,
        max_batch_tokens=args.max_batch_tokens,
        allocator=args.allocator,
        seed=args.seed if args.seed is not None else 0,
    )


def config_from_args(args: argparse.Namespace, pool_slots: int | None = None, **overrides) -> EngineConfig:
    """EngineConfig from the flags of :func:`add_engine_args`. Raises ConfigError."""
    pool = args.pool_slots if args.pool_slots is not None else pool_slots
    kwargs = engine_settings(args)
    if pool is not None:
        kwargs["pool_slots"] = pool
    kwargs.update(overrides)
    return EngineConfig(**kwargs)


# ---------------------------------------------------------------------------- simulate
def register_simulate(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a workload through the engine with the scripted token source",
        description="Run a workload through the engine with instant, scripted tokens.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"built-in workload: {', '.join(WORKLOADS)}")
    src.add_argument("--workload-file", metavar="PATH", help="JSON list of requests")
    add_engine_args(p)
    p.add_argument("--trace-out", metavar="PATH", help="write every step's snapshot as JSON lines")
    p.add_argument("--json", action="store_true", help="print one JSON object (the run summary)")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.workload is not None:
        workload = build_workload(args.workload, args.seed)
    else:
        workload = load_workload_file(args.workload_file, args.seed)
    config = config_from_args(args, pool_slots=workload.pool_slots)
    engine = Engine(config, ScriptedSource())
    workload.submit(engine)
    snapshots = []
    keep = snapshots.append if args.trace_out else None
    summary = engine.run(on_step=(lambda _o, snap: keep(snap)) if keep else None)
    if args.trace_out:
        try:
            write_trace(args.trace_out, snapshots, {**engine.trace_header(), "workload": workload.name})
        except OSError as exc:
            raise ConfigError(f"cannot write trace {args.trace_out!r}: {exc.strerror}") from None
    out = summary.to_json()
    out["workload"] = workload.name
    out["seed"] = args.seed
    if args.json:
        print(json.dumps(out))
    else:
        print(format_summary(out))
    return 0


def format_summary(s: dict) -> str:
    rows = [
        ("workload", f"{s['workload']} (seed {s['seed']})"),
        ("allocator", f"{s['allocator']}, {s['pool_slots']} slots" + (f", block size {s['block_size']}" if s["allocator"] == "paged" else "")),
        ("steps", s["steps"]),
        ("requests", f"{s['requests']} ({s['finished']} finished, {len(s['rejected'])} rejected)"),
        ("tokens generated", s["tokens_generated"]),
        ("running", f"peak {s['peak_running']}, mean {s['mean_running']:.1f}"),
        ("KV usage (mean)", f"{s['mean_kv_usage']:.1%}"),
        ("token utilization (mean)", f"{s['mean_token_utilization']:.1%}"),
        ("preemptions", f"{s['preemptions']} (swap out {s['swaps_out']}, in {s['swaps_in']}; recompute {s['recomputes']})"),
        ("prefix-cache hit rate", f"{s['prefix_cache_hit_rate']:.1%}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    for r in s["rejected"]:
        lines.append(f"rejected {r['id']}: {r['reason']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- dispatch
def register_generate(subparsers) -> None:
    from .cli_generate import register  # the real model (torch) loads only when generate runs

    register(subparsers)


def register_bench(subparsers) -> None:
    from .cli_bench import register  # torch and transformers load only when a benchmark needs them

    register(subparsers)


SUBCOMMANDS: list[Callable] = [register_simulate, register_generate, register_bench]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m pagedkv_core", description="pagedkv: a paged KV-cache engine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
