"""A step record's file form (trace version 3): narrowed, delta-coded, byte-shuffled, deflated
as one stream.

A step record (:mod:`pagedkv_core.record.step_codec`) is fast to apply but wide: every value
takes its field's full width (4 bytes for a slot index, a token, an owner). On disk a record is
rewritten field by field, with nothing it cannot give back:

- the pool's values (slot state, owner and token, block state, references, fill and hash) become
  their differences from the same entry's value the step before, modulo 2**width, when the writer
  and the reader both hold that step (every record but a trace's first): an entry that changed
  one field stores zeros in the others (a freed slot keeps its token: its token costs nothing);
- fields that are sorted positions or ids (slot and block indices, owners, sequence ids and
  row positions) become their differences from the value before them, modulo 2**width (a run of
  slots is a run of 1s, an owner's slots a run of 0s);
- each field then takes the narrowest of 1, 2, 4 or 8 bytes that holds every value (one width
  byte a field says which);
- its bytes are shuffled into planes (all low bytes, then the next...), so that the constant
  high bytes of small numbers become long runs;
- and the records of a trace are deflated as one raw-deflate stream (one sync flush a line),
  restarted at every keyframe line, so that a reader can start at any keyframe and a file cut
  short still decodes up to its last whole line.

:func:`pack_file_record` and :func:`unpack_file_record` turn a record into this form and back
(byte for byte); :class:`Deflater` and :class:`Inflater` carry the stream.
"""
from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np

DIFF_FIELDS = ("slot_state", "slot_owner", "slot_token", "block_state", "block_ref", "block_fill", "block_hash",
               "seq_request", "seq_sample", "seq_status", "seq_num_tokens", "seq_num_computed", "seq_num_blocks",
               "seq_reserved_start")
DELTA_FIELDS = frozenset({"slot_idx", "block_idx", "slot_owner", "seq_id", "row_pos", "seq_request", "tab_pos"})
_WIDTHS = (1, 2, 4, 8)
_SIGNED = {1: np.dtype("<i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4"), 8: np.dtype("<i8")}
_UNSIGNED = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_LIMITS = {w: (np.iinfo(_SIGNED[w]).min, np.iinfo(_SIGNED[w]).max) for w in _WIDTHS}
WBITS = -15  # raw deflate: no per-line header or checksum
MAX_FILE_RECORD_BYTES = 1 << 30


def _header_bytes(n: int) -> int:
    return (4 * n + 7) // 8 * 8


def _narrow(a: np.ndarray) -> tuple[int, np.ndarray]:
    """(width, values as the narrowest signed integers that hold them); any other dtype as it is."""
    if a.dtype.kind not in "iu" or not len(a):
        return a.dtype.itemsize, a
    lo, hi = int(a.min()), int(a.max())
    for w in _WIDTHS:
        if w >= a.dtype.itemsize:
            break
        if _LIMITS[w][0] <= lo and hi <= _LIMITS[w][1]:
            return w, a.astype(_SIGNED[w])
    return a.dtype.itemsize, a


def _shuffle(a: np.ndarray) -> bytes:
    w = a.dtype.itemsize
    raw = np.ascontiguousarray(a).view(np.uint8)
    return raw.tobytes() if w == 1 else raw.reshape(-1, w).T.tobytes()


def _unshuffle(raw: np.ndarray, w: int) -> np.ndarray:
    return raw if w == 1 else np.ascontiguousarray(raw.reshape(w, -1).T).reshape(-1)


def _modular(a: np.ndarray, b: np.ndarray, sign: int) -> np.ndarray:
    """a + sign * b, modulo 2**width, in a's dtype."""
    u = _UNSIGNED[a.dtype.itemsize]
    out = a.view(u) + b.astype(a.dtype, copy=False).view(u) if sign > 0 else a.view(u) - b.astype(a.dtype, copy=False).view(u)
    return out.view(a.dtype)


# A record of at most this many values is packed with one pass of numpy over all its fields
# together (a step's record: a few values in each of about 20 fields, where per-field calls
# would cost most); a bigger one (a keyframe) field by field, which needs no 8-byte copy of it.
ALL_AT_ONCE_VALUES = 1 << 14


class _Plan(NamedTuple):
    """Per field of a layout, in its order: what packing needs to know besides the values."""

    names: list[str]
    itemsize: np.ndarray  # int64
    half: np.ndarray  # int64: 2**(8 * itemsize - 1), 0 for 8-byte fields (int64 arithmetic wraps by itself)
    delta: np.ndarray  # bool: stored as differences from the value before
    diff: np.ndarray  # bool: stored as differences from the step before
    runs: list[tuple[int, int, np.dtype]]  # (first, end) field of each run of one width: contiguous in a record


