"""The paged allocator: per-sequence block tables over a shared, reference-counted pool.

Each sequence maps logical block ``j`` (positions ``j*B .. j*B+B-1``) to a physical block.
A block may be referenced by several sequences at once: the parallel samples of one request
after a fork, or any requests whose prompts share a prefix (prefix cache). Writing into a
shared block first copies it (copy-on-write). Besides the logic, the manager keeps per-slot
and per-block numpy arrays up to date as it goes, so a snapshot is a cheap copy.
"""
from __future__ import annotations

import numpy as np

from .block_pool import Block, BlockPool, HostPool
from .changes import change_log
from .protocol import Admission, Growth
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import EngineConfig
from .eviction import make_eviction
from ..events import ALLOCATE, APPEND, CACHE_HIT, COW, FORK, Event
from .prefix_hash import NO_HASH, extend_block_hashes
from ..sequence import Sequence, SequenceStatus
from ..record.slot_state import SlotState

_FREE, _FILLED, _EMPTY, _CACHED, _SHARED = (
    int(SlotState.FREE),
    int(SlotState.FILLED),
    int(SlotState.EMPTY),
    int(SlotState.CACHED),
    int(SlotState.SHARED),
)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Paged KV allocator (block tables, prefix cache, fork, copy-on-write, swap)."""

    name = "paged"
    kind = "paged"
    supports_swap = True
    supports_fork = True
    reports_fragmentation = False
    fragmented_slots = 0  # blocks need no consecutive run: no external fragmentation
    largest_free_run = 0

    def __init__(self, config: EngineConfig, max_model_len: int | None = None, track_changes: bool = True,
                 kv_event_sink=None):
        self.block_size = bs = config.block_size
        self.max_model_len = config.max_model_len if max_model_len is None else max_model_len
        self.num_blocks = nb = config.num_blocks
        self.num_slots = nb * bs
        self.enable_caching = config.prefix_caching
        self.pool = BlockPool(nb, config.prefix_caching, kv_event_sink, eviction=make_eviction(config.eviction))
        self.host = HostPool(config.num_host_blocks)
        self.num_host_slots = self.host.num_blocks * bs
        self.tables: dict[int, list[int]] = {}  # seq_id -> physical block ids
        self.host_tables: dict[int, list[int]] = {}  # seq_id -> host block ids (swapped)
        self.holders: list[list[Sequence]] = [[] for _ in range(nb)]
        self.fill = [0] * nb  # tokens written per block
        self.filled_slots = 0  # written slots in blocks that someone references
        self.hit_tokens = 0  # prefix cache, first admissions (vLLM's queries and hits)
        self.queried_tokens = 0
        self.preempted_hit_tokens = 0  # re-admissions after recompute, counted apart as vLLM does
        self.preempted_queried_tokens = 0
        self.changes = change_log(track_changes, bs)  # what a recording stores; nothing when none records
        # Display arrays, updated in place; every write marks its block in ``changes``.
        self.slot_state = np.zeros(self.num_slots, dtype=np.int8)
        self.slot_owner = np.full(self.num_slots, -1, dtype=np.int32)
        self.slot_token = np.full(self.num_slots, -1, dtype=np.int32)
        self.block_state = np.zeros(nb, dtype=np.int8)
        self.block_fill = np.zeros(nb, dtype=np.int16)

    # ------------------------------------------------------------------ read access
    @property
    def block_ref(self) -> np.ndarray:
        return self.pool.block_ref

    @property
    def block_hash(self) -> np.ndarray:
        return self.pool.block_hash

    @property
    def allocated_slots(self) -> int:
        return self.pool.num_used_blocks * self.block_size

    @property
    def kv_usage(self) -> float:
        return self.pool.num_used_blocks / self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def host_used_blocks(self) -> int:
        return self.host.num_used_blocks

    def take_changes(self):
        return self.changes.take()

    def block_table(self, seq: Sequence, context_len: int | None = None) -> list[int]:
        table = self.tables.get(seq.seq_id, [])
        if context_len is None:
            return list(table)
        return table[: cdiv(context_len, self.block_size)]

    def seq_layout(self, seqs: list[Sequence]) -> tuple[list[int], list[int] | None, list]:
        """For a snapshot, in one pass: blocks per sequence, reserved starts (None: none here)
        and the block tables (live lists: read them before the next step)."""
        get = self.tables.get
        tables = [get(s.seq_id, ()) for s in seqs]
        return [len(t) for t in tables], None, tables

    def table_view(self, seq: Sequence, context_len: int) -> list[int]:
        return self.tables[seq.seq_id][: cdiv(context_len, self.block_size)]

    def num_blocks_of(self, seq: Sequence) -> int:
        return len(self.tables.get(seq.seq_id, ()))

    def reserved_start(self, seq: Sequence) -> int:
        return -1

    def slots_for(self, seq: Sequence, start: int, count: int) -> list[int]:
        table, bs = self.tables[seq.seq_id], self.block_size
        if count == 1:
            return [table[start // bs] * bs + start % bs]
        return [table[p // bs] * bs + p % bs for p in range(start, start + count)]

    # ------------------------------------------------------------------ admission
    def rejection_reason(self, prompt_len: int, max_tokens: int, output_len: int | None = None) -> str | None:
        need = cdiv(prompt_len + 1, self.block_size)
        if need > self.num_blocks:
            return (
                f"prompt of {prompt_len} tokens plus one output token needs {need} blocks of "
                f"{self.block_size} slots, but the pool has only {self.num_blocks} blocks"
            )
        return None

    def admission_slots(self, seq: Sequence) -> int:
        return cdiv(seq.num_tokens, self.block_size) * self.block_size

    def update_fragmentation(self, next_need: int) -> None:
        """Nothing to do: any free block serves any sequence."""

    def exceeds_pool(self, seq: Sequence) -> bool:
        """True when the sequence's tokens could not fit even in an empty pool."""
        return cdiv(seq.num_tokens, self.block_size) > self.num_blocks

    def try_admit(self, seq: Sequence, reserve_blocks: int) -> Admission | None:
        """Allocate blocks for all of ``seq``'s tokens, reusing cached full blocks. Leaves at
        least ``reserve_blocks`` free (the watermark). Returns the tokens whose K/V came from
        the prefix cache and the events, or None when the pool cannot take the sequence now."""
        bs = self.block_size
        num_tokens = seq.num_tokens
        need = cdiv(num_tokens, bs)
        hits: list[Block] = []
        if self.enable_caching:
            # Always leave at least one token to compute, so that the step can sample.
            max_hits = (num_tokens - 1) // bs
            hashes = extend_block_hashes(seq.block_hashes, seq.token_ids, bs, max_hits, seq.request.extra_keys)
            lookup = self.pool.lookup
            for j in range(max_hits):
                block = lookup(hashes[j])
                if block is None:
                    break
                hits.append(block)
        num_new = need - len(hits)
        consumed = num_new + sum(1 for b in hits if b.ref_count == 0)
        if self.pool.num_free_blocks - consumed < reserve_blocks or consumed > self.pool.num_free_blocks:
            return None
        if self.enable_caching:
            self.pool.eviction.admitting(seq.request.index)  # Belady's clock
        table: list[int] = []
        for block in hits:
            self._take(seq, block)
            table.append(block.block_id)
        fresh = [self._new_block(seq) for _ in range(num_new)]
        table.extend(fresh)
        self.tables[seq.seq_id] = table
        self.changes.table(seq.seq_id)
        cached_tokens = len(hits) * bs
        if self.enable_caching:
            if seq.status == SequenceStatus.PREEMPTED:
                self.preempted_queried_tokens += num_tokens
                self.preempted_hit_tokens += cached_tokens
            else:
                self.queried_tokens += num_tokens
                self.hit_tokens += cached_tokens
        rid = seq.request.request_id
        events = [Event(CACHE_HIT, seq.seq_id, rid, {"blocks": table[: len(hits)], "tokens": cached_tokens})] if hits else []
        events.append(Event(ALLOCATE, seq.seq_id, rid, {"blocks": fresh}))
        return Admission(cached_tokens, events)

    # ------------------------------------------------------------------ growth
    def blocks_needed(self, seq: Sequence, num_tokens: int = 1) -> int:
        """Free blocks needed to write ``num_tokens`` more tokens (new blocks, plus one
        for copy-on-write when the block to write into is shared)."""
        table = self.tables[seq.seq_id]
        bs = self.block_size
        start = seq.num_computed
        j = start // bs
        new = (start + num_tokens - 1) // bs + 1 - len(table)
        if new < 0:
            new = 0
        if j < len(table) and self.pool.blocks[table[j]].ref_count > 1:
            new += 1
        return new

    def append_slots(self, seq: Sequence, num_tokens: int = 1) -> Growth:
        """Make room for ``num_tokens`` more tokens. Returns copy-on-write (src, dst) pairs and events."""
        table, bs = self.tables[seq.seq_id], self.block_size
        copies: list[tuple[int, int]] = []
        events: list[Event] = []
        rid = seq.request.request_id
        j = seq.num_computed // bs
        if j < len(table) and self.pool.blocks[table[j]].ref_count > 1:
            src = table[j]
            dst = self._new_block(seq)
            n = self.fill[src]
            self.fill[dst] = n
            self.block_fill[dst] = n
            self.filled_slots += n
            self.slot_token[dst * bs : dst * bs + n] = self.slot_token[src * bs : src * bs + n]
            table[j] = dst
            self.changes.table(seq.seq_id)
            self._drop(seq, self.pool.blocks[src])
            self._refresh(dst)
            copies.append((src, dst))
            events.append(Event(COW, seq.seq_id, rid, {"src": src, "dst": dst}))
        new = cdiv(seq.num_computed + num_tokens, bs) - len(table)
        if new > 0:
            fresh = [self._new_block(seq) for _ in range(new)]
            table.extend(fresh)
            self.changes.table(seq.seq_id)
            events.append(Event(APPEND, seq.seq_id, rid, {"blocks": fresh}))
        return Growth(copies, events)

    def mark_written(self, seq: Sequence, start: int, count: int) -> None:
        """Record that the K/V of positions [start, start + count) is now in the pool, and
        index blocks that became full in the prefix cache."""
        table, bs = self.tables[seq.seq_id], self.block_size
        tokens = seq.token_ids
        fill = self.fill
        if count == 1:  # the decode fast path
            j = start // bs
            b = table[j]
            off = start - j * bs
            if fill[b] != off or self.pool.blocks[b].ref_count != 1:
                raise RuntimeError(f"block {b}: bad write at offset {off} (fill {fill[b]})")
            slot = b * bs + off
            self.changes.block_and_slot(b, slot)
            self.slot_token[slot] = tokens[start]
            self.slot_state[slot] = _FILLED
            if off == 0:
                self.block_state[b] = _FILLED
            fill[b] = off + 1
            self.block_fill[b] = off + 1
            self.filled_slots += 1
            if off + 1 == bs and self.enable_caching:
                hashes = extend_block_hashes(seq.block_hashes, tokens, bs, j + 1, seq.request.extra_keys)
                self._register(b, hashes, j, tokens)
            return
        end = start + count
        pos = start
        while pos < end:
            j = pos // bs
            b = table[j]
            base = b * bs
            hi = min(end, (j + 1) * bs)
            lo_off, hi_off = pos - j * bs, hi - j * bs
            self.changes.block(b)
            if fill[b] != lo_off:
                raise RuntimeError(f"block {b}: writing at offset {lo_off} but {fill[b]} slots are filled")
            if self.pool.blocks[b].ref_count != 1:
                raise RuntimeError(f"block {b}: writing into a block with ref count {self.pool.blocks[b].ref_count}")
            if hi - pos == 1:
                self.slot_token[base + lo_off] = tokens[pos]
                self.slot_state[base + lo_off] = _FILLED
            else:
                self.slot_token[base + lo_off : base + hi_off] = tokens[pos:hi]
                self.slot_state[base + lo_off : base + hi_off] = _FILLED
            if lo_off == 0:
                self.block_state[b] = _FILLED
            fill[b] = hi_off
            self.block_fill[b] = hi_off
            self.filled_slots += hi - pos
            if hi_off == bs and self.enable_caching:
                hashes = extend_block_hashes(seq.block_hashes, tokens, bs, j + 1, seq.request.extra_keys)
                self._register(b, hashes, j, tokens)
            pos = hi

    def _register(self, b: int, hashes: list[int], j: int, tokens) -> None:
        """Index block ``b``, logical block ``j`` of a sequence, in the prefix cache."""
        if self.pool.kv_event_sink is None:
            self.pool.register(self.pool.blocks[b], hashes[j])
        else:
            bs = self.block_size
            self.pool.register(self.pool.blocks[b], hashes[j], hashes[j - 1] if j else NO_HASH, tokens[j * bs:(j + 1) * bs])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (only when no sequence holds a block). Returns whether it did."""
        cached = [b.block_id for b in self.pool.blocks if b.block_hash != NO_HASH]
        if not self.pool.reset_prefix_cache():
            return False
        bs = self.block_size
        for b in cached:  # now plain free blocks: nothing kept
            self.fill[b] = 0
            self.block_fill[b] = 0
            self.slot_token[b * bs : (b + 1) * bs] = -1
            self._refresh(b)
        return True

    # ------------------------------------------------------------------ sharing and release
    def fork(self, parent: Sequence, child: Sequence) -> list[Event]:
        """``child`` shares every block of ``parent`` (ref counts up); returns the event."""
        table = list(self.tables[parent.seq_id])
        for b in table:
            self._take(child, self.pool.blocks[b])
        self.tables[child.seq_id] = table
        self.changes.table(child.seq_id)
        return [Event(FORK, child.seq_id, child.request.request_id, {"parent": parent.seq_id, "blocks": list(table)})]

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, tail block first (so it is evicted first)."""
        table = self.tables.pop(seq.seq_id, None)
        self.changes.table(seq.seq_id)
        if table:
            blocks = self.pool.blocks
            for b in reversed(table):
                self._drop(seq, blocks[b])
        host = self.host_tables.pop(seq.seq_id, None)
        if host:
            for h in host:
                self.host.free(h)

    # ------------------------------------------------------------------ swap
    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """Copy the blocks holding the sequence's K/V to private host blocks and free the
        device ones. Returns (device, host) pairs, or None if the host pool is too full."""
        table = self.tables[seq.seq_id]
        num_written = cdiv(seq.num_computed, self.block_size)
        if num_written > self.host.num_free_blocks:
            return None
        pairs = [(table[j], self.host.allocate()) for j in range(num_written)]
        self.free(seq)
        self.host_tables[seq.seq_id] = [h for _, h in pairs]
        return pairs

    def can_swap_in(self, seq: Sequence, reserve_blocks: int) -> bool:
        need = cdiv(seq.num_tokens, self.block_size)
        return self.pool.num_free_blocks - need >= reserve_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Fresh private device blocks for all tokens; returns (host, device) copy pairs."""
        host = self.host_tables.pop(seq.seq_id)
        need = cdiv(seq.num_tokens, self.block_size)
        table = [self._new_block(seq) for _ in range(need)]
        self.tables[seq.seq_id] = table
        self.changes.table(seq.seq_id)
        pairs = list(zip(host, table))
        for h in host:
            self.host.free(h)
        computed = seq.num_computed
        if computed:
            self.mark_written(seq, 0, computed)
        return pairs

    # ------------------------------------------------------------------ block bookkeeping
    def _new_block(self, seq: Sequence) -> int:
        block = self.pool.allocate()
        b, bs = block.block_id, self.block_size
        self.changes.block(b)
        self.holders[b] = [seq]
        self.fill[b] = 0
        self.block_fill[b] = 0
        self.block_state[b] = _EMPTY
        base = b * bs
        self.slot_state[base : base + bs] = _EMPTY
        self.slot_owner[base : base + bs] = seq.request.index
        self.slot_token[base : base + bs] = -1
        return b

    def _take(self, seq: Sequence, block: Block) -> None:
        b = block.block_id
        was_free = block.ref_count == 0
        self.pool.touch(block)
        self.holders[b].append(seq)
        if was_free:  # a cached-free block comes back into use
            self.filled_slots += self.fill[b]
            base = b * self.block_size
            self.slot_owner[base : base + self.block_size] = seq.request.index
        self._refresh(b)

    def _drop(self, seq: Sequence, block: Block) -> None:
        b = block.block_id
        holders = self.holders[b]
        first = holders[0] is seq
        holders.remove(seq)
        base, bs = b * self.block_size, self.block_size
        if self.pool.release(block):
            self.filled_slots -= self.fill[b]
            self.slot_owner[base : base + bs] = -1
            if block.block_hash == NO_HASH:
                self.fill[b] = 0
                self.block_fill[b] = 0
                self.slot_token[base : base + bs] = -1
        elif first and holders[0].request.index != seq.request.index:
            self.slot_owner[base : base + bs] = holders[0].request.index
        self._refresh(b)

    def _refresh(self, b: int) -> None:
        """Recompute block ``b``'s state code and its slots' codes from ref, fill and hash."""
        block = self.pool.blocks[b]
        bs = self.block_size
        base = b * bs
        n = self.fill[b]
        self.changes.block(b)
        ref = block.ref_count
        if ref == 0:
            code = _CACHED if block.block_hash != NO_HASH else _FREE
            self.block_state[b] = code
            self.slot_state[base : base + bs] = code
            return
        code = _SHARED if ref > 1 else _FILLED
        self.block_state[b] = code if n else (_SHARED if ref > 1 else _EMPTY)
        self.slot_state[base : base + n] = code
        self.slot_state[base + n : base + bs] = _EMPTY

    # ------------------------------------------------------------------ checks
    def check_invariants(self, live: list[Sequence]) -> None:
        """Assert the allocator's bookkeeping is consistent with ``live`` (every sequence
        that is waiting, running or swapped)."""
        self.pool.check_invariants()
        bs, blocks = self.block_size, self.pool.blocks
        refs = [0] * self.num_blocks
        live_ids = {s.seq_id for s in live}
        assert set(self.tables) <= live_ids, "a block table outlived its sequence"
        for seq in live:
            table = self.tables.get(seq.seq_id)
            if table is None:
                assert seq.status.name != "RUNNING", f"running {seq} has no block table"
                continue
            assert len(table) >= cdiv(seq.num_computed, bs), f"{seq}: table too short"
            for j, b in enumerate(table):
                refs[b] += 1
                assert any(h is seq for h in self.holders[b]), f"{seq} not a holder of block {b}"
                expected = min(bs, max(0, seq.num_computed - j * bs))
                assert self.fill[b] == expected, f"block {b}: fill {self.fill[b]}, {seq} expects {expected}"
                got = self.slot_token[b * bs : b * bs + expected].tolist()
                want = seq.token_ids[j * bs : j * bs + expected]
                assert got == want, f"block {b}: slot tokens {got} != {want} of {seq}"
        filled = 0
        for b, block in enumerate(blocks):
            assert block.ref_count == refs[b], f"block {b}: ref count {block.ref_count} but {refs[b]} table references"
            assert len(self.holders[b]) == block.ref_count, f"block {b}: holders {len(self.holders[b])} != ref"
            assert self.block_fill[b] == self.fill[b]
            base = b * bs
            states = self.slot_state[base : base + bs]
            if block.ref_count == 0:
                if block.block_hash != NO_HASH:
                    assert self.fill[b] == bs, f"cached-free block {b} is not full"
                    assert (states == _CACHED).all() and self.block_state[b] == _CACHED
                else:
                    assert self.fill[b] == 0 and (states == _FREE).all() and self.block_state[b] == _FREE
                    assert (self.slot_token[base : base + bs] == -1).all()
                assert (self.slot_owner[base : base + bs] == -1).all()
            else:
                filled += self.fill[b]
                n = self.fill[b]
                code = _SHARED if block.ref_count > 1 else _FILLED
                assert (states[:n] == code).all() and (states[n:] == _EMPTY).all(), f"block {b}: slot states {states}"
                owner = self.holders[b][0].request.index
                assert (self.slot_owner[base : base + bs] == owner).all(), f"block {b}: owner"
        assert filled == self.filled_slots, f"filled slots {self.filled_slots} != {filled}"
        host_ids = [h for t in self.host_tables.values() for h in t]
        assert len(host_ids) == len(set(host_ids)), "a host block is used twice"
        assert len(host_ids) == self.host.num_used_blocks, "host pool accounting is off"
        for sid in self.host_tables:
            assert sid not in self.tables, f"sequence {sid} is both swapped and on the device"
