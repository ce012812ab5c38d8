"""The full state of one recorded step, and the byte record that moves it on by one step.

A :class:`StepState` holds every array of a :class:`~pagedkv_core.record.snapshot.StepSnapshot` at
one step: the per-slot and per-block arrays of the pool, the per-sequence arrays and the
block tables. ``encode`` turns the next step's :class:`~pagedkv_core.record.recording.StepDelta`
into a **step record** (bytes) and moves the state on; ``apply`` does the same from a step
record. A recording keeps these records in memory and a version-2 trace writes the very same
bytes to disk, so there is one codec, not two.

A step record stores only what changed:

- slots and blocks: the indices whose values changed, and the new values there;
- sequences: the order of live sequence ids (stored whole: 4 bytes a sequence), then the rows
  of the other per-sequence arrays that changed, by position (a waiting sequence costs
  nothing more, a running one its few changed fields);
- block tables: for each sequence whose table changed, how many leading entries it kept
  and the new tail (a decode step that opens a block stores one entry, not the whole table);
- the queues: three lengths when the sequence order is running + waiting + swapped (what
  the engine produces), the queues whole otherwise;
- the step's events as compact JSON.

Layout of a record: ``len(fields)`` little-endian int32 counts (padded to 8 bytes), then each
field's values as little-endian bytes, in the order of :data:`STEP_FIELDS` (keyframes:
:data:`KEYFRAME_FIELDS`), widest first so that every field is aligned.
``apply(..., validate=True)`` checks everything a file could get wrong (lengths, index
ranges, state codes, table bookkeeping) and raises ``ValueError`` with one line; records
this process made itself are trusted and skip the checks.
"""
from __future__ import annotations

import json

import numpy as np

from ..events import Event
from ..safe_io import loads_strict
from .slot_state import SlotState
from .snapshot import BLOCK_ARRAYS, SEQ_ARRAYS, SLOT_ARRAYS, TABLE_ARRAYS

POOL_ARRAYS = {**SLOT_ARRAYS, **BLOCK_ARRAYS}
ROW_ARRAYS = {k: v for k, v in SEQ_ARRAYS.items() if k != "seq_id"}  # records: by position in seq_id; states: by id
SEQ_STATE_ARRAYS = {**SEQ_ARRAYS, **TABLE_ARRAYS}
NUM_SLOT_STATES = len(SlotState)

# Blank pool: what an allocator holds before its first step.
BLANK_FILL = {"slot_owner": -1, "slot_token": -1}

HEAD = "head"  # int32 [step, queue mode, len(running), len(waiting), len(swapped)]
QUEUES_DERIVED, QUEUES_STORED = 0, 1


def _le(dtype) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def _aligned(fields: dict[str, np.dtype]) -> dict[str, np.dtype]:
    """Widest fields first: after an 8-byte header every field starts on its own alignment
    (numpy reads unaligned arrays several times slower)."""
    return dict(sorted(fields.items(), key=lambda kv: -kv[1].itemsize))


STEP_FIELDS: dict[str, np.dtype] = _aligned({
    HEAD: _le(np.int32),
    "slot_idx": _le(np.int32),
    **{k: _le(v) for k, v in SLOT_ARRAYS.items()},
    "block_idx": _le(np.int32),
    **{k: _le(v) for k, v in BLOCK_ARRAYS.items()},
    "seq_id": _le(np.int32),
    "row_pos": _le(np.int32),
    **{k: _le(v) for k, v in ROW_ARRAYS.items()},
    "tab_pos": _le(np.int32),
    "tab_keep": _le(np.int32),
    "tab_len": _le(np.int32),
    "tab_tail": _le(np.int32),
    "queues": _le(np.int32),
    "events": np.dtype(np.uint8),
})
KEYFRAME_FIELDS: dict[str, np.dtype] = _aligned({
    HEAD: _le(np.int32),  # [step]
    **{k: _le(v) for k, v in POOL_ARRAYS.items()},
    **{k: _le(v) for k, v in SEQ_STATE_ARRAYS.items()},
})
_EMPTY_I32 = np.zeros(0, dtype=np.int32)


