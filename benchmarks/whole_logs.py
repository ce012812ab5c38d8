"""The whole request logs that ``quiet_steps.py`` and ``bench_decode_runs.py`` replay, and how both report.

Each replays ``bench replay-speed``'s logs as ``simulate`` runs them (262,144 slots, paged, the
block size and length scale ``bench replay-speed`` gives each log), takes ``--log`` (repeatable),
``--count`` and ``--out``, and writes one JSON object with a row a log.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.bench_replay_speed import LOGS, PAGED_BLOCK_SIZE, POOL, cpu_info
from pagedkv_core.cli.parsing import length_scale
from pagedkv_core.config import EngineConfig
from pagedkv_core.workloads.scenarios import stream_workload_file

WHOLE_LOGS = ("azure-conv", "mooncake-conv")  # bench replay-speed's whole logs at their default context


def log_parser(doc: str) -> argparse.ArgumentParser:
    """``--log``, ``--count`` and ``--out``; :func:`parse` checks them."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--log", choices=WHOLE_LOGS, action="append", help="default: both")
    p.add_argument("--count", type=int, default=None, help="the log's first N requests (default: all)")
    p.add_argument("--out", type=Path, default=None, help="a JSON file for the result")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.count is not None and args.count < 1:
        p.error("--count must be >= 1")
    args.log = args.log or list(WHOLE_LOGS)
    return args


def stream_log(log: str, requests: int | None = None):
    """(the log streamed, its first ``requests`` or all, and the engine's config) as ``bench
    replay-speed`` gives them to ``simulate``."""
    path, extra = LOGS[log]
    options = {"count": requests} if requests else {}
    if extra[:1] == ["--length-scale"]:
        options["length_scale"] = length_scale(extra[1])
    config = EngineConfig(pool_slots=POOL, **({"block_size": PAGED_BLOCK_SIZE[log]} if log in PAGED_BLOCK_SIZE else {}))
    return stream_workload_file(path, 0, **options), config


def write_result(script: str, benchmark: str, argv: list[str] | None, rows: list[dict], out: Path | None) -> dict:
    """The result (what, when, the machine, the command, the rows), written to ``out`` when given."""
    result = {"benchmark": benchmark, "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), **cpu_info(),
              "command": " ".join([f"python benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])]),
              "rows": rows}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result
