"""Traces: a run's header and its steps in one file, written as the run goes.

Version 5 (written today) is version 4 with one more frame: a *decode run* (the steps in which
every running sequence decoded one token plainly, that ``Engine(coalesce=True)`` takes at once)
is one frame of what it wrote, not a frame a step; the loader rebuilds its steps
(:mod:`pagedkv_core.record.decode_run`). A reader from before version 5 refuses such a file by
its version; ``TraceWriter(..., version=4)`` still writes version 4 (a run's steps one by one).

Version 4 is version 3 below in binary frames: the header is still its first
line, JSON text, and after it each step is a frame whose one deflated piece holds the step's
metrics (binary) and its record, with no base64 (:mod:`pagedkv_core.record.trace_frames`). The
whole Azure conversation log at 262,144 slots, paged: see the README's *Traces* section.

Version 3 (still written with ``TraceWriter(..., version=3)``, and read) keeps version 2's
lines (below) and changes three things:

- ``"encoding": "narrow+delta+shuffle+deflate-stream+base64"``: each record's ``data`` is its
  file form (:mod:`pagedkv_core.record.stream_codec`: pool and per-sequence values as
  differences from the step before, indices as differences along the array, each field in its
  narrowest width, bytes shuffled into planes), deflated as one stream with a sync flush a line;
  the stream restarts at every keyframe line, so a reader can start at any keyframe;
- a step that changes nothing (an idle stretch, ``Engine(skip_idle=True)``) is no delta line:
  a run of them is one line, ``{"type": "idle", "step": S, "steps": N, "metrics": [...]}``,
  steps S..S+N-1 each repeating the step before S, with no events and these metrics (requests
  submitted in those steps ride on it as on a delta line);
- keyframes come far less often (:func:`v3_keyframe_every`: 16,384 steps at 262,144 slots), as
  the loader rebuilds its own and the file's only check the deltas and let a reader start there.

Measured on the first 5,000 requests of the Azure conversation log at 262,144 slots (23,4xx
steps, paged): 56.7 MB, 2.4 KB a step, against version 2's 180 MB (7.7 KB a step). What is left
is mostly what no encoding can drop: the token ids a step writes (about 2 bytes each, 237 a
step on average), the new blocks' 64-bit prefix hashes, and each line's metrics as JSON.

Version 2 (still written with ``TraceWriter(..., version=2)``, and read) is JSON lines::

    {"type": "header", "format": "pagedkv-trace", "version": 2, "pool": {allocator, block_size,
     num_slots, num_blocks, num_host_blocks}, "metric_fields": [...], "keyframe_every": K,
     "encoding": "zlib+base64", "record_fields": {...the record layouts...}, ...the caller's
     header: config, requests, workload...}
    {"type": "delta", "step": 0, "metrics": [...], "data": "<base64 of zlib of a step record>"}
    {"type": "keyframe", "step": 0, "data": "<base64 of zlib of a keyframe record>"}
    {"type": "delta", "step": 1, ...}
    ...
    {"type": "end", "steps": N, ...keys that override the header's (a summary, say)}

A step record holds only what the step changed, a keyframe every array of its step (see
:mod:`pagedkv_core.record.step_codec`: both are little-endian numpy bytes, the same records a
:class:`~pagedkv_core.record.recording.Recording` keeps in memory). The first step is always
followed by its keyframe; after that a keyframe comes every K steps, so a reader can start
there, and the loader checks each one against the deltas before it. The metrics of a step
are a JSON list in ``metric_fields`` order, readable without decoding anything.

Why JSON lines of base64 zlib records rather than a zip of .npy files: the file is streamed
(each step is one line written when the step ends, so a run that dies leaves a trace that
loads up to its last whole line, while a zip's central directory is only written at close);
the header stays human-readable (``head -1 trace.jsonl``) and the framing is version 1's, so
one reader takes both; and the payload is binary where it matters: zlib over the raw arrays
more than pays back base64's 4/3. Measured: explainer40 (2,048 slots) takes 1.3 KB a step
paged and 0.5 KB contiguous (version 1: 27 and 18 KB); 5,000 steps of a 262,144-slot pool take
34 MB (6.8 KB a step; version 1 took about 3 MB a step at that size).

A run fed its requests as they arrive (a streamed request log, see
:meth:`~pagedkv_core.engine.Engine.feed`) cannot list them in its header: each delta line then
carries ``"requests": [...]``, the requests submitted in that step, and the loader appends them
to the header's ``requests`` in order, so a reader sees one list either way.

A trace without its end record (the writer never closed: the run died) still loads, up to its
last whole line, and its header then says ``"truncated": true``.

Version 1 (one full ``StepSnapshot.to_json()`` per line) still loads: it is converted
step by step into a Recording. Every malformed input raises :class:`TraceError` with one
line; files over :data:`MAX_TRACE_BYTES` and lines over :data:`MAX_LINE_BYTES` are refused
before they are read.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import zlib
from dataclasses import fields
from pathlib import Path

from ..config import MAX_BLOCK_SIZE, MAX_POOL_SLOTS, MAX_SWAP_SLOTS, ConfigError
from ..metrics import StepMetrics
from .recording import (
    INT_METRICS,
    KEYFRAME_BYTES_PER_STEP,
    POOL_SCALARS,
    Recorder,
    Recording,
    default_keyframe_every,
    pool_bytes,
)
from ..safe_io import loads_strict, open_capped
from .decode_run import end_delta, pack_run, unpack_run
from .snapshot import StepSnapshot
from .step_codec import KEYFRAME_FIELDS, STEP_FIELDS, StepState, check_states, repeat_record
from .stream_codec import Deflater, Inflater, pack_file_record, unpack_file_record
from .trace_frames import KIND_DELTA, KIND_JSON, KIND_KEYFRAME, KIND_RUN, STEP, MetricsCodec, frame, read_frames

TRACE_FORMAT = "pagedkv-trace"
TRACE_VERSION = 5
WRITABLE_VERSIONS = (2, 3, 4, 5)
READABLE_VERSIONS = (1, 2, 3, 4, 5)
ENCODING = "zlib+base64"  # version 2: each record deflated on its own
ENCODING_V3 = "narrow+delta+shuffle+deflate-stream+base64"  # version 3: see stream_codec
ENCODING_V4 = "narrow+delta+shuffle+deflate-stream+frames"  # version 4: see trace_frames
ENCODINGS = {2: ENCODING, 3: ENCODING_V3, 4: ENCODING_V4, 5: ENCODING_V4}  # version 5: version 4's, plus run frames
MAX_TRACE_BYTES = 4 << 30  # 4 GiB: what a 1,048,576-slot run of several thousand steps can reach
MAX_LINE_BYTES = 256 << 20  # one record (a version-1 step of a 1M-slot pool is about 20 MB)
MAX_RECORD_BYTES = 1 << 30  # a record, decompressed
TRACE_KEYFRAME_BYTES_PER_STEP = KEYFRAME_BYTES_PER_STEP // 4  # version 2: a file needs keyframes only to seek and check
V3_KEYFRAME_BYTES_PER_STEP = 256  # version 3: raw pool bytes a step (a keyframe deflates to about a third)
V3_MIN_KEYFRAME_EVERY, V3_MAX_KEYFRAME_EVERY = 32, 1 << 16
METRIC_FIELDS = tuple(f.name for f in fields(StepMetrics))
V4_STEP_BYTES = STEP.size  # a version-4 delta, keyframe or run frame's step number, before its deflated piece
# The record layouts, as numpy type strings: a reader refuses a trace whose layouts differ.
RECORD_FIELDS = {"step": {k: v.str for k, v in STEP_FIELDS.items()}, "keyframe": {k: v.str for k, v in KEYFRAME_FIELDS.items()}}
_FRAME_TYPES = {KIND_DELTA: "delta", KIND_KEYFRAME: "keyframe", KIND_RUN: "run"}  # trace_records' names
_BOOKKEEPING = ("type", "format", "version", "pool", "metric_fields", "keyframe_every", "encoding", "record_fields")


def v3_keyframe_every(num_slots: int, num_blocks: int) -> int:
    """A version-3 trace's keyframe interval: the power of two, between 32 and 65,536, that keeps
    keyframes near :data:`V3_KEYFRAME_BYTES_PER_STEP` raw pool bytes a step (16,384 at 262,144
    slots). A reader rebuilds its own keyframes as it loads: the file's only let it start there."""
    want = max(1, -(-pool_bytes(num_slots, num_blocks) // V3_KEYFRAME_BYTES_PER_STEP))
    return min(max(1 << (want - 1).bit_length(), V3_MIN_KEYFRAME_EVERY), V3_MAX_KEYFRAME_EVERY)


class TraceError(ValueError):
    """A file that is not a readable pagedkv trace. The message is one line."""


# ---------------------------------------------------------------------------- writing
class TraceWriter(Recorder):
    """Streams a run into a trace (version 4 unless ``version`` says 2 or 3). It is a recorder,
    so the engine can record into it directly (``Engine(config, source, recording=writer)``) and
    nothing but the last step stays in memory. The header line is written with the first step
    (or at close), so :meth:`set_header` may still add the requests after the engine is built."""

    def __init__(self, path, header: dict | None = None, scalars: dict | None = None,
                 keyframe_every: int | None = None, level: int | None = None, version: int = TRACE_VERSION):
        super().__init__(keyframe_every)
        if version not in WRITABLE_VERSIONS:
            raise ValueError(f"cannot write trace version {version!r}")
        self.version = version
        self.path = Path(path)
        self._header = dict(header or {})
        self._level = (1 if version == 2 else 6) if level is None else level
        self._deflate = Deflater(self._level)  # versions 3 and 4: one stream, restarted at each keyframe
        self._metrics = MetricsCodec(METRIC_FIELDS, INT_METRICS)  # version 4: restarted with the stream
        self._idle: list | None = None  # versions 3 and 4: the idle run not yet written: [step, steps, metrics, requests]
        self._file = self.path.open("wb")
        self._wrote_header = False
        self._arrived: list[dict] = []  # requests submitted in the step being recorded (add_requests)
        if scalars is not None:
            self.start(scalars)

    def _default_keyframe_every(self, num_slots: int, num_blocks: int) -> int:
        if self.version >= 3:
            return v3_keyframe_every(num_slots, num_blocks)
        return default_keyframe_every(num_slots, num_blocks, TRACE_KEYFRAME_BYTES_PER_STEP)

    def set_header(self, header: dict) -> None:
        if self._wrote_header:
            raise ValueError("the trace header is already written")
        self._header.update(header)

    def add_requests(self, requests: list[dict]) -> None:
        """Requests submitted in the step being recorded (header-style entries): written with
        that step's delta line, for runs whose requests are not known up front."""
        self._arrived.extend(requests)

    @property
    def wants_before(self) -> bool:
        return self.version >= 3

    def _pack(self, record: bytes, fields=STEP_FIELDS, before: dict | None = None) -> str:
        if self.version == 2:
            return base64.b64encode(zlib.compress(record, self._level)).decode("ascii")
        return base64.b64encode(self._deflate.piece(pack_file_record(fields, record, before))).decode("ascii")

    def _line(self, obj: dict) -> None:
        """A record that is JSON: a line, or in version 4 a JSON frame."""
        text = json.dumps(obj, separators=(",", ":")).encode("utf-8")
        self._file.write(frame(KIND_JSON, text) if self.version >= 4 else text + b"\n")

    def _write_header(self) -> None:
        if self._wrote_header:
            return
        if self.scalars is None:
            raise ValueError("the trace has no pool sizes: start() it or add a step first")
        self._file.write(json.dumps({
            **self._header,
            "type": "header",
            "format": TRACE_FORMAT,
            "version": self.version,
            "pool": self.scalars,
            "metric_fields": list(METRIC_FIELDS),
            "keyframe_every": self.keyframe_every,
            "encoding": ENCODINGS[self.version],
            "record_fields": RECORD_FIELDS,
        }, separators=(",", ":")).encode("utf-8") + b"\n")  # the first line is JSON text in every version
        self._wrote_header = True

    def _keep(self, i: int, record: bytes, metrics: StepMetrics) -> None:
        self._write_header()
        self._write_idle()
        step = self.first_step + i
        if self.version >= 4:
            self._keep_v4(i, step, record, metrics)
            return
        line = {"type": "delta", "step": step, "metrics": [getattr(metrics, n) for n in METRIC_FIELDS],
                "data": self._pack(record, before=self._before)}
        if self._arrived:
            line["requests"], self._arrived = self._arrived, []
        self._line(line)
        if i % self.keyframe_every == 0:
            self._deflate.restart()  # a reader may start at a keyframe line
            self._line({"type": "keyframe", "step": step, "data": self._pack(self._head.keyframe(), KEYFRAME_FIELDS)})

    def _keep_v4(self, i: int, step: int, record: bytes, metrics: StepMetrics) -> None:
        self._write_arrived()
        piece = self._deflate.piece(self._metrics.encode(metrics) + pack_file_record(STEP_FIELDS, record, self._before))
        self._file.write(frame(KIND_DELTA, STEP.pack(step) + piece))
        if i % self.keyframe_every == 0:
            self._deflate.restart()  # a reader may start at a keyframe frame
            self._metrics.restart()
            piece = self._deflate.piece(pack_file_record(KEYFRAME_FIELDS, self._head.keyframe()))
            self._file.write(frame(KIND_KEYFRAME, STEP.pack(step) + piece))

    def _write_arrived(self) -> None:
        """Version 4 on: the requests submitted in the step about to be written, as a JSON frame."""
        if self._arrived:
            self._line({"type": "requests", "requests": self._arrived})
            self._arrived = []

    def record_decode_run(self, first_step: int, writes) -> None:
        """A decode run (see :meth:`Recorder.record_decode_run`). Version 5 writes it as one run
        frame and moves its state to the run's last step at once; earlier versions, a frame or
        line a step."""
        if self.version < 5:
            super().record_decode_run(first_step, writes)
            return
        block_size, metrics = self._check_run(first_step, writes), self._last[1]
        self._write_header()
        self._write_idle()
        self._write_arrived()
        piece = self._deflate.piece(pack_run(writes))  # in the stream; the metrics' differences go on from the step before
        self._file.write(frame(KIND_RUN, STEP.pack(first_step) + piece))
        delta = end_delta(self._head, first_step, writes, metrics, block_size)
        record = self._head.encode(delta)  # no keyframe inside a run: a reader may start at the next one
        self.num_steps += writes.steps
        self._last, self._in_run = (record, delta.metrics), False

    def _keep_idle(self, i: int, count: int, record: bytes, metrics: StepMetrics, extend: bool) -> None:
        if self.version == 2:  # a line a step, as version 2 always had
            for j in range(count):
                head = record if j == 0 else repeat_record(record, self.first_step + i + j)
                self._write_header()
                self._v2_idle_line(i + j, head, metrics)
            return
        if extend and self._idle is not None:
            self._idle[1] += count
        else:
            self._write_header()
            self._write_idle()
            self._idle = [self.first_step + i, count, metrics, []]
        self._idle[3].extend(self._arrived)  # requests submitted in the run's steps
        self._arrived = []

    def _v2_idle_line(self, i: int, record: bytes, metrics: StepMetrics) -> None:
        step = self.first_step + i
        line = {"type": "delta", "step": step, "metrics": [getattr(metrics, n) for n in METRIC_FIELDS],
                "data": self._pack(record)}
        if self._arrived:
            line["requests"], self._arrived = self._arrived, []
        self._line(line)
        if i % self.keyframe_every == 0:
            state = self._head.copy()
            state.idle_to(step)
            self._line({"type": "keyframe", "step": step, "data": self._pack(state.keyframe())})

    def _write_idle(self) -> None:
        """The pending idle run as one line: ``steps`` steps from ``step``, each repeating the step
        before it, with these metrics."""
        if self._idle is None:
            return
        step, count, metrics, arrived = self._idle
        self._idle = None
        line = {"type": "idle", "step": step, "steps": count, "metrics": [getattr(metrics, n) for n in METRIC_FIELDS]}
        if arrived:
            line["requests"] = arrived
        self._line(line)

    def flush(self) -> None:
        """Push what is written so far to the file (a reader may follow a live run)."""
        self._write_idle()
        self._file.flush()

    def close(self, footer: dict | None = None) -> Path:
        """Finish the file with an end line (``footer`` keys override the header's on reading)."""
        if self._file.closed:
            return self.path
        try:
            if self.scalars is not None:
                self._write_header()
                self._write_idle()
                self._line({**(footer or {}), "type": "end", "steps": self.num_steps})
        finally:
            self._file.close()
        return self.path

    def abandon(self) -> None:
        """Close the file without its end line: what was written loads as a truncated trace."""
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trace(path, snapshots, header: dict | None = None, version: int = TRACE_VERSION) -> Path:
    """Write ``header`` (JSON-native dict: config, requests, ...) and full snapshots.
    ``version=1`` writes the old one-snapshot-per-line format (for compatibility checks)."""
    if version == 1:
        path = Path(path)
        with path.open("w", encoding="utf-8") as f:
            f.write(json.dumps({"type": "header", "format": TRACE_FORMAT, "version": 1, **(header or {})}, separators=(",", ":")) + "\n")
            for snap in snapshots:
                f.write(json.dumps({"type": "step", **snap.to_json()}, separators=(",", ":")) + "\n")
        return path
    if version not in WRITABLE_VERSIONS:
        raise ValueError(f"cannot write trace version {version!r}")
    with TraceWriter(path, header, version=version) as writer:
        for snap in snapshots:
            writer.append(snap)
    return writer.path


def write_recording(path, recording: Recording, header: dict | None = None, footer: dict | None = None,
                    version: int = TRACE_VERSION) -> Path:
    """Write a whole Recording as a trace (its records as they are)."""
    writer = TraceWriter(path, header, version=version)
    try:
        recording.replay_into(writer)
    finally:
        writer.close(footer)
    return writer.path


# ---------------------------------------------------------------------------- reading
def read_trace(path) -> tuple[dict, list[StepSnapshot]]:
    """(header without the bookkeeping keys, every step's snapshot). Holds every step in full:
    for long or large traces use :func:`load_recording`. Raises TraceError."""
    header, recording = load_recording(path)
    return header, [recording.at(step) for step in recording.steps]


def _open(path):
    """``path`` opened for binary reading, a regular file under :data:`MAX_TRACE_BYTES` (never a
    FIFO); TraceError (one line) otherwise."""
    try:
        return open_capped(path, MAX_TRACE_BYTES, "trace")
    except ConfigError as exc:
        raise TraceError(str(exc)) from None


def trace_records(path) -> list[dict]:
    """The file's records as objects, in order, without decoding any step: the header, then each
    line (versions 1-3) or frame (versions 4-5). A step, keyframe or run frame is
    ``{"type": "delta", "keyframe" or "run", "step": S, "bytes": N}`` (N: its deflated piece); its JSON
    frames are the objects they hold. For looking into a file (tests, tools); :func:`load_recording`
    is what reads one. Raises TraceError."""
    out = []
    with _open(path) as f:
        lines = _lines(Path(path), f)
        first = next(lines, None)
        if first is None:
            return out
        out.append(_parse(Path(path), first[0], first[1]))
        if isinstance(out[0], dict) and out[0].get("version") in (4, 5):
            try:
                for number, _, kind, payload in read_frames(f, MAX_LINE_BYTES):
                    if kind == KIND_JSON:
                        out.append(_parse(Path(path), f"frame {number}", payload.decode("utf-8", "replace")))
                    else:
                        out.append({"type": _FRAME_TYPES[kind],
                                    "step": STEP.unpack_from(payload)[0] if len(payload) >= V4_STEP_BYTES else None,
                                    "bytes": len(payload) - V4_STEP_BYTES})
            except ValueError as exc:
                raise TraceError(f"{path}: {exc}") from None
        else:
            out.extend(_parse(Path(path), number, text) for number, text, _ in lines)
    return out


def metric_rows(path):
    """(metric_fields, steps, values) for each step line or frame and each idle run of a version 2-5
    trace, in order, without decoding any record (versions 4-5: only each piece's metrics; a
    run frame's steps, a row each, from the step before's), for a reader that needs only the
    metrics (``bench replay-speed``). ``steps``: how many steps the row stands for (an idle run's
    length, else 1). Raises TraceError."""
    with _open(path) as f:
        lines = _lines(Path(path), f)
        first = next(lines, None)
        header = _parse(Path(path), first[0], first[1]) if first is not None else None
        if not isinstance(header, dict) or header.get("version") not in (2, 3, 4, 5) or "metric_fields" not in header:
            raise TraceError(f"{path}: not a version 2-5 pagedkv trace")
        names = header["metric_fields"]
        if header["version"] < 4:
            for number, text, _ in lines:
                obj = _parse(Path(path), number, text)
                if isinstance(obj, dict) and obj.get("type") in ("delta", "idle"):
                    yield names, obj.get("steps", 1), obj.get("metrics")
            return
        inflate, codec = Inflater(), MetricsCodec(names, INT_METRICS)
        inflate.restart()
        last = None  # the last step's metric values
        try:
            for number, _, kind, payload in read_frames(f, MAX_LINE_BYTES):
                if kind == KIND_JSON:
                    obj = _parse(Path(path), f"frame {number}", payload.decode("utf-8"))
                    if isinstance(obj, dict) and obj.get("type") == "idle":
                        last = obj.get("metrics")
                        yield names, obj.get("steps"), last
                elif kind == KIND_KEYFRAME:
                    inflate.restart()
                    codec.restart()
                    inflate.piece(payload[V4_STEP_BYTES:], MAX_RECORD_BYTES)
                elif kind == KIND_RUN:
                    run = unpack_run(inflate.piece(payload[V4_STEP_BYTES:], MAX_RECORD_BYTES))
                    if last is None:
                        raise ValueError(f"frame {number}: a decode run comes before the first step")
                    before, n = _metrics(names, last), len(run.seq_ids)
                    for j in range(1, run.steps + 1):
                        last = [getattr(before.after_decodes(j, n), name) for name in names]
                        yield names, 1, last
                else:
                    last = codec.decode(inflate.piece(payload[V4_STEP_BYTES:], MAX_RECORD_BYTES))
                    yield names, 1, last
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: {exc}") from None


def load_recording(path) -> tuple[dict, Recording]:
    """(header without the bookkeeping keys, the run as a Recording), streamed from a trace of
    any readable version. Raises TraceError (one line)."""
    return _Loader(Path(path)).load()


def _lines(path: Path, f):
    """(line number, text, ends with a newline) of the non-blank lines of the open file ``f``,
    refusing oversized lines. After the first line ``f`` stands just past it (version 4's frames
    start there)."""
    number = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"{path}:{number}: line is longer than {MAX_LINE_BYTES:,} bytes")
        if raw.strip():
            try:
                yield number, raw.decode("utf-8"), raw.endswith(b"\n")
            except UnicodeDecodeError:
                raise TraceError(f"{path}:{number}: not UTF-8 text") from None


def _parse(path: Path, number: int, text: str):
    try:
        return loads_strict(text)
    except RecursionError:
        raise TraceError(f"{path}:{number}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise TraceError(f"{path}:{number}: not JSON ({exc})") from None


def check_pool(pool) -> dict:
    """The pool sizes of a trace, checked. ValueError (one line) otherwise."""
    from ..kv.registry import ALLOCATORS

    if not isinstance(pool, dict):
        raise ValueError("pool sizes must be an object")
    missing = [k for k in POOL_SCALARS if k not in pool]
    if missing:
        raise ValueError(f"pool sizes lack {', '.join(missing)}")
    if not isinstance(pool["allocator"], str) or pool["allocator"] not in ALLOCATORS:
        raise ValueError(f"unknown allocator {pool['allocator']!r}")
    bounds = {"block_size": (1, MAX_BLOCK_SIZE), "num_slots": (1, MAX_POOL_SLOTS),
              "num_blocks": (0, MAX_POOL_SLOTS), "num_host_blocks": (0, MAX_SWAP_SLOTS)}
    for name, (lo, hi) in bounds.items():
        value = pool[name]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi:,}], got {value!r}")
    if pool["num_blocks"] > pool["num_slots"]:
        raise ValueError(f"num_blocks {pool['num_blocks']} exceeds num_slots {pool['num_slots']}")
    return {name: pool[name] for name in POOL_SCALARS}


