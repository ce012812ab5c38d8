"""Which cached block the paged pool gives up when it needs a block and none is truly free.

The block pool keeps every free block in one list: first the blocks that hold nothing, then the
cached ones (full blocks indexed by their chained hash that no sequence uses), least recently
freed first. A new block comes from the head while the head holds nothing; once only cached
blocks are left, the pool asks its eviction policy which one to evict.

- ``lru`` (:class:`LruEviction`): the least recently freed, i.e. the list's head; vLLM's rule. A
  finished sequence frees its blocks tail first, so a prompt's shared head outlives its own tail.
- ``belady`` (:class:`BeladyEviction`): Belady's MIN, the offline optimum for a future that is
  known: the cached block whose next use lies furthest ahead, or never comes. The future is the
  workload's requests in arrival order with the chained hashes of their prompts' full blocks,
  planned by the engine from every request it holds when it takes its first step
  (:func:`plan_eviction`). A server never knows its future: Belady is a teaching yardstick ("how
  far is LRU from perfect on this traffic?"), not a serving policy.

A policy hears when a cached block joins the free list (``freed``) and when a prefix-cache hit
takes it back out (``reused``), and when a request is being admitted (``admitting``, Belady's
clock); asked for a victim, it names a cached block in the free list. It never changes the pool.
"""
from __future__ import annotations

import bisect
import heapq
import sys
from collections.abc import Iterable

from ..config import EVICTION_POLICIES
from .prefix_hash import NO_HASH, extend_block_hashes

__all__ = ["EVICTION_POLICIES", "NEVER", "LruEviction", "BeladyEviction", "make_eviction", "future_uses", "plan_eviction"]
NEVER = sys.maxsize  # the next use of a block that is never used again
_BLOCK_BITS = 21  # a use's position: request ordinal << 21 | logical block (2^21 blocks > the longest prompt)


class LruEviction:
    """Least recently freed first: the free list's own order (vLLM's rule)."""

    name = "lru"

    def freed(self, block) -> None:
        pass

    def reused(self, block) -> None:
        pass

    def admitting(self, request_index: int) -> None:
        pass

    def plan(self, future: Iterable[tuple[int, list[int]]]) -> None:
        pass

    def victim(self, free_queue):
        return free_queue.first()

    def check_invariants(self, pool) -> None:
        pass