# ---------------------------------------------------------------------------- packing
def pack(fields: dict[str, np.dtype], values: dict[str, np.ndarray]) -> bytes:
    """Counts, then each field's little-endian bytes (missing fields are empty)."""
    arrays = [np.asarray(values.get(name, _EMPTY_I32), dtype=dtype) for name, dtype in fields.items()]
    counts = np.zeros(_header_bytes(fields) // 4, dtype="<i4")
    counts[: len(arrays)] = [len(a) for a in arrays]
    return b"".join([counts.tobytes(), *(a.tobytes() for a in arrays)])


def _header_bytes(fields: dict) -> int:
    return (4 * len(fields) + 7) // 8 * 8


def _layout(fields: dict[str, np.dtype]) -> list[tuple[str, np.dtype, int, np.ndarray]]:
    out = []
    for name, dtype in fields.items():
        empty = np.zeros(0, dtype=dtype)
        empty.flags.writeable = False
        out.append((name, dtype, dtype.itemsize, empty))
    return out


_LAYOUTS: dict[int, list] = {}


def unpack(fields: dict[str, np.dtype], buf: bytes) -> dict[str, np.ndarray]:
    """Read-only views into ``buf``, one per field. ValueError when the sizes do not add up."""
    layout = _LAYOUTS.get(id(fields))
    if layout is None:
        layout = _LAYOUTS[id(fields)] = _layout(fields)
    head = _header_bytes(fields)
    n = len(buf)
    if n < head:
        raise ValueError(f"record of {n} bytes is shorter than its {head}-byte header")
    raw = np.frombuffer(buf, dtype=np.uint8)
    counts = raw[: 4 * len(layout)].view("<i4").tolist()
    if min(counts) < 0:
        raise ValueError("record has a negative field length")
    out, at = {}, head
    for (name, dtype, itemsize, empty), count in zip(layout, counts):
        if count:
            end = at + count * itemsize
            if end > n:
                break
            out[name] = raw[at:end].view(dtype)  # a slice and a view: cheaper than np.frombuffer per field
            at = end
        else:
            out[name] = empty
    if at != n or len(out) != len(layout):
        total = head + sum(c * item for (_, _, item, _), c in zip(layout, counts))
        raise ValueError(f"record lengths add up to {total} bytes, the record has {n}")
    return out


# ---------------------------------------------------------------------------- ragged helpers
def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    if not len(lengths):
        return np.zeros(0, dtype=np.int64)
    first = int(lengths[0])
    if (lengths == first).all():  # equal lengths (whole blocks, say): one broadcast
        return (starts[:, None] + np.arange(first)).ravel()
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total)


