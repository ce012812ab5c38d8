"""JSON-lines traces: a header line (config, requests), then one line per StepSnapshot.

``read_trace(write_trace(path, snaps, header))`` gives back equal snapshots and header.
"""
from __future__ import annotations

import json
from pathlib import Path

from .snapshot import StepSnapshot

TRACE_FORMAT = "pagedkv-trace"
TRACE_VERSION = 1


class TraceError(ValueError):
    """A file that is not a readable pagedkv trace. The message is one line."""


def write_trace(path, snapshots, header: dict | None = None) -> Path:
    """Write ``header`` (JSON-native dict: config, requests, ...) and the snapshots."""
    path = Path(path)
    head = {"type": "header", "format": TRACE_FORMAT, "version": TRACE_VERSION, **(header or {})}
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(head, separators=(",", ":")) + "\n")
        for snap in snapshots:
            line = {"type": "step", **snap.to_json()}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path


def read_trace(path) -> tuple[dict, list[StepSnapshot]]:
    """Returns (header without the bookkeeping keys, snapshots). Raises TraceError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise TraceError(f"{path} is empty, not a pagedkv trace")
    header: dict | None = None
    snaps: list[StepSnapshot] = []
    for number, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if number == 1:
            if not isinstance(obj, dict) or obj.get("type") != "header" or obj.get("format") != TRACE_FORMAT:
                raise TraceError(f"{path}:1: not a pagedkv trace header")
            if obj.get("version") != TRACE_VERSION:
                raise TraceError(f"{path}:1: unsupported trace version {obj.get('version')!r}")
            header = {k: v for k, v in obj.items() if k not in ("type", "format", "version")}
            continue
        if not isinstance(obj, dict) or obj.get("type") != "step":
            raise TraceError(f"{path}:{number}: expected a step record")
        body = {k: v for k, v in obj.items() if k != "type"}
        try:
            snaps.append(StepSnapshot.from_json(body))
        except ValueError as exc:
            raise TraceError(f"{path}:{number}: {exc}") from None
    assert header is not None
    return header, snaps
