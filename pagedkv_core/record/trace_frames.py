"""Trace version 4's framing: the header's JSON line, then binary frames instead of text lines.

Version 3 wrote each step as a JSON line: the step's metrics as a JSON list (about 155 bytes a
step) and its record as base64 text (4/3 of the deflated bytes). Version 4 keeps version 3's
records and its one deflate stream (:mod:`~pagedkv_core.record.stream_codec`), and drops both
costs: the metrics go into the deflated stream as binary, and nothing is base64. After the header
line (still JSON text, so ``head -1 trace`` reads it) the file is a sequence of frames::

    kind (1 byte)  length (4 bytes, little-endian)  payload (length bytes)

- ``D``, a step: its step number (8 bytes, little-endian) and one piece of the deflate stream,
  which holds the step's metrics (:class:`MetricsCodec`) followed by its file record;
- ``K``, a keyframe: its step number and the first piece of a restarted stream (as version 3's
  keyframe line; the metrics' differences restart with it, so a reader can start there);
- ``J``, anything rare, as the JSON object version 3 wrote on a line: an idle run, the end record,
  and the requests submitted in the next step (``{"type": "requests", "requests": [...]}``, which
  version 3 carried on the step's line);
- ``R`` (version 5), a decode run: its first step number and one piece of the deflate stream,
  which holds what the run wrote (:func:`~pagedkv_core.record.decode_run.pack_run`: the
  sequences, each one's first slot, their tokens step by step). Its steps' metrics follow from
  the step before's (:meth:`~pagedkv_core.metrics.StepMetrics.after_decodes`) and take no bytes;
  the metrics' differences go on from that step's. Version 5 is version 4 with this frame.

A file cut short in its last frame still loads up to the frame before, as a cut text line did.
Measured on the first 2,000 requests of the Azure conversation log at 262,144 slots (paged, 9,870
steps): 2,119 bytes a step in version 3, of which 1,893 bytes of base64 and 155 of JSON metrics;
the deflated metrics take about 35 bytes a step.
"""
from __future__ import annotations

import math
import struct

KIND_DELTA, KIND_KEYFRAME, KIND_JSON, KIND_RUN = b"D", b"K", b"J", b"R"
KINDS = (KIND_DELTA, KIND_KEYFRAME, KIND_JSON, KIND_RUN)
FRAME_HEAD = struct.Struct("<cI")
STEP = struct.Struct("<q")
_MASK = (1 << 64) - 1


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame's bytes."""
    return FRAME_HEAD.pack(kind, len(payload)) + payload


def read_frames(f, max_payload: int):
    """(frame number from 1, byte offset, kind, payload) of each whole frame from ``f``'s position;
    stops at the end of the file or at a frame cut short (the last one of a run that stopped
    mid-write). ValueError (one line) for an unknown kind or a payload over ``max_payload``."""
    number, offset = 0, f.tell()
    while True:
        head = f.read(FRAME_HEAD.size)
        if len(head) < FRAME_HEAD.size:
            return
        kind, length = FRAME_HEAD.unpack(head)
        number += 1
        if kind not in KINDS:
            raise ValueError(f"frame {number} (byte {offset:,}): unknown frame kind {kind!r}")
        if length > max_payload:
            raise ValueError(f"frame {number} (byte {offset:,}): {length:,} bytes, over the {max_payload:,}-byte limit")
        payload = f.read(length)
        if len(payload) < length:
            return
        yield number, offset, kind, payload
        offset += FRAME_HEAD.size + length


def split_frames(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(header line, [(kind, payload), ...]) of a whole version-4 trace in memory (for tools and
    tests that look into or edit a file; :func:`read_frames` is what the loader streams)."""
    at = data.index(b"\n") + 1
    head, out = data[:at], []
    while at + FRAME_HEAD.size <= len(data):
        kind, length = FRAME_HEAD.unpack_from(data, at)
        out.append((kind, data[at + FRAME_HEAD.size : at + FRAME_HEAD.size + length]))
        at += FRAME_HEAD.size + length
    return head, out


def join_frames(head: bytes, frames) -> bytes:
    """The bytes of a header line and (kind, payload) frames: :func:`split_frames` reversed."""
    return head + b"".join(frame(kind, payload) for kind, payload in frames)


class MetricsCodec:
    """A step's metrics as binary, ``metric_fields`` order, 8 bytes each: an integer metric as its
    difference from the previous step's in the same stream (modulo 2**64; most are 0 or small, and
    deflate to almost nothing), a float as IEEE 754 double. :meth:`restart` with the stream."""

    def __init__(self, names, int_names):
        self.names = list(names)
        ints = set(int_names)
        self.is_int = [n in ints for n in self.names]
        self.size = 8 * len(self.names)
        self._struct = struct.Struct("<" + "".join("Q" if i else "d" for i in self.is_int))
        self.restart()

    def restart(self) -> None:
        self._last = [0] * len(self.names)

    def encode(self, metrics) -> bytes:
        values = [getattr(metrics, n) for n in self.names]
        out = []
        for i, (v, is_int) in enumerate(zip(values, self.is_int)):
            if is_int:
                out.append((int(v) - self._last[i]) & _MASK)
                self._last[i] = int(v)
            else:
                out.append(float(v))
        return self._struct.pack(*out)

    def decode(self, raw: bytes) -> list:
        """The metrics' values, in ``names`` order (what a version-3 line listed). ValueError
        (one line) for a short record or a float that is not finite."""
        if len(raw) < self.size:
            raise ValueError(f"step record of {len(raw)} bytes is shorter than its {self.size} bytes of metrics")
        values = list(self._struct.unpack_from(raw))
        for i, is_int in enumerate(self.is_int):
            if is_int:
                v = (self._last[i] + values[i]) & _MASK
                values[i] = self._last[i] = v - (1 << 64) if v >> 63 else v
            elif not math.isfinite(values[i]):
                raise ValueError(f"metric {self.names[i]} is {values[i]}, not a finite number")
        return values