def match_ids(prev: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each of ``ids`` its position in ``prev`` (ids unique in both), -1 when absent."""
    if len(prev) == len(ids) and np.array_equal(prev, ids):
        return np.arange(len(ids))
    if not len(prev):
        return np.full(len(ids), -1, dtype=np.int64)
    order = np.argsort(prev, kind="stable")
    ordered = prev[order]
    pos = np.minimum(np.searchsorted(ordered, ids), len(prev) - 1)
    return np.where(ordered[pos] == ids, order[pos], -1)


def _tuple(a: np.ndarray) -> tuple[int, ...]:
    return tuple(a.tolist())


def encode_events(events) -> bytes:
    if not events:
        return b""
    return json.dumps([e.to_json() for e in events], separators=(",", ":")).encode("utf-8")


def decode_events(raw: np.ndarray | bytes) -> tuple[Event, ...]:
    """Events of a step record. ValueError (one line) on anything malformed."""
    raw = bytes(raw)
    if not raw:
        return ()
    try:
        data = loads_strict(raw.decode("utf-8"))
        if not isinstance(data, list):
            raise ValueError("events must be a list")
        return tuple(Event.from_json(e) for e in data)
    except RecursionError:
        raise ValueError("events are nested too deeply") from None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed events ({type(exc).__name__}: {str(exc)[:80]})") from None


# ---------------------------------------------------------------------------- the state
NEVER = -(1 << 62)  # "last live at step": an id never seen
MAX_SEQ_ID = 1 << 24  # sequence ids index per-id arrays: 16M sequences a run at most


class StepState:
    """Every array of one step.

    The pool arrays are owned and updated in place. The per-sequence parts are kept per
    sequence id, so that moving on by one record costs what the record changed: ``rows``
    (one array per ROW_ARRAYS field, indexed by seq id), ``tables`` (one immutable array per
    seq id) with ``table_len``, and ``seen`` (the last step each id was live). ``seqs``
    (the snapshot's per-sequence arrays and CSR tables, in ``seq_id`` order) is built from
    them when asked for, and kept until the next step."""

    __slots__ = ("num_slots", "num_blocks", "step", "pool", "seq_id", "rows", "tables", "table_len", "seen", "_seqs")

    def __init__(self, num_slots: int, num_blocks: int, pool: dict | None = None, step: int = -1):
        self.num_slots = num_slots
        self.num_blocks = num_blocks
        self.step = step  # the step these arrays belong to (-1: before the first)
        if pool is None:
            pool = {name: np.full(num_blocks if name in BLOCK_ARRAYS else num_slots, BLANK_FILL.get(name, 0), dtype=dt)
                    for name, dt in POOL_ARRAYS.items()}
        else:
            pool = {name: np.array(pool[name], dtype=dt) for name, dt in POOL_ARRAYS.items()}  # owned copies
            for name, a in pool.items():
                want = num_blocks if name in BLOCK_ARRAYS else num_slots
                if a.shape != (want,):
                    raise ValueError(f"{name} has shape {a.shape}, expected ({want},)")
        self.pool = pool
        self.seq_id = np.zeros(0, dtype=np.int32)
        self.rows = {name: np.zeros(0, dtype=dt) for name, dt in ROW_ARRAYS.items()}
        self.tables: list[np.ndarray] = []
        self.table_len = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros(0, dtype=np.int64)
        self._seqs: dict | None = None

    def copy(self) -> "StepState":
        out = StepState.__new__(StepState)
        out.num_slots, out.num_blocks, out.step = self.num_slots, self.num_blocks, self.step
        out.pool = {name: a.copy() for name, a in self.pool.items()}
        out._copy_seqs_from(self)
        return out

    def _copy_seqs_from(self, other: "StepState") -> None:
        self.seq_id = other.seq_id  # arrays that are replaced, never written in place, are shared
        self.rows = {name: a.copy() for name, a in other.rows.items()}
        self.tables = list(other.tables)
        self.table_len = other.table_len.copy()
        self.seen = other.seen.copy()
        self._seqs = other._seqs

    def copy_from(self, other: "StepState") -> None:
        """Become ``other``, reusing this state's pool arrays."""
        for name, a in self.pool.items():
            np.copyto(a, other.pool[name])
        self._copy_seqs_from(other)
        self.step = other.step

    @property
    def nbytes(self) -> int:
        per_id = sum(a.nbytes for a in self.rows.values()) + self.table_len.nbytes + self.seen.nbytes
        tables = 4 * int(self.table_len.sum()) + 8 * len(self.tables)  # shared arrays, counted once per state
        return sum(a.nbytes for a in self.pool.values()) + per_id + tables

    def equals(self, other: "StepState") -> bool:
        mine, theirs = self.seqs, other.seqs
        return all(np.array_equal(a, other.pool[k]) for k, a in self.pool.items()) and all(
            np.array_equal(a, theirs[k]) for k, a in mine.items()
        )

    # ------------------------------------------------------------------ per-id bookkeeping
    def _grow(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= MAX_SEQ_ID:
            raise ValueError(f"sequence ids must be in [0, {MAX_SEQ_ID:,}), got {lo if lo < 0 else hi}")
        cap = len(self.seen)
        if hi < cap:
            return
        new_cap = max(2 * cap, hi + 1, 64)
        for name, a in self.rows.items():
            self.rows[name] = np.concatenate([a, np.zeros(new_cap - cap, dtype=a.dtype)])
        self.tables.extend([_EMPTY_I32] * (new_cap - cap))
        self.table_len = np.concatenate([self.table_len, np.zeros(new_cap - cap, dtype=np.int64)])
        self.seen = np.concatenate([self.seen, np.full(new_cap - cap, NEVER, dtype=np.int64)])

    def _fresh(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` were not live at this state's step (call after ``_grow``)."""
        return self.seen[ids] != self.step

    def _enter(self, ids: np.ndarray, step: int) -> None:
        """``ids`` are the live sequences of ``step``: ids that were not live at the step
        before start with an empty table (an id may come back: its old table is not its)."""
        fresh = ids[self._fresh(ids)]
        for sid in fresh.tolist():
            self.tables[sid] = _EMPTY_I32
        self.table_len[fresh] = 0
        self.seen[ids] = step
        self.seq_id = ids.astype(np.int32)
        self.step = step

    @property
    def seqs(self) -> dict[str, np.ndarray]:
        """The per-sequence arrays and CSR tables of this step, in ``seq_id`` order (shared:
        do not write into them)."""
        if self._seqs is None:
            ids = self.seq_id.astype(np.intp)
            out = {"seq_id": self.seq_id}
            for name, a in self.rows.items():
                out[name] = a[ids]
            off = np.zeros(len(ids) + 1, dtype=np.int32)
            np.cumsum(self.table_len[ids], out=off[1:])
            tables = [self.tables[i] for i in ids.tolist()]
            out["seq_table_offsets"] = off
            out["seq_tables"] = np.concatenate(tables).astype(np.int32, copy=False) if tables else _EMPTY_I32
            self._seqs = out
        return self._seqs

    # ------------------------------------------------------------------ encoding
    def encode(self, delta, before: dict | None = None) -> bytes:
        """The step record of ``delta`` (entries that did not change are dropped); moves the
        state to ``delta.step``. O(len(delta) + live sequences + table entries). ``before``: a
        dict that receives the pool values the record's entries had the step before."""
        rec: dict[str, np.ndarray] = {}
        self._encode_entries(rec, "slot_idx", SLOT_ARRAYS, delta, before)
        self._encode_entries(rec, "block_idx", BLOCK_ARRAYS, delta, before)
        changed_tables = getattr(delta, "table_source", None)
        names = SEQ_ARRAYS if changed_tables is not None else SEQ_STATE_ARRAYS
        new = {name: np.asarray(delta.seqs[name], dtype=dt) for name, dt in names.items()}
        ids, prev_ids = new["seq_id"], self.seq_id
        same = len(ids) == len(prev_ids) and np.array_equal(ids, prev_ids)  # the usual case
        if not same and len(np.unique(ids)) != len(ids):
            raise ValueError(f"step {delta.step}: duplicate sequence ids")
        j = np.arange(len(ids)) if same else match_ids(prev_ids, ids)
        rec["seq_id"] = ids
        self._encode_rows(rec, new, j, same, before)
        if changed_tables is None:
            tables = None
            self._encode_tables(rec, new, j, same, getattr(delta, "table_ids", None))
        else:
            tables = self._encode_changed_tables(rec, ids, j, changed_tables)
        running, waiting, swapped = delta.running, delta.waiting, delta.swapped
        queued = np.fromiter((*running, *waiting, *swapped), dtype=np.int32, count=len(running) + len(waiting) + len(swapped))
        mode = QUEUES_DERIVED if np.array_equal(queued, ids) else QUEUES_STORED
        if mode == QUEUES_STORED:
            rec["queues"] = queued
        rec[HEAD] = np.array([delta.step, mode, len(running), len(waiting), len(swapped)], dtype=np.int32)
        rec["events"] = np.frombuffer(encode_events(delta.events), dtype=np.uint8)
        kept = new if tables is not None else {name: a.copy() for name, a in new.items()}  # only kept whole when dense
        self._keep_seqs(rec, kept, delta.step, tables)
        return pack(STEP_FIELDS, rec)

    def _keep_seqs(self, rec: dict, new: dict, step: int, tables: list | None = None) -> None:
        """Move the per-id parts to ``step``: the rows and tables the record lists changed
        (``tables``: those tables as (seq id, table) when ``new`` holds none)."""
        ids = new["seq_id"].astype(np.intp)
        self._grow(ids)
        self._enter(ids, step)
        pos = rec["row_pos"]
        if len(pos):
            sel = ids[pos]
            for name in ROW_ARRAYS:
                self.rows[name][sel] = new[name][pos]
        if tables is not None:
            for sid, table in tables:
                self.tables[sid] = table
                self.table_len[sid] = len(table)
            self._seqs = None  # built from the per-id parts when asked for
            return
        off, flat = new["seq_table_offsets"], new["seq_tables"]
        for p in np.asarray(rec.get("tab_pos", _EMPTY_I32)).tolist():
            sid = int(ids[p])
            self.tables[sid] = flat[off[p] : off[p + 1]].copy()  # a copy: a view would keep the step's tables alive
            self.table_len[sid] = off[p + 1] - off[p]
        self._seqs = new

    def _rows_now(self) -> dict[str, np.ndarray]:
        """This step's ``seq_id`` and per-sequence rows (what :attr:`seqs` holds, without its tables)."""
        if self._seqs is not None:
            return self._seqs
        ids = self.seq_id.astype(np.intp)
        return {"seq_id": self.seq_id, **{name: a[ids] for name, a in self.rows.items()}}

    def _encode_entries(self, rec: dict, idx_name: str, names: dict, delta, before: dict | None) -> None:
        idx = np.asarray(getattr(delta, idx_name), dtype=np.int64)
        if before is not None:
            before.update({name: self.pool[name][:0] for name in names})
        if not len(idx):
            return
        values = {name: np.asarray(getattr(delta, name)) for name in names}
        changed = np.zeros(len(idx), dtype=bool)
        for name, v in values.items():
            changed |= self.pool[name][idx] != v
        keep = idx[changed]
        rec[idx_name] = keep
        for name, v in values.items():
            v = v[changed]
            rec[name] = v
            if before is not None:
                before[name] = self.pool[name][keep]
            self.pool[name][keep] = v

    def _encode_rows(self, rec: dict, new: dict, j: np.ndarray, same: bool, before: dict | None) -> None:
        prev = self._rows_now()
        changed = j < 0
        if len(prev["seq_id"]) and len(j):
            jj = None if same else np.maximum(j, 0)
            for name in ROW_ARRAYS:
                changed |= (prev[name] if same else prev[name][jj]) != new[name]
        pos = np.flatnonzero(changed)
        rec["row_pos"] = pos
        for name in ROW_ARRAYS:
            rec[name] = new[name][pos]
        if before is not None:  # the changed rows' values the step before (0 for a sequence new to this step)
            jp = j[pos]
            old = jp >= 0
            for name in ROW_ARRAYS:
                values = np.zeros(len(pos), dtype=ROW_ARRAYS[name])
                values[old] = prev[name][jp[old]]
                before[name] = values

    def _encode_tables(self, rec: dict, new: dict, j: np.ndarray, same: bool, table_ids) -> None:
        """Per changed table: how many leading entries it kept, and its new tail. Only the
        candidates are compared: every table when ``table_ids`` is None, else the tables of
        those ids, of new sequences, and of any whose length changed (a safety net)."""
        prev_flat = self.seqs["seq_tables"]
        off, flat = new["seq_table_offsets"], new["seq_tables"]
        if len(off) != len(j) + 1 or int(off[0]) != 0 or int(off[-1]) != len(flat) or (np.diff(off) < 0).any():
            raise ValueError("seq_table_offsets do not match seq_tables")
        if table_ids is None and same and np.array_equal(off, self.seqs["seq_table_offsets"]) and np.array_equal(flat, prev_flat):
            return  # no table changed
        length = np.diff(off).astype(np.int64)
        prev_start, prev_len = self._prev_tables(j)
        if table_ids is None:
            cand = np.arange(len(j))
        else:
            hinted = np.isin(new["seq_id"], np.asarray(table_ids, dtype=np.int64)) if len(table_ids) else False
            cand = np.flatnonzero((j < 0) | (length != prev_len) | hinted)
            if not len(cand):
                return
        start, length, prev_start, prev_len = off[:-1][cand], length[cand], prev_start[cand], prev_len[cand]
        common = np.minimum(length, prev_len)
        keep = common.copy()
        if common.sum():
            equal = flat[ranges(start, common)] == prev_flat[ranges(prev_start, common)]
            bad = np.flatnonzero(~equal)
            if len(bad):
                ends = np.cumsum(common)
                seg = np.searchsorted(ends, bad, side="right")
                segs, first = np.unique(seg, return_index=True)
                keep[segs] = bad[first] - (ends - common)[segs]
        changed = (keep != prev_len) | (keep != length)
        tail_len = (length - keep)[changed]
        rec["tab_pos"] = cand[changed]
        rec["tab_keep"] = keep[changed]
        rec["tab_len"] = tail_len
        rec["tab_tail"] = flat[ranges(start[changed] + keep[changed], tail_len)]

    def _encode_changed_tables(self, rec: dict, ids: np.ndarray, j: np.ndarray, changed) -> list:
        """Per changed table, as :meth:`_encode_tables` records it, from ``changed`` (seq id ->
        its block table now) alone: every table that changed is there (the change log's
        contract), and a sequence new to this step that is not there has none. O(the tables
        that changed), not O(every table). Returns them as (seq id, int32 table)."""
        fresh = np.flatnonzero(j < 0).tolist()
        named = [p for p, sid in enumerate(ids.tolist()) if sid in changed] if changed else []
        pos, keeps, lens, tails, out = [], [], [], [], []
        for p in sorted({*fresh, *named}):
            sid = int(ids[p])
            now = changed.get(sid, ())
            old = self.tables[sid].tolist() if j[p] >= 0 else []
            n_old, n_now = len(old), len(now)
            if n_old <= n_now and old == list(now[:n_old]):  # the usual change: the table grew
                keep = n_old
            else:
                keep = next((k for k, (a, b) in enumerate(zip(old, now)) if a != b), min(n_old, n_now))
            if keep == n_old == n_now:
                continue
            table = np.array(now, dtype=np.int32)
            pos.append(p)
            keeps.append(keep)
            lens.append(n_now - keep)
            tails.append(table[keep:])
            out.append((sid, table))
        if pos:
            rec["tab_pos"] = np.array(pos, dtype=np.int32)
            rec["tab_keep"] = np.array(keeps, dtype=np.int32)
            rec["tab_len"] = np.array(lens, dtype=np.int32)
            rec["tab_tail"] = np.concatenate(tails)
        return out

    def _prev_tables(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and length, in the previous step's tables, of each sequence's table (0, 0 when new)."""
        prev_off = self.seqs["seq_table_offsets"].astype(np.int64)
        if len(prev_off) == 1:
            return np.zeros(len(j), dtype=np.int64), np.zeros(len(j), dtype=np.int64)
        jj = np.maximum(j, 0)
        found = j >= 0
        return np.where(found, prev_off[jj], 0), np.where(found, prev_off[jj + 1] - prev_off[jj], 0)

    # ------------------------------------------------------------------ decoding
    def apply(self, record: bytes, validate: bool = False) -> dict[str, np.ndarray]:
        """Move the state on by one step record; returns the record's fields (for the
        queues and events). O(what the record changed). ``validate``: check it first
        (ValueError, one line), leaving the state untouched when it is bad."""
        rec = unpack(STEP_FIELDS, record)
        if validate:
            self._check(rec)
        for idx_name, names in (("slot_idx", SLOT_ARRAYS), ("block_idx", BLOCK_ARRAYS)):
            idx = rec[idx_name]
            if len(idx):
                idx = idx.astype(np.intp)  # numpy indexes several times faster with intp than int32
                for name in names:
                    self.pool[name][idx] = rec[name]
        ids = rec["seq_id"].astype(np.intp)
        self._grow(ids)
        self._enter(ids, int(rec[HEAD][0]))
        pos = rec["row_pos"]
        if len(pos):
            sel = ids[pos]
            for name in ROW_ARRAYS:
                self.rows[name][sel] = rec[name]
        tail, at = rec["tab_tail"], 0
        for p, keep, n in zip(rec["tab_pos"].tolist(), rec["tab_keep"].tolist(), rec["tab_len"].tolist()):
            sid = int(ids[p])
            self.tables[sid] = np.concatenate([self.tables[sid][:keep], tail[at : at + n]], dtype=np.int32)
            self.table_len[sid] = keep + n
            at += n
        self._seqs = None
        return rec

    def _check(self, rec: dict) -> None:
        head = rec[HEAD]
        if len(head) != 5:
            raise ValueError(f"step record head has {len(head)} values, expected 5")
        step, mode, nr, nw, ns = (int(x) for x in head)
        if step != self.step + 1:
            raise ValueError(f"step record for step {step} follows step {self.step}")
        for idx_name, names, size in (("slot_idx", SLOT_ARRAYS, self.num_slots), ("block_idx", BLOCK_ARRAYS, self.num_blocks)):
            idx = rec[idx_name]
            for name in names:
                if len(rec[name]) != len(idx):
                    raise ValueError(f"{name} has {len(rec[name])} values for {len(idx)} indices")
            if len(idx) and (idx.min() < 0 or idx.max() >= size):
                raise ValueError(f"{idx_name} out of range [0, {size})")
        for name in ("slot_state", "block_state"):
            check_states(name, rec[name])
        ids = rec["seq_id"]
        n = len(ids)
        if len(np.unique(ids)) != n:
            raise ValueError("duplicate sequence ids")
        if n and (int(ids.min()) < 0 or int(ids.max()) >= MAX_SEQ_ID):
            raise ValueError(f"sequence ids must be in [0, {MAX_SEQ_ID:,})")
        pos = rec["row_pos"]
        for name in ROW_ARRAYS:
            if len(rec[name]) != len(pos):
                raise ValueError(f"{name} has {len(rec[name])} values for {len(pos)} rows")
        _check_positions("row_pos", pos, n)
        ids = ids.astype(np.intp)
        known = ids < len(self.seen)
        kept = np.zeros(n, dtype=bool)  # live at the step before
        kept[known] = self.seen[ids[known]] == self.step
        if not np.isin(np.flatnonzero(~kept), pos).all():
            raise ValueError("a new sequence has no row")
        tpos = rec["tab_pos"]
        if len(rec["tab_keep"]) != len(tpos) or len(rec["tab_len"]) != len(tpos):
            raise ValueError("table change fields disagree in length")
        _check_positions("tab_pos", tpos, n)
        keep, tail_len = rec["tab_keep"].astype(np.int64), rec["tab_len"].astype(np.int64)
        if len(tpos) and (keep.min() < 0 or tail_len.min() < 0):
            raise ValueError("negative table lengths")
        if int(tail_len.sum()) != len(rec["tab_tail"]):
            raise ValueError("table tails disagree with their lengths")
        prev_len = np.zeros(n, dtype=np.int64)
        prev_len[kept] = self.table_len[ids[kept]]
        if (keep > prev_len[tpos]).any():
            raise ValueError("a table keeps more entries than it had")
        _check_queues(rec, n)
        decode_events(rec["events"])

    def check_record(self, record: bytes) -> None:
        """Check the record of this state's own step, as far as it can be without the step
        before: what a reader takes from it (step, sequence order, queues, events)."""
        rec = unpack(STEP_FIELDS, record)
        head = rec[HEAD]
        if len(head) != 5 or int(head[0]) != self.step:
            raise ValueError(f"the record of step {self.step} has a wrong head")
        if not np.array_equal(rec["seq_id"], self.seq_id):
            raise ValueError(f"step {self.step}: the record's sequences differ from its keyframe's")
        _check_queues(rec, len(rec["seq_id"]))
        decode_events(rec["events"])

    def before(self, rec: bytes | dict) -> dict[str, np.ndarray]:
        """What a step record's entries held in this state (the step before it): the pool values
        at its slot and block indices, and the per-sequence values of its changed rows (0 for a
        sequence that was not live). ValueError (one line) for an index outside the pool or the rows."""
        if not isinstance(rec, dict):
            rec = unpack(STEP_FIELDS, rec)
        out = {}
        for idx_name, names, size in (("slot_idx", SLOT_ARRAYS, self.num_slots), ("block_idx", BLOCK_ARRAYS, self.num_blocks)):
            idx = rec[idx_name].astype(np.intp)
            if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= size):
                raise ValueError(f"{idx_name} out of range [0, {size})")
            out.update({name: self.pool[name][idx] for name in names})
        pos, ids = rec["row_pos"].astype(np.intp), rec["seq_id"].astype(np.int64)
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= len(ids)):
            raise ValueError(f"row_pos out of range [0, {len(ids)})")
        sid = ids[pos]
        live = (sid >= 0) & (sid < len(self.seen))
        live[live] = self.seen[sid[live]] == self.step
        for name, dtype in ROW_ARRAYS.items():
            values = np.zeros(len(pos), dtype=dtype)
            values[live] = self.rows[name][sid[live]]
            out[name] = values
        return out

    def idle_to(self, step: int) -> None:
        """Move on to ``step`` with nothing changed (inside a run of repeated steps): the live
        sequences stay live."""
        self.seen[self.seq_id.astype(np.intp)] = step
        self.step = step

    # ------------------------------------------------------------------ keyframes
    def keyframe(self) -> bytes:
        return pack(KEYFRAME_FIELDS, {HEAD: np.array([self.step], dtype=np.int32), **self.pool, **self.seqs})

    @classmethod
    def from_keyframe(cls, record: bytes, num_slots: int, num_blocks: int) -> "StepState":
        """A state from a keyframe record (always checked: it comes from a file)."""
        rec = unpack(KEYFRAME_FIELDS, record)
        if len(rec[HEAD]) != 1:
            raise ValueError("keyframe head must hold the step")
        state = cls(num_slots, num_blocks, pool=rec, step=int(rec[HEAD][0]))
        for name in ("slot_state", "block_state"):
            check_states(name, state.pool[name])
        seqs = {name: rec[name].astype(dt) for name, dt in SEQ_STATE_ARRAYS.items()}
        n = len(seqs["seq_id"])
        for name in SEQ_ARRAYS:
            if len(seqs[name]) != n:
                raise ValueError(f"{name} has {len(seqs[name])} entries, expected {n} sequences")
        if len(np.unique(seqs["seq_id"])) != n:
            raise ValueError("duplicate sequence ids")
        off = seqs["seq_table_offsets"]
        if len(off) != n + 1 or int(off[0]) != 0 or int(off[-1]) != len(seqs["seq_tables"]) or (np.diff(off) < 0).any():
            raise ValueError("seq_table_offsets do not match seq_tables")
        ids = seqs["seq_id"].astype(np.intp)
        state._grow(ids)
        state._enter(ids, state.step)
        for name in ROW_ARRAYS:
            state.rows[name][ids] = seqs[name]
        for sid, table in zip(ids.tolist(), np.split(seqs["seq_tables"], off[1:-1])):
            state.tables[sid] = table
        state.table_len[ids] = np.diff(off)
        state._seqs = seqs
        return state

    # ------------------------------------------------------------------ reading out
    def queues(self, rec: dict) -> dict[str, tuple[int, ...]]:
        _, mode, nr, nw, _ns = (int(x) for x in rec[HEAD])
        order = self.seq_id if mode == QUEUES_DERIVED else rec["queues"]
        return {"running": _tuple(order[:nr]), "waiting": _tuple(order[nr : nr + nw]), "swapped": _tuple(order[nr + nw :])}

    def arrays(self, copy: bool = True) -> dict[str, np.ndarray]:
        """Every array of the step, as StepSnapshot fields (copies unless ``copy=False``)."""
        out = {name: (a.copy() if copy else a) for name, a in self.pool.items()}
        out.update({name: (a.copy() if copy else a) for name, a in self.seqs.items()})
        return out


_UNCHANGED_EMPTY = ("slot_idx", "block_idx", "row_pos", "tab_pos", "events")
_UNCHANGED_AT = np.array([list(STEP_FIELDS).index(name) for name in _UNCHANGED_EMPTY])


def repeats(record: bytes, prev: bytes) -> bool:
    """Whether step record ``record`` changes nothing after ``prev`` (the record of the step
    before): no pool entry, row or table, no events, the same sequences in the same queues.
    Cheap when it does not: a record that repeats has a known length."""
    counts = np.frombuffer(record, dtype="<i4", count=len(STEP_FIELDS))
    if counts[_UNCHANGED_AT].any():
        return False
    rec = unpack(STEP_FIELDS, record)
    last = unpack(STEP_FIELDS, prev)
    return (np.array_equal(rec[HEAD][1:], last[HEAD][1:]) and np.array_equal(rec["seq_id"], last["seq_id"])
            and np.array_equal(rec["queues"], last["queues"]))


def repeat_record(prev: bytes, step: int) -> bytes:
    """The record of ``step`` when it repeats the step of ``prev``: the same sequences and
    queues, nothing else."""
    last = unpack(STEP_FIELDS, prev)
    head = last[HEAD].copy()
    head[0] = step
    return pack(STEP_FIELDS, {HEAD: head, "seq_id": last["seq_id"], "queues": last["queues"]})


def _check_queues(rec: dict, n: int) -> None:
    _, mode, nr, nw, ns = (int(x) for x in rec[HEAD])
    if min(nr, nw, ns) < 0:
        raise ValueError("negative queue lengths")
    if mode == QUEUES_DERIVED:
        if nr + nw + ns != n or len(rec["queues"]):
            raise ValueError("queue lengths do not add up to the live sequences")
    elif mode == QUEUES_STORED:
        if nr + nw + ns != len(rec["queues"]):
            raise ValueError("queue lengths do not match the stored queues")
    else:
        raise ValueError(f"unknown queue mode {mode}")


def check_states(name: str, codes: np.ndarray) -> None:
    """ValueError unless every code is a SlotState."""
    if len(codes) and (codes.min() < 0 or codes.max() >= NUM_SLOT_STATES):
        raise ValueError(f"{name} holds codes outside 0..{NUM_SLOT_STATES - 1}")


def _check_positions(name: str, pos: np.ndarray, n: int) -> None:
    if len(pos) and (pos.min() < 0 or pos.max() >= n or (np.diff(pos) <= 0).any()):
        raise ValueError(f"{name} must be increasing positions in [0, {n})")
