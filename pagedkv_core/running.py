"""The running sequences, in admission order, with their state as columns.

A running sequence that decodes into a block it holds alone keeps doing so until the block is
one token short of full: its next token's slot is the one after its last. :class:`RunningSet`
keeps, beside the list of sequences, one column of integers a sequence. For its plain decodes:

- ``slot``: where its next token's K/V goes when that is a plain decode (see
  ``Allocator.decode_slot``), or -1 when it is not known to be one;
- ``last``: its last token (the one whose K/V that decode writes);
- ``over``: its tokens less ``stop_at`` (from 0 on a length limit may end it: its stop is then
  checked in full);
- ``num_out``: its output tokens so far;

and what a snapshot or a recording lists of it (:meth:`RunningSet.rows`): its tokens, its
computed tokens, its id, its request's index, its sample index, its blocks (contiguous:
reserved slots) and its reservation's first slot (-1: none). A plain decode moves the four
counters (``over`` to computed tokens) on by one, in one pass.

The scheduler sets a sequence's plain-decode entries when the allocator first answers a plain
decode for it, and moves every plain-decoding sequence on at once after the step
(:meth:`advance`). A sequence the step works on one at a time (it crosses a block boundary,
prefills, forks, joins) is marked stale (:meth:`touch`) and read again, from the sequence and
the allocator, when the rows are next asked for. So a step's plain decodes are chosen, written,
checked and listed by whole columns; only the sequences that cross a block boundary, finish, or
are preempted or admitted cost Python work one at a time. (The scheduler keeps the columns from
``Scheduler.columns_from`` running sequences on; below, it takes every sequence one at a time and
marks every column unknown and stale: :meth:`forget`.)
"""
from __future__ import annotations

from itertools import chain
from operator import attrgetter

import numpy as np

SLOT, LAST, OVER, NUM_OUT, NUM_TOKENS, NUM_COMPUTED, SEQ_ID, REQUEST, SAMPLE, NUM_BLOCKS, RESERVED, STALE = range(12)
_ROWS = 12
LANE = slice(SLOT, NUM_COMPUTED + 1)  # what a plain decode reads and moves on
_COUNTERS = slice(OVER, NUM_COMPUTED + 1)  # each one more after a plain decode
LISTED = slice(NUM_TOKENS, RESERVED + 1)  # what rows() lists, in this order
_LISTED_READ = attrgetter("num_tokens", "num_computed", "seq_id", "request.index", "sample_index")


def listed_state(seqs: list) -> np.ndarray:
    """``(5, len(seqs))`` int64: each sequence's tokens, computed tokens, id, request index and
    sample index (the first five of ``LISTED``), read from the sequences in one pass."""
    n = len(seqs)
    return np.fromiter(chain.from_iterable(map(_LISTED_READ, seqs)), np.int64, 5 * n).reshape(n, 5).T


