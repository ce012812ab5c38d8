"""A decode run in a recording: steps in which every running sequence decodes one token plainly.

The engine takes such a stretch at once (``Engine(coalesce=True)``,
:meth:`~pagedkv_core.scheduler.Scheduler.run_decodes`) and hands its recorder what it wrote
(:class:`DecodeWrites`): the running sequences' ids, each one's first slot, and the ``(n, k)``
tokens whose K/V went there and into the slots after it. Each step of the run follows from the
step before it: step ``j`` (from 0) writes column ``j`` at each sequence's first slot + ``j`` (the
slot FILLED with the token; in a paged pool its block FILLED, its fill the slot's offset + 1),
adds one to each sequence's token and computed counts, and changes nothing else (no queue,
table, owner, hash or event); its metrics are the step before's
:meth:`~pagedkv_core.metrics.StepMetrics.after_decodes`. So a run needs no more than that to be
stored, and every step of it can be rebuilt:

- :func:`run_deltas`: the run's steps as StepDeltas, one by one, from the state before it (what a
  :class:`~pagedkv_core.record.recording.Recording` keeps, and what a trace's loader expands a
  run frame into);
- :func:`end_delta`: the whole run as one StepDelta to its last step (a trace writer that wrote
  the run as one frame moves its own state on so);
- :func:`pack_run` / :func:`unpack_run`: the bytes of a trace's run frame;
- :func:`check_run`: a run that the state before it cannot take (ValueError, one line).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from ..metrics import StepMetrics
from .recording import StepDelta
from .slot_state import SlotState
from .step_codec import StepState

_HEAD = struct.Struct("<III")  # sequences, steps, bytes a token (2 or 4)
_FILLED = int(SlotState.FILLED)
_TOKEN_MAX = np.iinfo(np.int32).max


class DecodeWrites(NamedTuple):
    """What a decode run wrote: ``seq_ids`` (n, in the step's order), ``first_slots`` (n) and
    ``tokens`` (n, k): the K/V of ``tokens[i, j]`` went to slot ``first_slots[i] + j`` in the
    run's step ``j``."""

    seq_ids: np.ndarray
    first_slots: np.ndarray
    tokens: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.tokens.shape[1])


def check_run(state: StepState, metrics: StepMetrics, writes: DecodeWrites, block_size: int) -> None:
    """ValueError (one line) unless ``writes`` is a run the step of ``state`` (whose metrics are
    ``metrics``) can go on with: every sequence of that step runs (none waits or is swapped out),
    the run lists them in their order, and each writes slots inside the pool and, in a paged
    pool, inside one block without filling it (a decode that fills a block is not plain)."""
    ids, first, tokens = writes
    if tokens.ndim != 2 or tokens.shape[1] < 1 or len(ids) != tokens.shape[0] or len(first) != len(ids) or not len(ids):
        raise ValueError(f"a decode run of shape {tokens.shape} for {len(ids)} sequence(s) and {len(first)} slot(s)")
    k = tokens.shape[1]
    if metrics.num_waiting or metrics.num_swapped or metrics.num_running != len(ids):
        raise ValueError(f"a decode run at step {state.step + 1} follows a step where not every sequence runs")
    if not np.array_equal(ids, state.seq_id):
        raise ValueError(f"a decode run at step {state.step + 1} must list that step's {len(state.seq_id)} sequences, in order")
    if int(first.min()) < 0 or int(first.max()) + k > state.num_slots:
        raise ValueError(f"a decode run writes outside the pool's {state.num_slots:,} slots")
    if state.num_blocks and int((first % block_size).max()) + k >= block_size:
        raise ValueError(f"a decode run of {k} steps fills a block (block size {block_size})")
    if int(tokens.min()) < 0 or int(tokens.max()) > _TOKEN_MAX:
        raise ValueError("a decode run's token ids must be non-negative int32")


def _base(state: StepState, writes: DecodeWrites, block_size: int):
    """What every step of the run starts from: the slots in order, their owners, the blocks'
    unchanging values, and the sequences' arrays before the run."""
    order = np.argsort(writes.first_slots, kind="stable")
    first = writes.first_slots[order].astype(np.int64)
    owners = state.pool["slot_owner"][first].copy()
    blocks = first // block_size if state.num_blocks else first[:0]
    offset = first - blocks * block_size if state.num_blocks else blocks  # the first slots' offsets in their blocks
    kept = {name: state.pool[name][blocks].copy() for name in ("block_ref", "block_hash")}
    return order, first, owners, blocks, offset, kept, dict(state.seqs)