_PLANS: dict[int, _Plan] = {}
_FITS = np.array([_LIMITS[w][1] for w in _WIDTHS[:-1]], dtype=np.int64)  # the largest magnitude 1, 2 and 4 bytes hold
_NEED = np.array([1, 2, 4, 8], dtype=np.int64)


def _plan(fields: dict[str, np.dtype]) -> _Plan:
    plan = _PLANS.get(id(fields))
    if plan is None:
        size = [d.itemsize for d in fields.values()]
        for (name, dtype), before in zip(fields.items(), [99, *size]):
            # unsigned fields wider than a byte would narrow differently; records are laid out widest first
            assert dtype.kind in "iu" and (dtype.kind == "i" or dtype.itemsize == 1) and dtype.itemsize <= before, name
        runs = []
        for i, w in enumerate(size):
            if runs and size[runs[-1][0]] == w:
                runs[-1] = (runs[-1][0], i + 1, _SIGNED[w])
            else:
                runs.append((i, i + 1, _SIGNED[w]))
        size = np.array(size, dtype=np.int64)
        plan = _PLANS[id(fields)] = _Plan(
            list(fields), size, np.where(size < 8, np.left_shift(1, 8 * size - 1, dtype=np.int64), 0),
            np.array([n in DELTA_FIELDS for n in fields]), np.array([n in DIFF_FIELDS for n in fields]), runs)
    return plan


def pack_file_record(fields: dict[str, np.dtype], record: bytes, before: dict | None = None) -> bytes:
    """The file form of ``record`` (laid out by ``fields``, see step_codec.pack): counts, one
    width byte a field, one flag byte (1: the pool values are differences), then each field's
    narrowed, shuffled bytes. ``before``: the pool values at the record's indices the step
    before (a step record's, see StepState.encode)."""
    plan = _plan(fields)
    head = _header_bytes(len(fields))
    lengths = np.frombuffer(record, dtype="<i4", count=len(fields)).astype(np.int64)
    if len(record) != head + int(lengths @ plan.itemsize) or lengths.min() < 0:
        raise ValueError("record lengths do not add up to its size")
    widths = np.zeros(len(fields) + 1, dtype=np.uint8)
    widths[:-1] = plan.itemsize  # an empty field keeps its own width
    widths[-1] = before is not None
    if lengths.sum() <= ALL_AT_ONCE_VALUES:
        body = _pack_all_at_once(plan, np.frombuffer(record, dtype=np.uint8, offset=head), lengths, before, widths)
    else:
        from .step_codec import unpack

        body = _pack_each(fields, unpack(fields, record), before, widths)
    return b"".join([record[:head], widths.tobytes(), body])


def _pack_each(fields, values, before, widths) -> bytes:
    """The fields' bytes, field by field (sets ``widths``)."""
    values = dict(values)
    if before is not None:
        for name in DIFF_FIELDS:
            values[name] = _modular(values[name], before[name], -1)
    parts = []
    for i, (name, dtype) in enumerate(fields.items()):
        a = values[name]
        if not len(a):  # most fields of most records
            continue
        if name in DELTA_FIELDS:
            u = a.view(_UNSIGNED[dtype.itemsize])
            a = np.diff(u, prepend=u.dtype.type(0)).view(dtype)  # modular: exact for any values
        w, a = _narrow(a)
        widths[i] = w
        parts.append(_shuffle(a))
    return b"".join(parts)