class RunningSet:
    """``seqs``: the running sequences, the first admitted first (the list itself is the
    scheduler's ``running``); ``cols[:, i]``: sequence ``i``'s column (see the module docstring)."""

    def __init__(self, capacity: int = 64):
        self.seqs: list = []
        self._cols = np.empty((_ROWS, max(int(capacity), 1)), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def cols(self) -> np.ndarray:
        """The running sequences' columns, ``(12, len(self))`` (a view: read it before the next change)."""
        return self._cols[:, : len(self.seqs)]

    @property
    def slot(self) -> np.ndarray:
        return self._cols[SLOT, : len(self.seqs)]

    # ------------------------------------------------------------------ the list, changed
    def append(self, seq) -> None:
        """``seq`` joins the tail; its plain decodes are not known yet, its listed state is read later."""
        n = len(self.seqs)
        if n == self._cols.shape[1]:
            grown = np.empty((_ROWS, 2 * n), dtype=np.int64)
            grown[:, :n] = self._cols
            self._cols = grown
        self._cols[SLOT, n] = -1
        self._cols[STALE, n] = 1
        self.seqs.append(seq)

    def pop(self):
        """The tail leaves (preemption takes the most recently admitted)."""
        return self.seqs.pop()

    def remove(self, seq) -> None:
        """``seq`` leaves from wherever it is (it finished)."""
        i = self.seqs.index(seq)
        n = len(self.seqs)
        del self.seqs[i]
        if i < n - 1:
            self._cols[:, i : n - 1] = self._cols[:, i + 1 : n]

    # ------------------------------------------------------------------ the columns
    def forget(self) -> None:
        """Every sequence's plain decode unknown, its listed state to be read again (the
        scheduler takes a step one sequence at a time, and keeps no column up to date)."""
        n = len(self.seqs)
        self._cols[SLOT, :n] = -1
        self._cols[STALE, :n] = 1

    def touch(self, i: int) -> None:
        """Sequence ``i`` is worked on alone this step: its listed state is read again."""
        self._cols[STALE, i] = 1

    def set_plain(self, i: int, slot: int, seq) -> None:
        """Sequence ``i`` (``seq``) decodes plainly at ``slot`` this step, found alone: its
        plain-decode entries, from the sequence (and its listed state is read again)."""
        ids = seq.token_ids
        n = len(ids)
        self._cols[LANE, i] = (slot, ids[-1], n - seq.stop_at, n - seq.num_prompt_tokens, n, seq.num_computed)
        self._cols[STALE, i] = 1

    def lane(self, spans: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(the places, a copy of their plain-decode columns ``cols[LANE]``) of the sequences at
        ``spans`` (``[start, stop)`` runs of places, in order)."""
        if len(spans) == 1:
            a, b = spans[0]
            return np.arange(a, b, dtype=np.int64), self._cols[LANE, a:b].copy()
        at = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans])
        return at, self._cols[LANE, at]

    def advance(self, at: np.ndarray, lane: np.ndarray, tokens: np.ndarray, next_slots: np.ndarray) -> np.ndarray:
        """The sequences at ``at`` (``lane``: their columns from :meth:`lane`, left as they were) each
        took ``tokens[i]`` by a plain decode; ``next_slots``: where each one's next plain decode goes
        (-1: not one). Returns their ``over`` after the token (from 0 on: check their stop)."""
        lane = lane.copy()
        lane[SLOT] = next_slots
        lane[LAST] = tokens
        lane[_COUNTERS] += 1
        if len(at) and at[-1] - at[0] == len(at) - 1:  # one run of places
            self._cols[LANE, at[0] : at[-1] + 1] = lane
        else:
            self._cols[LANE, at] = lane
        return lane[OVER]

    def advance_run(self, steps: int, last: np.ndarray, decode_slot) -> None:
        """Every running sequence took ``steps`` tokens by plain decodes (a decode run), the last
        ``last[i]``: each counter moves on by ``steps``; a known plain decode's slot is asked
        again (``decode_slot(seq)``), as is its last token."""
        n = len(self.seqs)
        cols = self._cols[:, :n]
        cols[_COUNTERS] += steps
        known = np.flatnonzero(cols[SLOT] >= 0).tolist()
        if known:
            seqs = self.seqs
            cols[SLOT, known] = [decode_slot(seqs[i]) for i in known]
            cols[LAST, known] = last[known]

    def rows(self, allocator) -> np.ndarray:
        """``(7, len(self))``: each running sequence's tokens, computed tokens, id, request
        index, sample index, blocks and reservation start (-1: none), in the running order
        (``LISTED``). Reads the stale ones again (one ``seq_layout`` call for all of them); a
        view, read it before the next change."""
        n = len(self.seqs)
        cols = self._cols[:, :n]
        stale = np.flatnonzero(cols[STALE]).tolist()
        if stale:
            seqs = self.seqs
            picked = [seqs[i] for i in stale]
            blocks, reserved, _ = allocator.seq_layout(picked)
            cols[NUM_TOKENS:NUM_BLOCKS, stale] = listed_state(picked)
            cols[NUM_BLOCKS, stale] = blocks
            cols[RESERVED, stale] = reserved if reserved is not None else -1
            cols[STALE, stale] = 0
        return cols[LISTED]

    def check(self, allocator) -> None:
        """Assert every entry not marked unknown or stale is what the sequence and the allocator say now."""
        cols = self.cols
        blocks, reserved, _ = allocator.seq_layout(self.seqs)
        for i, seq in enumerate(self.seqs):
            if not cols[STALE, i]:
                now = (len(seq.token_ids), seq.num_computed, seq.seq_id, seq.request.index, seq.sample_index, blocks[i],
                       reserved[i] if reserved is not None else -1)
                assert tuple(cols[LISTED, i].tolist()) == now, f"{seq}: listed {cols[LISTED, i].tolist()}, now {now}"
            slot = int(cols[SLOT, i])
            if slot < 0:
                continue
            ids = seq.token_ids
            assert slot == allocator.decode_slot(seq), f"{seq}: lane slot {slot}, allocator {allocator.decode_slot(seq)}"
            assert int(cols[LAST, i]) == ids[-1], f"{seq}: lane's last token {int(cols[LAST, i])}, not {ids[-1]}"
            assert int(cols[OVER, i]) == len(ids) - seq.stop_at, f"{seq}: lane's tokens over stop_at {int(cols[OVER, i])}"
            assert int(cols[NUM_OUT, i]) == len(ids) - seq.num_prompt_tokens, f"{seq}: lane's output count"
            assert int(cols[NUM_TOKENS, i]) == len(ids) and int(cols[NUM_COMPUTED, i]) == seq.num_computed, f"{seq}: counts"