def _check_user_header(header: dict) -> None:
    if "config" in header and not isinstance(header["config"], dict):
        raise ValueError("header config must be an object")
    requests = header.get("requests", [])
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        raise ValueError("header requests must be a list of objects")


def _metrics(names: list, values) -> StepMetrics:
    if not isinstance(values, list) or len(values) != len(names):
        raise ValueError(f"metrics must be a list of {len(names)} numbers")
    out = StepMetrics()
    for name, value in zip(names, values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"metric {name} must be a number, got {value!r}")
        if name in INT_METRICS:
            if not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
                raise ValueError(f"metric {name} must be an integer, got {value!r}")
        else:
            value = float(value)
        setattr(out, name, value)
    return out


class _Loader:
    """Reads one trace into a Recording, one line at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.recording = Recording()
        self.header: dict = {}
        self.version = 0
        self.metric_fields: list = []
        self.pending = None  # the first delta, until its keyframe arrives
        self.ended = False
        self.inflate = Inflater()  # versions 3 and 4: the records' stream
        self.metrics_codec = None  # version 4: the metrics in that stream

    def fail(self, number: int | str, message: str):
        raise TraceError(f"{self.path}:{number}: {message}") from None

    def load(self) -> tuple[dict, Recording]:
        try:
            with _open(self.path) as f:
                lines = _lines(self.path, f)
                first = next(lines, None)
                if first is None:
                    raise TraceError(f"{self.path} is empty, not a pagedkv trace")
                self._header(*first[:2])
                if self.version >= 4:
                    self._load_frames(f)
                else:
                    self._load_lines(lines)
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path}: {exc.strerror or exc}") from None
        if self.pending is not None:
            raise TraceError(f"{self.path}: the first step has no keyframe")
        if self.version >= 2 and not self.ended:
            self.header["truncated"] = True  # no end record: the run stopped before close()
        return self.header, self.recording

    def _load_lines(self, lines) -> None:
        for number, text, whole in lines:
            try:
                obj = _parse(self.path, number, text)
            except TraceError:
                if whole:
                    raise
                break  # the last line of a run that stopped mid-write: keep what came before
            if self.ended:
                self.fail(number, "data after the end record")
            try:
                if self.version == 1:
                    self._v1_step(number, obj)
                else:
                    self._v2_line(number, obj)
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError) as exc:
                if isinstance(exc, TraceError):
                    raise
                self.fail(number, str(exc).split("\n")[0] or type(exc).__name__)
            except RecursionError:
                self.fail(number, "nested too deeply")

    def _load_frames(self, f) -> None:
        """Versions 4 and 5: the frames after the header line (a frame cut short ends the trace, as a
        cut line does)."""
        frames = read_frames(f, MAX_LINE_BYTES)
        while True:
            try:
                item = next(frames, None)
            except ValueError as exc:
                raise TraceError(f"{self.path}: {exc}") from None
            if item is None:
                return
            number, offset, kind, payload = item
            where = f"frame {number} (byte {offset:,})"
            if self.ended:
                self.fail(where, "data after the end record")
            try:
                if kind == KIND_JSON:
                    obj = _parse(self.path, where, payload.decode("utf-8"))
                    if not isinstance(obj, dict) or obj.get("type") not in ("idle", "end", "requests"):
                        self.fail(where, "a JSON frame must be an idle, end or requests record")
                    self._v2_line(where, obj)
                    continue
                if len(payload) < V4_STEP_BYTES:
                    self.fail(where, f"a step frame of {len(payload)} bytes has no step number")
                step = STEP.unpack_from(payload)[0]
                piece = payload[V4_STEP_BYTES:]
                if kind == KIND_KEYFRAME:
                    self.inflate.restart()
                    self.metrics_codec.restart()
                    raw = unpack_file_record(KEYFRAME_FIELDS, self.inflate.piece(piece, MAX_RECORD_BYTES))
                    self._keyframe(where, step, raw)
                elif kind == KIND_RUN:
                    self._run(where, step, unpack_run(self.inflate.piece(piece, MAX_RECORD_BYTES)))
                else:
                    raw = self.inflate.piece(piece, MAX_RECORD_BYTES)
                    codec = self.metrics_codec
                    metrics = _metrics(self.metric_fields, codec.decode(raw))
                    state = self.recording.head_state if self.recording.num_steps else None
                    self._delta(where, step, unpack_file_record(STEP_FIELDS, raw[codec.size:], state), metrics)
            except UnicodeDecodeError:
                self.fail(where, "a JSON frame is not UTF-8 text")
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError) as exc:
                if isinstance(exc, TraceError):
                    raise
                self.fail(where, str(exc).split("\n")[0] or type(exc).__name__)
            except RecursionError:
                self.fail(where, "nested too deeply")

    def _header(self, number: int, text: str) -> None:
        obj = _parse(self.path, number, text)
        if not isinstance(obj, dict) or obj.get("type") != "header" or obj.get("format") != TRACE_FORMAT:
            self.fail(number, "not a pagedkv trace header")
        version = obj.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            self.fail(number, f"unsupported trace version {version!r}")
        self.version = version
        self.header = {k: v for k, v in obj.items() if k not in _BOOKKEEPING}
        try:
            _check_user_header(self.header)
            if version >= 2:
                if obj.get("encoding") != ENCODINGS[version]:
                    raise ValueError(f"unknown encoding {obj.get('encoding')!r}")
                if obj.get("record_fields") != RECORD_FIELDS:
                    raise ValueError("the trace's record layout is not this version's (its array types or fields differ)")
                names = obj.get("metric_fields")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError("metric_fields must be a list of names")
                unknown = sorted(set(names) - set(METRIC_FIELDS))
                if unknown or len(set(names)) != len(names):
                    raise ValueError(f"unknown or repeated metric field(s): {', '.join(unknown) or 'repeated'}")
                self.metric_fields = names
                self.metrics_codec = MetricsCodec(names, INT_METRICS)
                self.recording.start(check_pool(obj.get("pool")))
                self.inflate.restart()
        except ValueError as exc:
            self.fail(number, str(exc))

    # ------------------------------------------------------------------ version 1
    def _v1_step(self, number: int, obj) -> None:
        if not isinstance(obj, dict) or obj.get("type") != "step":
            self.fail(number, "expected a step record")
        snap = StepSnapshot.from_json({k: v for k, v in obj.items() if k != "type"})
        if self.recording.scalars is None:
            check_pool({name: getattr(snap, name) for name in POOL_SCALARS})
        check_states("slot_state", snap.slot_state)
        check_states("block_state", snap.block_state)
        self.recording.append(snap)

    # ------------------------------------------------------------------ version 2
    def _data(self, obj: dict, fields=STEP_FIELDS, state: StepState | None = None) -> bytes:
        data = obj.get("data")
        if not isinstance(data, str):
            raise ValueError("record data must be a string")
        try:
            packed = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("record data is not base64") from None
        if self.version == 3:
            return unpack_file_record(fields, self.inflate.piece(packed, MAX_RECORD_BYTES), state)
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(packed, MAX_RECORD_BYTES)
        except zlib.error:
            raise ValueError("record data is not zlib") from None
        if inflate.unconsumed_tail:
            raise ValueError(f"record is larger than {MAX_RECORD_BYTES:,} bytes")
        if not inflate.eof:
            raise ValueError("record data is truncated")
        return raw

    def _v2_line(self, number: int, obj) -> None:
        if not isinstance(obj, dict):
            self.fail(number, "expected a record object")
        kind = obj.get("type")
        rec = self.recording
        step = obj.get("step")
        if kind in ("delta", "keyframe", "idle") and (isinstance(step, bool) or not isinstance(step, int)):
            self.fail(number, "record step must be an integer")
        if kind in ("delta", "idle") or (kind == "requests" and self.version >= 4):
            arrived = obj.get("requests")
            if arrived is not None:
                if not isinstance(arrived, list) or not all(isinstance(r, dict) for r in arrived):
                    raise ValueError("a step's requests must be a list of objects")
                self.header.setdefault("requests", []).extend(arrived)
        if kind == "requests" and self.version >= 4:
            pass  # its requests are added above
        elif kind == "idle" and self.version >= 3:
            metrics = _metrics(self.metric_fields, obj.get("metrics"))
            if self.pending is not None or not rec.num_steps:
                self.fail(number, "an idle run comes before the first step's keyframe")
            if step != rec.last_step + 1:
                self.fail(number, f"step {step} does not follow step {rec.last_step}")
            rec.append_idle(obj.get("steps"), metrics)
        elif kind == "delta" and self.version < 4:
            record = self._data(obj, state=rec.head_state if rec.num_steps else None)
            self._delta(number, step, record, _metrics(self.metric_fields, obj.get("metrics")))
        elif kind == "keyframe" and self.version < 4:
            self.inflate.restart()
            self._keyframe(number, step, self._data(obj, KEYFRAME_FIELDS))
        elif kind == "end":
            steps = obj.get("steps")
            if steps != rec.num_steps:
                self.fail(number, f"end record counts {steps!r} steps, the trace has {rec.num_steps}")
            footer = {k: v for k, v in obj.items() if k not in ("type", "steps")}
            merged = {**self.header, **footer}
            _check_user_header(merged)
            self.header = merged
            self.ended = True
        else:
            self.fail(number, f"unknown record type {kind!r}")

    def _delta(self, number, step: int, record: bytes, metrics: StepMetrics) -> None:
        rec = self.recording
        if self.pending is not None:
            self.fail(number, "the first step is not followed by its keyframe")
        if rec.num_steps and step != rec.last_step + 1:
            self.fail(number, f"step {step} does not follow step {rec.last_step}")
        if rec.num_steps == 0:
            self.pending = (step, record, metrics)
        else:
            rec.append_record(record, metrics)

    def _run(self, number, step: int, writes) -> None:
        """Version 5: a decode run's frame, its steps rebuilt one by one from the step before."""
        rec = self.recording
        if self.version < 5:
            self.fail(number, f"a decode run frame in a version-{self.version} trace")
        if self.pending is not None or not rec.num_steps:
            self.fail(number, "a decode run comes before the first step's keyframe")
        rec.record_decode_run(step, writes)  # a step that does not follow, or a run it cannot take: one line

    def _keyframe(self, number, step: int, record: bytes) -> None:
        rec = self.recording
        state = StepState.from_keyframe(record, rec.scalars["num_slots"], rec.scalars["num_blocks"])
        if state.step != step:
            self.fail(number, f"keyframe says step {step}, its record step {state.step}")
        if self.pending is not None:
            first, pending, metrics = self.pending
            if first != step:
                self.fail(number, f"the first step is {first}, its keyframe is for step {step}")
            self.pending = None
            rec.append_record(pending, metrics, state=state)
        elif not rec.num_steps or step != rec.last_step:
            self.fail(number, f"keyframe for step {step} does not follow that step's delta")
        elif not rec.holds(state):
            self.fail(number, f"keyframe of step {step} disagrees with the deltas before it")