def _delta(step: int, slots, owners, tokens, blocks, fill, kept: dict, seqs: dict, grown: int,
           metrics: StepMetrics) -> StepDelta:
    rows = dict(seqs)
    rows["seq_num_tokens"] = seqs["seq_num_tokens"] + grown
    rows["seq_num_computed"] = seqs["seq_num_computed"] + grown
    return StepDelta(
        step=step, slot_idx=slots, slot_state=np.full(len(slots), _FILLED, dtype=np.int8), slot_owner=owners,
        slot_token=tokens.astype(np.int32), block_idx=blocks, block_state=np.full(len(blocks), _FILLED, dtype=np.int8),
        block_ref=kept["block_ref"], block_fill=fill.astype(np.int16), block_hash=kept["block_hash"], seqs=rows,
        running=tuple(seqs["seq_id"].tolist()), metrics=metrics, table_ids=np.zeros(0, dtype=np.int64))


def run_deltas(state: StepState, first_step: int, writes: DecodeWrites, metrics: StepMetrics, block_size: int):
    """The run's steps as StepDeltas, in order (an iterator); ``state`` is the step before the
    run and ``metrics`` its metrics. Everything is read from ``state`` now, so a caller may
    move ``state`` on with each delta as it comes."""
    order, first, owners, blocks, offset, kept, seqs = _base(state, writes, block_size)
    tokens = writes.tokens[order]
    n = len(first)
    return (_delta(first_step + j, first + j, owners, tokens[:, j], blocks, offset + j + 1, kept, seqs, j + 1,
                   metrics.after_decodes(j + 1, n)) for j in range(writes.steps))


def end_delta(state: StepState, first_step: int, writes: DecodeWrites, metrics: StepMetrics, block_size: int) -> StepDelta:
    """The whole run as one StepDelta to its last step, from ``state``, the step before it."""
    order, first, owners, blocks, offset, kept, seqs = _base(state, writes, block_size)
    k = writes.steps
    slots = (first[:, None] + np.arange(k)).ravel()
    return _delta(first_step + k - 1, slots, np.repeat(owners, k), writes.tokens[order].ravel(), blocks, offset + k,
                  kept, seqs, k, metrics.after_decodes(k, len(first)))


_TOKEN_TYPES = {2: "<u2", 4: "<i4"}  # a run's tokens in 2 bytes each where every one fits


def pack_run(writes: DecodeWrites) -> bytes:
    """A run frame's bytes: sequences, steps and bytes a token (uint32 each), the seq ids
    (int32), the first slots (int64) and the tokens, sequence by sequence (uint16 where every
    one is below 65,536, as a vocabulary's ids are; else int32)."""
    n, k = writes.tokens.shape
    width = 2 if n and int(writes.tokens.max()) < 1 << 16 else 4
    return b"".join([_HEAD.pack(n, k, width), np.asarray(writes.seq_ids, dtype="<i4").tobytes(),
                     np.asarray(writes.first_slots, dtype="<i8").tobytes(),
                     np.asarray(writes.tokens).astype(_TOKEN_TYPES[width]).tobytes()])


def unpack_run(raw: bytes) -> DecodeWrites:
    """:func:`pack_run` reversed; ValueError (one line) for bytes of the wrong length."""
    if len(raw) < _HEAD.size:
        raise ValueError(f"a decode run frame of {len(raw)} bytes has no head")
    n, k, width = _HEAD.unpack_from(raw)
    if width not in _TOKEN_TYPES:
        raise ValueError(f"a decode run frame's tokens take 2 or 4 bytes, not {width}")
    want = _HEAD.size + n * (4 + 8) + n * k * width
    if len(raw) != want:
        raise ValueError(f"a decode run frame of {n} sequences and {k} steps is {len(raw):,} bytes, not {want:,}")
    at = _HEAD.size
    ids = np.frombuffer(raw, dtype="<i4", count=n, offset=at)
    first = np.frombuffer(raw, dtype="<i8", count=n, offset=at + 4 * n)
    tokens = np.frombuffer(raw, dtype=_TOKEN_TYPES[width], count=n * k, offset=at + 12 * n).reshape(n, k)
    return DecodeWrites(ids, first, tokens.astype(np.int32))
