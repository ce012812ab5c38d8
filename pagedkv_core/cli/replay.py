"""``python -m pagedkv_core replay TRACE [--step N] [--json]``: one step of a trace.

    python -m pagedkv_core simulate --workload trickle --trace-out run.trace
    python -m pagedkv_core replay run.trace --step 40
    python -m pagedkv_core replay run.trace --json | jq .slot_counts

Rebuilds the snapshot of step N (default: the last) from a trace of any version (1-5) and
prints a short summary: the pool, how many slots are in each state, the queues, the key
metrics and the step's events. ``--json`` prints one object instead, with ``step``,
``allocator``, ``num_slots``, ``num_steps``, ``slot_counts`` (one count per slot-state name)
and ``metrics`` (every StepMetrics field), among others. A trace that cannot be read or a
step it does not hold exits with code 2 and one line.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

from ..kv.registry import allocator_kind
from ..config import ConfigError
from ..record.slot_state import SLOT_STATE_NAMES
from ..record.snapshot import StepSnapshot
from ..record.trace_file import TraceError, load_recording


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="print one step of a trace (default: the last)",
        description="Rebuild one step of a trace (any version, 1 to 5) and summarise it.",
    )
    p.add_argument("trace", metavar="TRACE", help="a trace written by simulate/generate --trace-out or the app")
    p.add_argument("--step", type=int, default=None, metavar="N", help="the step to show (default: the last)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_replay)


def state_counts(codes: np.ndarray) -> dict[str, int]:
    """How many entries hold each slot-state code, by name (every name, zeros included)."""
    counts = np.bincount(codes.astype(np.int64), minlength=len(SLOT_STATE_NAMES)) if len(codes) else np.zeros(len(SLOT_STATE_NAMES), dtype=np.int64)
    return {name: int(counts[code]) for code, name in SLOT_STATE_NAMES.items()}


def step_report(snap: StepSnapshot, recording, header: dict) -> dict:
    """The ``replay --json`` object of one step."""
    out = {
        "step": snap.step,
        "allocator": snap.allocator,
        "kind": allocator_kind(snap.allocator),
        "block_size": snap.block_size,
        "num_slots": snap.num_slots,
        "num_blocks": snap.num_blocks,
        "num_host_blocks": snap.num_host_blocks,
        "num_steps": recording.num_steps,
        "first_step": recording.first_step,
        "last_step": recording.last_step,
        "slot_counts": state_counts(snap.slot_state),
        "queues": {"running": len(snap.running), "waiting": len(snap.waiting), "swapped": len(snap.swapped)},
        "metrics": snap.metrics.to_json(),
        "events": [e.to_json() for e in snap.events],
    }
    if snap.num_blocks:
        out["block_counts"] = state_counts(snap.block_state)
    if isinstance(header.get("workload"), str):
        out["workload"] = header["workload"]
    return out


def format_report(r: dict, path: str) -> str:
    m = r["metrics"]
    pool = f"{r['allocator']}, {r['num_slots']:,} slots"
    if r["kind"] == "paged":
        pool += f", block size {r['block_size']} ({r['num_blocks']:,} blocks)"
    kinds = Counter(e["kind"] for e in r["events"])
    rows = [
        ("trace", f"{path} ({r['num_steps']} steps: {r['first_step']}..{r['last_step']})"),
        ("step", r["step"]),
        ("allocator", pool),
        ("slots", ", ".join(f"{name} {n:,}" for name, n in r["slot_counts"].items())),
        ("sequences", f"{r['queues']['running']} running, {r['queues']['waiting']} waiting, {r['queues']['swapped']} swapped"),
        ("KV usage", f"{m['kv_usage']:.1%} ({m['allocated_slots']:,} slots allocated, {m['filled_slots']:,} filled)"),
        ("token utilization", f"{m['token_utilization']:.1%}"),
        ("this step", f"{m['step_tokens']} tokens ({m['step_prefill_tokens']} prefill, {m['step_decode_tokens']} decode), "
                      f"{m['step_preemptions']} preemptions"),
        ("so far", f"{m['tokens_generated']:,} tokens generated, {m['num_finished']} finished, "
                   f"{m['num_rejected']} rejected, {m['num_preemptions']} preemptions"),
        ("prefix-cache hit rate", f"{m['prefix_cache_hit_rate']:.1%}"),
        ("events", ", ".join(f"{k} {n}" for k, n in kinds.items()) or "none"),
    ]
    if r["kind"] == "contiguous":
        need = m.get("next_reservation", 0)  # traces written before it was recorded lack it
        rows.insert(7, ("fragmentation", f"{m['fragmented_slots']:,} slots in holes, largest free run {m['largest_free_run']:,}"
                        + (f", the head of the queue needs {need:,} in one run" if need else "")))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        header, recording = load_recording(args.trace)
    except TraceError as exc:
        raise ConfigError(str(exc)) from None
    if not recording.num_steps:
        raise ConfigError(f"{args.trace} has a header but no steps")
    step = recording.last_step if args.step is None else args.step
    if step not in recording.steps:
        raise ConfigError(f"--step {step} is not in {args.trace} (steps {recording.first_step}..{recording.last_step})")
    report = step_report(recording.at(step), recording, header)
    print(json.dumps(report) if args.json else format_report(report, args.trace))
    return 0
