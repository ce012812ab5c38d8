"""A view of the KV pool: the per-slot and per-block arrays snapshots, recordings and heatmaps read.

Allocators only allocate: what they change they tell a change log
(:mod:`pagedkv_core.kv.changes`), and a :class:`PoolView` folds that log into these arrays
(codes in :class:`~pagedkv_core.record.slot_state.SlotState`):

    per slot:  ``slot_state`` int8, ``slot_owner`` int32 (request index; -1: none),
               ``slot_token`` int32 (-1: none);
    per block: ``block_state`` int8, ``block_ref`` int32, ``block_fill`` int16, ``block_hash`` int64
               (paged layouts only; a contiguous view has no blocks and shows its slots).

:meth:`PoolView.fold` applies one step's entries; :meth:`PoolView.take_changes` then names the
:class:`Changes` they made (the slot and block ranges touched, the tables that changed): what a
recording stores. The cost follows the entries: a step's plain decodes are one entry, and so are
the blocks a sequence takes, lets go, gets indexed or has written at once, each folded by numpy at
once; a block filled or held alone, O(block size). The ranges touched go to a recording as int64 arrays.
The engine owns the view (``Engine.view``) and folds after every step; with nothing recording or
snapshotting it keeps none, and allocators log nothing.

A view says what it does not know rather than invent it. ``knows`` names the fields its source
tells: an engine's allocator tells all of :data:`ALL_FIELDS`; a vLLM server's KV events tell the
cached blocks, their hashes and token ids, and nothing about owners, ref counts or partial blocks
(:meth:`PoolView.observed`). Where it does not know the owner, ``slot_owner`` holds
:data:`UNKNOWN_OWNER`, never a guess. :meth:`PoolView.place` and :meth:`PoolView.forget` are how
such a source folds in (see :meth:`pagedkv_core.observe.cache_state.CacheState.fold_into`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kv import changes as log
from ..kv.prefix_hash import NO_HASH
from .slot_state import SlotState

_FREE, _FILLED, _EMPTY, _CACHED, _SHARED, _FRAGMENT = (
    int(SlotState.FREE),
    int(SlotState.FILLED),
    int(SlotState.EMPTY),
    int(SlotState.CACHED),
    int(SlotState.SHARED),
    int(SlotState.FRAGMENT),
)
UNKNOWN_OWNER = -2  # the source does not say who holds the slot
_BULK = 4  # blocks of one entry from which numpy folds them at once (fewer: one at a time is cheaper)
ALL_FIELDS = frozenset({"state", "owner", "token", "ref", "fill", "hash", "partial"})
OBSERVED_FIELDS = frozenset({"state", "token", "hash"})  # a vLLM server's KV events: full cached blocks only
SLOT_FIELDS = ("slot_state", "slot_owner", "slot_token")
BLOCK_FIELDS = ("block_state", "block_ref", "block_fill", "block_hash")


def _spans(at: np.ndarray, size: int = 1) -> np.ndarray:
    """The ranges ``[a * size, a * size + size)`` of each of ``at``, flat (as :class:`Changes` holds them)."""
    out = np.empty(2 * len(at), dtype=np.int64)
    out[0::2] = at * size
    out[1::2] = out[0::2] + size
    return out


def _flat(scalars: list[int], runs: list[np.ndarray]) -> np.ndarray:
    """Flat ranges kept one by one (``scalars``) and many at once (``runs``), as one int64 array."""
    first = np.array(scalars, dtype=np.int64)
    return np.concatenate([first, *runs]) if runs else first


class Changes(NamedTuple):
    """What one fold touched: what a recording stores (a superset is fine, nothing may be missing)."""

    slots: np.ndarray  # flat half-open ranges [lo0, hi0, lo1, hi1, ...] of slots whose arrays may have changed (int64)
    blocks: np.ndarray  # the same, of blocks
    tables: set[int]  # seq ids whose block table changed (or went); a recording-only step hands them on as id -> table


class PoolView:
    """The arrays of one pool, folded from change-log entries (see the module docstring)."""

    def __init__(self, num_slots: int, block_size: int, num_blocks: int, *, allocator: str = "paged",
                 num_host_blocks: int = 0, knows=ALL_FIELDS):
        self.allocator = allocator  # the registry name snapshots carry
        self.block_size = block_size
        self.num_slots = num_slots
        self.num_blocks = num_blocks  # 0: a contiguous view, shown per slot
        self.num_host_blocks = num_host_blocks
        self.knows = frozenset(knows)
        owner = -1 if "owner" in self.knows else UNKNOWN_OWNER
        self.slot_state = np.zeros(num_slots, dtype=np.int8)
        self.slot_owner = np.full(num_slots, owner, dtype=np.int32)
        self.slot_token = np.full(num_slots, -1, dtype=np.int32)
        self.block_state = np.zeros(num_blocks, dtype=np.int8)
        self.block_ref = np.zeros(num_blocks, dtype=np.int32)  # ref counts can pass 32,767 at 1M slots
        self.block_fill = np.zeros(num_blocks, dtype=np.int16)
        self.block_hash = np.zeros(num_blocks, dtype=np.int64)
        self._holders: dict[int, list[int]] = {}  # block in use -> the seq ids holding it, oldest first
        self._owner_of: dict[int, int] = {}  # seq id -> request index (its owner code)
        self._slots: list[int] = []  # ranges touched, flat, one by one
        self._blocks: list[int] = []
        self._slot_runs: list[np.ndarray] = []  # and many at once (a numpy fold's), as flat arrays
        self._block_runs: list[np.ndarray] = []
        self._tables: set[int] = set()
        # False: nobody reads take_changes() (an engine that snapshots but records nothing), so a
        # fold of many blocks or slots at once skips listing their ranges.
        self.tracking = True
        self._fold = {
            log.TAKEN: self._taken, log.HELD: self._held, log.RELEASED: self._released, log.FILLED: self._filled,
            log.FILLED_RUN: self._filled_run,
            log.COPIED: self._copied, log.CACHED: self._cached, log.UNCACHED: self._uncached,
            log.TABLE: self._table, log.RESERVED: self._reserved, log.WRITTEN: self._written,
            log.FREED: self._freed, log.FRAGMENT: self._fragment, log.UNFRAGMENT: self._unfragment,
            log.DECODED: self._decoded,
        }

    @classmethod
    def of(cls, allocator) -> "PoolView":
        """An empty view of ``allocator``'s pool, as it is before its first step."""
        if allocator.kind == "paged":
            bs = allocator.block_size
            return cls(allocator.num_slots, bs, allocator.num_blocks, allocator=allocator.name,
                       num_host_blocks=allocator.num_host_slots // bs)
        return cls(allocator.num_slots, 1, 0, allocator=allocator.name)

    @classmethod
    def observed(cls, num_blocks: int, block_size: int) -> "PoolView":
        """A view of a server's cache folded from its KV events: positions are the view's own
        (the events name no physical block), owners are unknown, every block is full."""
        return cls(num_blocks * block_size, block_size, num_blocks, knows=OBSERVED_FIELDS)

    # ------------------------------------------------------------------ reading
    def scalars(self) -> dict:
        """The sizes a snapshot states once."""
        return dict(allocator=self.allocator, block_size=self.block_size, num_slots=self.num_slots,
                    num_blocks=self.num_blocks, num_host_blocks=self.num_host_blocks)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The live arrays (not copies): they change at the next fold."""
        return {name: getattr(self, name) for name in (*SLOT_FIELDS, *BLOCK_FIELDS)}

    def owners(self, b: int) -> list[int]:
        """Request indices holding block ``b``, oldest first (the first is the one shown)."""
        return [self._owner_of[sid] for sid in self._holders.get(b, ())]

    # ------------------------------------------------------------------ folding
    def fold(self, entries) -> None:
        """Apply change-log entries in order (what they touch is kept for :meth:`take_changes`)."""
        fold = self._fold
        for entry in entries:
            fold[entry[0]](*entry[1:])

    def take_changes(self) -> Changes:
        """What the folds since the last call touched (what a recording stores); starts afresh.
        Complete only while ``tracking`` is on (the engine turns it off when nothing records)."""
        out = Changes(_flat(self._slots, self._slot_runs), _flat(self._blocks, self._block_runs), self._tables)
        self.forget_changes()
        return out

    def forget_changes(self) -> None:
        """Start afresh without reading what the folds touched (nobody records them)."""
        self._slots, self._blocks, self._slot_runs, self._block_runs = [], [], [], []
        self._tables = set()

    def _mark_block(self, b: int) -> None:
        bs = self.block_size
        self._blocks += (b, b + 1)
        self._slots += (b * bs, b * bs + bs)

    def _refresh(self, b: int) -> None:
        """Block ``b``'s codes and owner from its holders, fill and hash."""
        bs = self.block_size
        base = b * bs
        self._mark_block(b)
        holders = self._holders.get(b)
        ref = len(holders) if holders else 0
        self.block_ref[b] = ref
        if ref == 0:
            code = _CACHED if self.block_hash[b] != NO_HASH else _FREE
            self.block_state[b] = code
            self.slot_state[base : base + bs] = code
            self.slot_owner[base : base + bs] = -1
            return
        n = int(self.block_fill[b])
        code = _SHARED if ref > 1 else _FILLED
        self.block_state[b] = code if n else (_SHARED if ref > 1 else _EMPTY)
        self.slot_state[base : base + n] = code
        self.slot_state[base + n : base + bs] = _EMPTY
        self.slot_owner[base : base + bs] = self._owner_of[holders[0]]

    def _clear_tokens(self, b: int) -> None:
        bs = self.block_size
        self.block_fill[b] = 0
        self.slot_token[b * bs : b * bs + bs] = -1

    # paged entries -------------------------------------------------------------------------
    def _table(self, seq_id: int) -> None:
        self._tables.add(seq_id)

    def _taken(self, blocks: list[int], seq_id: int, owner: int) -> None:
        """Free blocks now held by ``seq_id`` alone: empty, uncached (a cached one was evicted)."""
        holders = self._holders
        for b in blocks:
            holders[b] = [seq_id]
        self._owner_of[seq_id] = owner
        if len(blocks) < _BULK:  # one at a time: what _clear_tokens and _refresh would do, for one holder
            bs = self.block_size
            for b in blocks:
                base = b * bs
                self._blocks += (b, b + 1)
                self._slots += (base, base + bs)
                self.block_hash[b] = NO_HASH
                self.block_fill[b] = 0
                self.block_ref[b] = 1
                self.block_state[b] = _EMPTY
                self.slot_token[base : base + bs] = -1
                self.slot_state[base : base + bs] = _EMPTY
                self.slot_owner[base : base + bs] = owner
            return
        at = np.array(blocks, dtype=np.int64)
        slots = self._slots_of(at)
        self.block_hash[at] = NO_HASH
        self.block_fill[at] = 0
        self.block_ref[at] = 1
        self.block_state[at] = _EMPTY
        self.slot_token[slots] = -1
        self.slot_state[slots] = _EMPTY
        self.slot_owner[slots] = owner

    def _held(self, b: int, seq_id: int, owner: int) -> None:
        self._holders.setdefault(b, []).append(seq_id)
        self._owner_of[seq_id] = owner
        self._refresh(b)

    def _released(self, blocks: list[int], seq_id: int) -> None:
        """``seq_id`` let the blocks go: a block no one else holds shows free or cached (an
        uncached one loses its tokens); one still held shows its next holder."""
        holders = self._holders
        unheld = []
        for b in blocks:
            mine = holders[b]
            mine.remove(seq_id)
            if mine:
                self._refresh(b)
            else:
                del holders[b]
                unheld.append(b)
        if len(unheld) < _BULK:  # one at a time: what _clear_tokens and _refresh would do, held by none
            bs = self.block_size
            for b in unheld:
                base = b * bs
                self._blocks += (b, b + 1)
                self._slots += (base, base + bs)
                if self.block_hash[b] == NO_HASH:
                    self.block_fill[b] = 0
                    self.slot_token[base : base + bs] = -1
                    code = _FREE
                else:
                    code = _CACHED
                self.block_ref[b] = 0
                self.block_state[b] = code
                self.slot_state[base : base + bs] = code
                self.slot_owner[base : base + bs] = -1
            return
        at = np.array(unheld, dtype=np.int64)
        slots = self._slots_of(at)
        cached = self.block_hash[at] != NO_HASH
        code = np.where(cached, np.int8(_CACHED), np.int8(_FREE))
        self.block_fill[at[~cached]] = 0
        self.slot_token[slots.reshape(len(at), -1)[~cached].ravel()] = -1
        self.block_ref[at] = 0
        self.block_state[at] = code
        self.slot_state[slots] = np.repeat(code, self.block_size)
        self.slot_owner[slots] = -1

    def _slots_of(self, at: np.ndarray) -> np.ndarray:
        """The slots of blocks ``at``, block by block, marked as touched with the blocks."""
        bs = self.block_size
        if self.tracking:
            self._block_runs.append(_spans(at))
            self._slot_runs.append(_spans(at, bs))
        return (at[:, None] * bs + np.arange(bs)).ravel()

    def _filled(self, b: int, offset: int, tokens: list[int]) -> None:
        bs = self.block_size
        lo = b * bs + offset
        n = len(tokens)
        holders = self._holders.get(b)
        code = _SHARED if holders and len(holders) > 1 else _FILLED
        self._blocks += (b, b + 1)
        self._slots += (lo, lo + n)
        if n == 1:  # a decode: one slot
            self.slot_token[lo] = tokens[0]
            self.slot_state[lo] = code
        else:
            self.slot_token[lo : lo + n] = tokens
            self.slot_state[lo : lo + n] = code
        self.block_state[b] = code
        self.block_fill[b] = offset + n

    def _filled_run(self, blocks: list[int], offset: int, tokens: list[int]) -> None:
        """``tokens`` written from ``offset`` of ``blocks[0]`` on, through ``blocks`` in order (each
        filled to its end but the last), each held by its writer alone: one pass of numpy."""
        bs, n = self.block_size, len(tokens)
        at = np.array(blocks, dtype=np.int64)
        base = at * bs
        fill = np.minimum(offset + n - np.arange(len(at)) * bs, bs)
        slots = (base[:, None] + np.arange(bs)).ravel()[offset : offset + n]
        self.slot_token[slots] = tokens
        self.slot_state[slots] = _FILLED
        self.block_state[at] = _FILLED
        self.block_fill[at] = fill
        if self.tracking:
            self._block_runs.append(_spans(at))
            spans = _spans(at, bs)  # each block's slots, cut to what was written
            spans[0] += offset
            spans[1::2] = base + fill
            self._slot_runs.append(spans)

    def _copied(self, src: int, dst: int, n: int) -> None:
        bs = self.block_size
        self.block_fill[dst] = n
        self.slot_token[dst * bs : dst * bs + n] = self.slot_token[src * bs : src * bs + n]
        self._refresh(dst)

    def _cached(self, blocks: list[int], hashes: list[int]) -> None:
        """Blocks indexed in the prefix cache: a held block shows as it did, with its hash."""
        if len(blocks) < _BULK:
            for b, h in zip(blocks, hashes):
                self.block_hash[b] = h
                self._refresh(b)
            return
        at = np.array(blocks, dtype=np.int64)
        self.block_hash[at] = hashes
        unheld = [b for b in blocks if b not in self._holders]
        for b in unheld:  # none from an engine: a sequence's own write indexes its blocks
            self._refresh(b)
        if self.tracking:
            self._block_runs.append(_spans(at))

    def _uncached(self, b: int) -> None:
        self.block_hash[b] = NO_HASH
        if b not in self._holders:
            self._clear_tokens(b)
        self._refresh(b)

    def _decoded(self, slots: list[int], tokens: list[int]) -> None:
        """A step's plain decodes: one slot each, the next of a block its sequence holds alone
        (paged) or of its reservation (contiguous). One pass of numpy for all of them."""
        at = np.array(slots, dtype=np.int64)
        self.slot_token[at] = tokens
        self.slot_state[at] = _FILLED
        if self.tracking:
            self._slot_runs.append(_spans(at))
        if self.num_blocks:
            blocks = at // self.block_size
            self.block_state[blocks] = _FILLED
            self.block_fill[blocks] = at - blocks * self.block_size + 1
            if self.tracking:
                self._block_runs.append(_spans(blocks))

    # contiguous entries ----------------------------------------------------------------------
    def _reserved(self, start: int, length: int, owner: int) -> None:
        self._slots += (start, start + length)
        self.slot_state[start : start + length] = _EMPTY
        self.slot_owner[start : start + length] = owner

    def _written(self, slot: int, tokens: list[int]) -> None:
        n = len(tokens)
        self._slots += (slot, slot + n)
        if n == 1:
            self.slot_token[slot] = tokens[0]
            self.slot_state[slot] = _FILLED
        else:
            self.slot_token[slot : slot + n] = tokens
            self.slot_state[slot : slot + n] = _FILLED

    def _freed(self, start: int, length: int) -> None:
        self._slots += (start, start + length)
        self.slot_state[start : start + length] = _FREE
        self.slot_owner[start : start + length] = -1
        self.slot_token[start : start + length] = -1

    def _fragment(self, start: int, length: int) -> None:
        self._slots += (start, start + length)
        self.slot_state[start : start + length] = _FRAGMENT

    def _unfragment(self, start: int, length: int) -> None:
        self._slots += (start, start + length)
        states = self.slot_state[start : start + length]
        states[states == _FRAGMENT] = _FREE

    # ------------------------------------------------------------------ an observed server
    def place(self, b: int, block_hash: int, tokens) -> None:
        """Show block ``b`` as a full cached block holding ``tokens`` (``block_size`` of them;
        fewer: unknown, -1). Who holds it, and whether anyone does, the source does not say."""
        bs = self.block_size
        base = b * bs
        self.block_hash[b] = block_hash
        self.block_fill[b] = bs
        self.block_state[b] = _CACHED
        self.slot_state[base : base + bs] = _CACHED
        self.slot_token[base : base + bs] = np.asarray(tokens[:bs], dtype=np.int32) if len(tokens) >= bs else -1
        self._mark_block(b)

    def forget(self, b: int) -> None:
        """Block ``b`` no longer cached: free, as far as the source tells."""
        bs = self.block_size
        base = b * bs
        self.block_hash[b] = NO_HASH
        self.block_fill[b] = 0
        self.block_state[b] = _FREE
        self.slot_state[base : base + bs] = _FREE
        self.slot_token[base : base + bs] = -1
        self._mark_block(b)

    # ------------------------------------------------------------------ checks
    def check_against(self, allocator, live) -> None:
        """Assert the arrays are what ``allocator``'s own state implies for the ``live``
        sequences (tests call it after every step, after the fold). O(pool)."""
        if self.num_blocks:
            self._check_paged(allocator, live)
        else:
            self._check_contiguous(allocator, live)

    def _check_paged(self, alloc, live) -> None:
        bs, blocks = self.block_size, alloc.pool.blocks
        holders: dict[int, list[int]] = {}
        for seq in live:
            table = alloc.tables.get(seq.seq_id)
            for j, b in enumerate(table or ()):
                holders.setdefault(b, []).append(seq.seq_id)
                n = min(bs, max(0, seq.num_computed - j * bs))
                got = self.slot_token[b * bs : b * bs + n].tolist()
                want = seq.token_ids[j * bs : j * bs + n]
                assert got == want, f"block {b}: slot tokens {got} != {want} of {seq}"
        for b, block in enumerate(blocks):
            base = b * bs
            ref, n = block.ref_count, alloc.fill[b]
            assert self.block_ref[b] == ref, f"block {b}: view ref {self.block_ref[b]}, allocator {ref}"
            assert self.block_hash[b] == block.block_hash, f"block {b}: view hash differs from the allocator's"
            assert self.block_fill[b] == n, f"block {b}: view fill {self.block_fill[b]}, allocator {n}"
            mine = list(self._holders.get(b, ()))
            assert sorted(mine) == sorted(holders.get(b, ())), f"block {b}: view holders {mine}, tables {holders.get(b)}"
            states = self.slot_state[base : base + bs]
            owners = self.slot_owner[base : base + bs]
            if ref == 0:
                code = _CACHED if block.block_hash != NO_HASH else _FREE
                assert (states == code).all() and self.block_state[b] == code, f"block {b}: slot states {states}"
                assert (owners == -1).all(), f"block {b}: a free block shows an owner"
                if code == _FREE:
                    assert (self.slot_token[base : base + bs] == -1).all(), f"block {b}: a free block keeps tokens"
            else:
                code = _SHARED if ref > 1 else _FILLED
                assert (states[:n] == code).all() and (states[n:] == _EMPTY).all(), f"block {b}: slot states {states}"
                assert (owners == self._owner_of[self._holders[b][0]]).all(), f"block {b}: owner"

    def _check_contiguous(self, alloc, live) -> None:
        # A free run shows FREE or FRAGMENT: a hole counted as fragmentation may show part FREE when a
        # reservation came and went inside it within one step (the allocator logs only holes that change).
        painted = getattr(alloc, "_painted", {})
        for start, length in zip(alloc.free_starts, alloc.free_lens):
            states = self.slot_state[start : start + length]
            assert np.isin(states, (_FREE, _FRAGMENT)).all(), f"free run {start}+{length}: states {np.unique(states)}"
            if painted.get(start) != length:
                assert (states == _FREE).all(), f"free run {start}+{length} is no hole, but shows FRAGMENT"
            assert (self.slot_owner[start : start + length] == -1).all()
            assert (self.slot_token[start : start + length] == -1).all()
        by_id = {s.seq_id: s for s in live}
        for sid, (start, length) in alloc.reservations.items():
            seq = by_id[sid]
            n = seq.num_computed
            assert (self.slot_state[start : start + n] == _FILLED).all()
            assert (self.slot_state[start + n : start + length] == _EMPTY).all()
            assert self.slot_token[start : start + n].tolist() == seq.token_ids[:n]
            assert (self.slot_owner[start : start + length] == seq.request.index).all()
