"""Uploaded runs: a pagedkv trace file replayed as a finished :class:`~ui.runs.model.Run`,
streamed from its bytes into a recording. No Streamlit here (the sidebar's upload, its session
cache and the error it shows are :func:`ui.runs.session.uploaded_trace`'s)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.record.trace_file import TraceError, load_recording
from ui.runs.model import Run


def replay_trace(name: str, data: bytes) -> Run:
    """The trace file ``name`` (its bytes ``data``) as a finished run. Raises TraceError (one line
    that names the file as ``name``) when it is not a pagedkv trace, has no steps, or its config
    is invalid."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "upload.jsonl"
        path.write_bytes(data)
        try:
            header, recording = load_recording(path)
        except TraceError as exc:
            raise TraceError(str(exc).replace(str(path), name)) from None
    if not recording.num_steps:
        raise TraceError("the trace has a header but no steps")
    first = recording.at(recording.first_step, copy=False)
    try:
        config = EngineConfig.from_dict(header.get("config", {})) if header.get("config") else EngineConfig(
            allocator=first.allocator, block_size=max(1, first.block_size), pool_slots=first.num_slots)
    except (ConfigError, TypeError) as exc:
        raise TraceError(f"its config is invalid ({exc})") from None
    ids = [str(r.get("id", i)) if isinstance(r, dict) else str(i) for i, r in enumerate(header.get("requests", []))]
    return Run(f"trace {name}", config, request_ids=ids, done=True, recording=recording)