def _pack_all_at_once(plan: _Plan, body: np.ndarray, lengths: np.ndarray, before, widths) -> bytes:
    """The same bytes as :func:`_pack_each`, with every field's values laid end to end as int64
    (sets ``widths``): each value becomes its field's wrapped difference, each field is narrowed
    by its largest magnitude, and one index gathers the low bytes of each plane."""
    live = np.flatnonzero(lengths)
    if not len(live):
        return b""
    parts, at = [], 0
    for first, end, dtype in plan.runs:  # a run of fields of one width: one view
        size = int(lengths[first:end].sum()) * dtype.itemsize
        if size:
            parts.append(body[at : at + size].view(dtype))
            at += size
    v = np.concatenate(parts, dtype=np.int64) if len(parts) > 1 else parts[0].astype(np.int64)
    n = lengths[live]
    starts = np.cumsum(n) - n
    half = np.repeat(plan.half[live], n)
    wrap = 2 * half - 1  # all ones for 8-byte fields
    if before is not None:
        zero = np.zeros(int(n.max()), dtype=np.int64)
        v -= np.concatenate([before[plan.names[i]] if plan.diff[i] else zero[:k]
                             for i, k in zip(live.tolist(), n.tolist())], dtype=np.int64)
        v = ((v + half) & wrap) - half
    delta = np.repeat(plan.delta[live], n)
    if delta.any():
        prev = np.empty_like(v)
        prev[0] = 0
        prev[1:] = v[:-1]
        prev[starts] = 0
        v = ((v - prev * delta + half) & wrap) - half

    top = np.maximum(np.maximum.reduceat(v, starts), ~np.minimum.reduceat(v, starts))  # ~x = -x - 1
    w = np.minimum(_NEED[np.searchsorted(_FITS, top)], plan.itemsize[live])
    widths[live] = w

    # Plane p of field f: byte p of each of its values, in order.
    field = np.repeat(np.arange(len(live)), w)
    plane = np.arange(len(field)) - np.repeat(np.cumsum(w) - w, w)
    size = n[field]
    at = np.cumsum(size) - size
    index = np.repeat(8 * (starts[field] - at) + plane, size) + 8 * np.arange(int(size.sum()))
    return v.astype("<i8", copy=False).view(np.uint8)[index].tobytes()


def unpack_file_record(fields: dict[str, np.dtype], data: bytes, state=None) -> bytes:
    """The record ``pack_file_record`` made ``data`` from; ``state``: the StepState of the step
    before (needed when the record holds differences). ValueError (one line) when it is malformed."""
    from .step_codec import pack

    n = len(fields)
    head = _header_bytes(n)
    if len(data) < head + n + 1:
        raise ValueError(f"file record of {len(data)} bytes is shorter than its {head + n + 1}-byte header")
    raw = np.frombuffer(data, dtype=np.uint8)
    counts = raw[: 4 * n].view("<i4").astype(np.int64)
    widths = raw[head : head + n].tolist()
    diffed = int(raw[head + n])
    if counts.min() < 0:
        raise ValueError("file record has a negative field length")
    if diffed not in (0, 1):
        raise ValueError(f"file record flag {diffed} is neither 0 nor 1")
    at, out = head + n + 1, {}
    for (name, dtype), count, w in zip(fields.items(), counts.tolist(), widths):
        if w not in _WIDTHS or w > dtype.itemsize or (w != dtype.itemsize and dtype.kind not in "iu"):
            raise ValueError(f"file record field {name} has width {w}")
        end = at + count * w
        if end > len(data):
            raise ValueError("file record is shorter than its field lengths")
        a = _unshuffle(raw[at:end], w)
        a = a.view(_SIGNED[w] if w != dtype.itemsize else dtype).astype(dtype)
        if name in DELTA_FIELDS and count and dtype.kind in "iu":
            u = a.view(_UNSIGNED[dtype.itemsize])
            a = np.cumsum(u, dtype=u.dtype).view(dtype)
        out[name] = a
        at = end
    if at != len(data):
        raise ValueError(f"file record has {len(data) - at} bytes after its fields")
    if diffed:
        if state is None:
            raise ValueError("the trace's first record holds differences from a step it does not have")
        before = state.before(out)
        for name in DIFF_FIELDS:
            if len(out[name]) != len(before[name]):
                raise ValueError(f"{name} has {len(out[name])} values for {len(before[name])} entries")
            out[name] = _modular(out[name], before[name], +1)
    return pack(fields, out)


class Deflater:
    """One raw-deflate stream, a sync flush per piece (each line decodes once those before it did)."""

    def __init__(self, level: int = 6):
        self.level = level
        self._z = zlib.compressobj(level, zlib.DEFLATED, WBITS)

    def restart(self) -> None:
        self._z = zlib.compressobj(self.level, zlib.DEFLATED, WBITS)

    def piece(self, data: bytes) -> bytes:
        return self._z.compress(data) + self._z.flush(zlib.Z_SYNC_FLUSH)


class Inflater:
    """Reads what a :class:`Deflater` wrote, piece by piece. ValueError (one line) on bad input."""

    def __init__(self):
        self._z: zlib._Decompress | None = None

    def restart(self) -> None:
        self._z = zlib.decompressobj(WBITS)

    def piece(self, data: bytes, limit: int = MAX_FILE_RECORD_BYTES) -> bytes:
        if self._z is None:
            raise ValueError("record data comes before any stream start")
        try:
            out = self._z.decompress(data, limit)
        except zlib.error:
            raise ValueError("record data is not a deflate stream piece") from None
        if self._z.unconsumed_tail:
            raise ValueError(f"record is larger than {limit:,} bytes")
        if self._z.eof:
            raise ValueError("record data ends the deflate stream")
        return out
