"""The run summary as an aligned table: the rows every command shares, written once.

A command lists its rows in order: a name picks one of :data:`ROWS` (formatted from
``RunSummary.to_json()``'s keys), a ``(label, value)`` pair is a row of its own.
"""
from __future__ import annotations

from ..kv.registry import allocator_kind


def allocator_text(s: dict) -> str:
    text = f"{s['allocator']}, {s['pool_slots']} slots"
    if allocator_kind(s["allocator"]) == "paged":  # block size means nothing to a per-slot layout
        text += f", block size {s['block_size']}"
    return text


ROWS = {
    "allocator": allocator_text,
    "steps": lambda s: s["steps"],
    "running": lambda s: f"peak {s['peak_running']}, mean {s['mean_running']:.1f}",
    "KV usage (mean)": lambda s: f"{s['mean_kv_usage']:.1%}",
    "token utilization (mean)": lambda s: f"{s['mean_token_utilization']:.1%}",
    "preemptions": lambda s: (f"{s['preemptions']} (swap out {s['swaps_out']}, in {s['swaps_in']}; "
                              f"recompute {s['recomputes']})"),
    "prefix-cache hit rate": lambda s: f"{s['prefix_cache_hit_rate']:.1%}",
}


def summary_table(s: dict, rows: list) -> str:
    pairs = [(r, ROWS[r](s)) if isinstance(r, str) else r for r in rows]
    width = max(len(label) for label, _ in pairs)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in pairs)
