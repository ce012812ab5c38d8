"""The paged allocator: per-sequence block tables over a shared, reference-counted pool.

Each sequence maps logical block ``j`` (positions ``j*B .. j*B+B-1``) to a physical block.
A block may be referenced by several sequences at once: the parallel samples of one request
after a fork, or any requests whose prompts share a prefix (prefix cache). Writing into a
shared block first copies it (copy-on-write). The manager keeps what allocation needs (tables,
ref counts, fill counts, the free list and the prefix-cache index) and tells its change log
what it changed; a :class:`~pagedkv_core.record.pool_view.PoolView` folds that into the
arrays a snapshot shows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .block_pool import Block, BlockPool, HostPool
from .changes import NoChangeLog
from .eviction import make_eviction
from .protocol import Admission, Capabilities, Growth, Usage
from .prefix_hash import NO_HASH, extend_block_hashes
from ..events import ALLOCATE, APPEND, CACHE_HIT, COW, FORK, Event
from ..sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from ..config import EngineConfig
    from .changes import ChangeLog

NO_GROWTH = Growth((), ())
_RUN_BLOCKS = 4  # blocks one write spans from which the change log gets one entry for them all


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Paged KV allocator (block tables, prefix cache, fork, copy-on-write, swap)."""

    name = "paged"
    kind = "paged"
    capabilities = Capabilities(swap=True, fork=True, fragmentation=False)
    fragmented_slots = 0  # blocks need no consecutive run: no external fragmentation
    largest_free_run = 0

    def __init__(self, config: EngineConfig, max_model_len: int | None = None, changes: ChangeLog | None = None,
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
        self.fill = [0] * nb  # tokens written per block
        self.filled_slots = 0  # written slots in blocks that someone references
        self.hit_tokens = 0  # prefix cache, first admissions (vLLM's queries and hits)
        self.queried_tokens = 0
        self.preempted_hit_tokens = 0  # re-admissions after recompute, counted apart as vLLM does
        self.preempted_queried_tokens = 0
        self.changes = NoChangeLog() if changes is None else changes  # what a pool view folds
        # Forks so far. While none, no block with room left is shared: prefix-cache hits are full
        # blocks and everything else is private, so readers of the tails (the waste split) skip them.
        self.num_forks = 0

    # ------------------------------------------------------------------ read access
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

    def usage(self) -> Usage:
        return Usage(self.allocated_slots, self.filled_slots, self.kv_usage, self.hit_tokens, self.queried_tokens,
                     self.preempted_hit_tokens, self.preempted_queried_tokens, self.host_used_blocks, 0, 0)

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

    def ref_counts(self, block_ids) -> list[int]:
        """How many sequences hold each of ``block_ids`` (what a pool view's ``block_ref`` shows
        there, read without one)."""
        blocks = self.pool.blocks
        return [blocks[b].ref_count for b in block_ids]

    def blocks_at(self, seq_ids, block_indices) -> list[int]:
        """Block ``block_indices[i]`` of sequence ``seq_ids[i]``'s table, for each ``i``."""
        tables = self.tables
        return [tables[s][j] for s, j in zip(seq_ids, block_indices)]

    def table_view(self, seq: Sequence, context_len: int) -> list[int]:
        return self.tables[seq.seq_id][: -(-context_len // self.block_size)]

    def slots_for(self, seq: Sequence, start: int, count: int) -> list[int]:
        table, bs = self.tables[seq.seq_id], self.block_size
        j, off = divmod(start, bs)
        if count == 1:
            return [table[j] * bs + off]
        # A block at a time: the slots of positions [start, start + count) are runs within blocks.
        out: list[int] = []
        left = count
        while left > 0:
            base = table[j] * bs
            n = min(bs - off, left)
            out.extend(range(base + off, base + off + n))
            left -= n
            j, off = j + 1, 0
        return out

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
        fresh = self._new_blocks(seq, num_new)
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

    def try_append(self, seq: Sequence, num_tokens: int = 1) -> Growth | None:
        """Room for ``num_tokens`` more tokens when the free blocks allow (None: they do not)."""
        table = self.tables[seq.seq_id]
        start = seq.num_computed
        n = len(table)
        if start + num_tokens <= n * self.block_size:  # fits the blocks held: only a shared one needs work
            j = start // self.block_size
            if j >= n or self.pool.blocks[table[j]].ref_count <= 1:
                return NO_GROWTH
        need = self.blocks_needed(seq, num_tokens)
        if not need:
            return NO_GROWTH
        if need > self.pool.num_free_blocks:
            return None
        return self.append_slots(seq, num_tokens)

    def append_slots(self, seq: Sequence, num_tokens: int = 1) -> Growth:
        """Make room for ``num_tokens`` more tokens. Returns copy-on-write (src, dst) pairs and events."""
        table, bs = self.tables[seq.seq_id], self.block_size
        copies: list[tuple[int, int]] = []
        events: list[Event] = []
        rid = seq.request.request_id
        j = seq.num_computed // bs
        if j < len(table) and self.pool.blocks[table[j]].ref_count > 1:
            src = table[j]
            dst = self._new_blocks(seq, 1)[0]
            n = self.fill[src]
            self.fill[dst] = n
            self.filled_slots += n
            self.changes.copied(src, dst, n)
            table[j] = dst
            self.changes.table(seq.seq_id)
            self._drop(seq, [src])
            copies.append((src, dst))
            events.append(Event(COW, seq.seq_id, rid, {"src": src, "dst": dst}))
        new = cdiv(seq.num_computed + num_tokens, bs) - len(table)
        if new > 0:
            fresh = self._new_blocks(seq, new)
            table.extend(fresh)
            self.changes.table(seq.seq_id)
            events.append(Event(APPEND, seq.seq_id, rid, {"blocks": fresh}))
        return Growth(copies, events)

    def decode_slot(self, seq: Sequence) -> int:
        """The slot of ``seq``'s next token when it is a plain decode (see the protocol), else -1:
        the token's block is held, by ``seq`` alone, and the token does not fill it up."""
        start = seq.num_computed
        if len(seq.token_ids) - start != 1:
            return -1
        table, bs = self.tables[seq.seq_id], self.block_size
        j, off = divmod(start, bs)
        if j >= len(table) or off + 1 == bs:
            return -1
        b = table[j]
        if self.pool.blocks[b].ref_count != 1 or self.fill[b] != off:
            return -1
        return b * bs + off

    def write_decodes(self, slots, tokens, after: bool = False) -> np.ndarray | None:
        """Plain decodes at ``slots`` (from :meth:`decode_slot`; an array with ``after``): each
        block's fill moves on by one; the change log gets one entry for all of them. ``after``:
        the same block's next slot, while the token there would not fill it."""
        fill, bs = self.fill, self.block_size
        for slot in slots.tolist() if isinstance(slots, np.ndarray) else slots:
            fill[slot // bs] += 1
        self.filled_slots += len(slots)
        if self.changes.active and len(slots):
            self.changes.decoded(slots, tokens)
        if after:
            return np.where(slots % bs + 2 < bs, slots + 1, -1)
        return None

    def mark_written(self, seq: Sequence, start: int, count: int) -> None:
        """Record that the K/V of positions [start, start + count) is now in the pool, and
        index blocks that became full in the prefix cache. One pass per block touched (a
        decode touches one); a write across many blocks is one change-log entry."""
        table, bs = self.tables[seq.seq_id], self.block_size
        tokens = seq.token_ids
        fill, blocks, log = self.fill, self.pool.blocks, self.changes
        if count == 1:  # a decode
            j, off = divmod(start, bs)
            b = table[j]
            if off + 1 < bs and fill[b] == off and blocks[b].ref_count == 1:  # its block does not fill up: one slot
                if log.active:
                    log.filled(b, off, [tokens[start]])
                fill[b] = off + 1
                self.filled_slots += 1
                return
        end = start + count
        first, last = start // bs, (end - 1) // bs  # the blocks written
        hashes = None
        if self.enable_caching and end // bs > first:  # a block fills up: its hash, and those before it
            hashes = extend_block_hashes(seq.block_hashes, tokens, bs, end // bs, seq.request.extra_keys)
        run = log.active and last - first >= _RUN_BLOCKS - 1  # many blocks: one log entry for them all
        indexed: list[int] = []
        pos = start
        for j in range(first, last + 1):
            b = table[j]
            hi = min(end, (j + 1) * bs)
            lo_off, hi_off = pos - j * bs, hi - j * bs
            if fill[b] != lo_off:
                raise RuntimeError(f"block {b}: writing at offset {lo_off} but {fill[b]} slots are filled")
            if blocks[b].ref_count != 1:
                raise RuntimeError(f"block {b}: writing into a block with ref count {blocks[b].ref_count}")
            if log.active and not run:
                log.filled(b, lo_off, tokens[pos:hi])
            fill[b] = hi_off
            if hi_off == bs and hashes is not None and self._register(b, hashes, j, tokens):
                indexed.append(j)
            pos = hi
        self.filled_slots += count
        if run:
            log.filled_run(table[first : last + 1], start - first * bs, tokens[start:end])
        if indexed and log.active:
            log.cached([table[j] for j in indexed], [hashes[j] for j in indexed])

    def _register(self, b: int, hashes: list[int], j: int, tokens) -> bool:
        """Index block ``b``, logical block ``j`` of a sequence, in the prefix cache (False: a
        block with its hash is indexed already)."""
        block = self.pool.blocks[b]
        if self.pool.kv_event_sink is None:
            return self.pool.register(block, hashes[j])
        bs = self.block_size
        return self.pool.register(block, hashes[j], hashes[j - 1] if j else NO_HASH, tokens[j * bs:(j + 1) * bs])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (only when no sequence holds a block). Returns whether it did."""
        cached = [b.block_id for b in self.pool.blocks if b.block_hash != NO_HASH]
        if not self.pool.reset_prefix_cache():
            return False
        for b in cached:  # now plain free blocks: nothing kept
            self.fill[b] = 0
            self.changes.uncached(b)
        return True

    # ------------------------------------------------------------------ sharing and release
    def fork(self, parent: Sequence, child: Sequence) -> list[Event]:
        """``child`` shares every block of ``parent`` (ref counts up); returns the event."""
        self.num_forks += 1
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
            self._drop(seq, table[::-1])
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

    def swap_in(self, seq: Sequence, reserve_blocks: int = 0) -> list[tuple[int, int]] | None:
        """Fresh private device blocks for all tokens, leaving ``reserve_blocks`` free; returns
        (host, device) copy pairs, or None when the pool cannot take the sequence now."""
        if not self.can_swap_in(seq, reserve_blocks):
            return None
        host = self.host_tables.pop(seq.seq_id)
        need = cdiv(seq.num_tokens, self.block_size)
        fresh = self._new_blocks(seq, need)
        self.tables[seq.seq_id] = list(fresh)  # a table of its own: the change log keeps ``fresh``
        self.changes.table(seq.seq_id)
        pairs = list(zip(host, fresh))
        for h in host:
            self.host.free(h)
        computed = seq.num_computed
        if computed:
            self.mark_written(seq, 0, computed)
        return pairs

    # ------------------------------------------------------------------ block bookkeeping
    def _new_blocks(self, seq: Sequence, n: int) -> list[int]:
        """``n`` free blocks for ``seq``, empty (one change-log entry for all of them, which keeps
        the list returned: a caller copies it into a table rather than growing it)."""
        allocate, fill = self.pool.allocate, self.fill
        out = [allocate().block_id for _ in range(n)]
        for b in out:
            fill[b] = 0
        if out:
            self.changes.taken(out, seq.seq_id, seq.request.index)
        return out

    def _take(self, seq: Sequence, block: Block) -> None:
        b = block.block_id
        if block.ref_count == 0:  # a cached-free block comes back into use
            self.filled_slots += self.fill[b]
        self.pool.touch(block)
        self.changes.held(b, seq.seq_id, seq.request.index)

    def _drop(self, seq: Sequence, block_ids: list[int]) -> None:
        """``seq`` lets go of ``block_ids``, in that order (one change-log entry for all of them)."""
        blocks, release, fill = self.pool.blocks, self.pool.release, self.fill
        for b in block_ids:
            block = blocks[b]
            if release(block):
                self.filled_slots -= fill[b]
                if block.block_hash == NO_HASH:
                    fill[b] = 0
        self.changes.released(block_ids, seq.seq_id)

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
                expected = min(bs, max(0, seq.num_computed - j * bs))
                assert self.fill[b] == expected, f"block {b}: fill {self.fill[b]}, {seq} expects {expected}"
        filled = 0
        for b, block in enumerate(blocks):
            assert block.ref_count == refs[b], f"block {b}: ref count {block.ref_count} but {refs[b]} table references"
            if block.ref_count == 0:
                if block.block_hash != NO_HASH:
                    assert self.fill[b] == bs, f"cached-free block {b} is not full"
                else:
                    assert self.fill[b] == 0, f"free block {b} keeps a fill of {self.fill[b]}"
            else:
                filled += self.fill[b]
        assert filled == self.filled_slots, f"filled slots {self.filled_slots} != {filled}"
        host_ids = [h for t in self.host_tables.values() for h in t]
        assert len(host_ids) == len(set(host_ids)), "a host block is used twice"
        assert len(host_ids) == self.host.num_used_blocks, "host pool accounting is off"
        for sid in self.host_tables:
            assert sid not in self.tables, f"sequence {sid} is both swapped and on the device"