class BeladyEviction:
    """Evict the cached block whose next use lies furthest ahead (never: first of all).

    Time is the arrival order of the workload's requests: position ``(ordinal, j)`` is logical
    block ``j`` of the ``ordinal``-th request to arrive, so of two blocks next used by the same
    request the deeper one goes first and a cached prefix never loses its head before its tail.
    The clock advances when a request is admitted for the first time; uses at or before it are
    past. Cached-free blocks sit in a max-heap of their next use with lazy deletion (a stamp per
    block), and when the clock passes a request, only the blocks that request planned to use are
    re-keyed: each step costs O(log n) per block that changed, never a scan of the pool.
    """

    name = "belady"

    def __init__(self) -> None:
        self._uses: dict[int, list[int]] = {}  # block hash -> positions of its planned uses, ascending
        self._at: list[list[int]] = []  # ordinal -> the hashes that request's prompt uses
        self._ordinal: dict[int, int] = {}  # request index -> ordinal in arrival order
        self._now = -1  # ordinals up to this one are past
        self._heap: list[tuple[int, int, int, object]] = []  # (-next use, stamp, hash, block)
        self._stamp: dict[int, int] = {}  # block id -> the stamp of its live heap entry
        self._free: dict[int, object] = {}  # hash -> the cached-free block holding it
        self._count = 0

    def plan(self, future: Iterable[tuple[int, list[int]]]) -> None:
        """``future``: (request index, its prompt's full-block hashes) in arrival order."""
        uses, at, ordinal = self._uses, self._at, self._ordinal
        for o, (index, hashes) in enumerate(future):
            ordinal[index] = o
            at.append(list(hashes))
            base = o << _BLOCK_BITS
            for j, h in enumerate(hashes):
                uses.setdefault(h, []).append(base | j)

    def next_use(self, block_hash: int) -> int:
        """The position of the block's next planned use after the clock (NEVER: none)."""
        positions = self._uses.get(block_hash)
        if not positions:
            return NEVER
        i = bisect.bisect_left(positions, (self._now + 1) << _BLOCK_BITS)
        return positions[i] if i < len(positions) else NEVER

    def _push(self, block, block_hash: int) -> None:
        self._count += 1
        self._stamp[block.block_id] = self._count
        heapq.heappush(self._heap, (-self.next_use(block_hash), self._count, block_hash, block))

    def freed(self, block) -> None:
        self._free[block.block_hash] = block
        self._push(block, block.block_hash)

    def reused(self, block) -> None:
        if self._free.get(block.block_hash) is block:
            del self._free[block.block_hash]
        self._stamp.pop(block.block_id, None)

    def admitting(self, request_index: int) -> None:
        """The clock moves to this request (a re-admission after recompute leaves it)."""
        o = self._ordinal.get(request_index)
        if o is None or o <= self._now:
            return
        passed = range(self._now + 1, o + 1)
        self._now = o
        free = self._free
        for p in passed:  # re-key the cached blocks whose planned use just became past
            for h in self._at[p]:
                block = free.get(h)
                if block is None:
                    continue
                if block.block_hash != h:  # the pool forgot the hash (a reset of the prefix cache)
                    del free[h]
                    continue
                self._push(block, h)

    def victim(self, free_queue):
        heap, stamp, free = self._heap, self._stamp, self._free
        while heap:
            _, s, h, block = heapq.heappop(heap)
            if stamp.get(block.block_id) == s and free.get(h) is block and block.block_hash == h:
                del free[h]
                del stamp[block.block_id]
                return block
        raise RuntimeError("belady eviction: no cached block is free")

    def check_invariants(self, pool) -> None:
        cached_free = {b.block_id for b in pool.free_queue if b.block_hash != NO_HASH}
        known = {b.block_id for h, b in self._free.items() if b.block_hash == h}
        assert known == cached_free, f"belady: tracks {len(known)} cached-free blocks, the pool has {len(cached_free)}"
        live = {(s, b.block_id) for _, s, _, b in self._heap}
        for bid in known:
            assert (self._stamp.get(bid), bid) in live, f"belady: block {bid} has no live heap entry"


def make_eviction(name: str):
    """A fresh policy object for ``EngineConfig.eviction``."""
    if name == "lru":
        return LruEviction()
    if name == "belady":
        return BeladyEviction()
    raise ValueError(f"eviction must be one of {', '.join(EVICTION_POLICIES)}, got {name!r}")


def future_uses(requests: Iterable, block_size: int) -> list[tuple[int, list[int]]]:
    """(request index, the chained hashes of its prompt's full blocks) for ``requests`` (engine
    :class:`~pagedkv_core.sequence.Request` objects) in arrival order: arrival step, then the
    order they were added, as the engine's queue takes them."""
    ordered = sorted(requests, key=lambda r: (r.arrival_step, r.index))
    out = []
    for r in ordered:
        prompt = r.prompt_token_ids
        try:
            hashes = extend_block_hashes([], prompt, block_size, len(prompt) // block_size, r.extra_keys)
        except (TypeError, ValueError, OverflowError):  # ids the engine will reject on arrival
            hashes = []
        out.append((r.index, hashes))
    return out


def plan_eviction(allocator, requests: Iterable) -> None:
    """Give a paged allocator's Belady policy the future of ``requests`` (the engine calls it
    before its first step); nothing for LRU, a contiguous allocator or caching off."""
    pool = getattr(allocator, "pool", None)
    if pool is None or not pool.enable_caching or not isinstance(pool.eviction, BeladyEviction):
        return
    pool.eviction.plan(future_uses(requests, allocator.block_size))
