"""Physical KV blocks, their reference counts, the free list and the prefix-cache index.

The free list is a doubly linked list threaded through the blocks themselves, so that
popping the next block, returning a block and pulling a cached block back out of the list
(a prefix-cache hit) are all O(1). Order is least recently used first: a freed block that
holds a cached (hashed) block of tokens goes to the tail and is evicted last; a freed block
without a hash holds nothing worth keeping and goes to the head, to be reused first. Which
cached block is evicted once nothing else is free is the eviction policy's choice
(:mod:`pagedkv_core.kv.eviction`): LRU takes the head, Belady the block needed furthest ahead.
"""
from __future__ import annotations

from collections.abc import Iterator

from .eviction import LruEviction
from .prefix_hash import NO_HASH


class Block:
    """One physical block of ``block_size`` slots."""

    __slots__ = ("block_id", "ref_count", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash = NO_HASH  # set once the block is full, written and registered
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.block_hash:#x})"


class FreeBlockQueue:
    """Doubly linked list of free blocks between two sentinels; the head is reused first."""

    def __init__(self, blocks: list[Block]):
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next_free
        while node is not self._tail:
            yield node
            node = node.next_free

    @staticmethod
    def contains(block: Block) -> bool:
        return block.prev_free is not None

    def first(self) -> Block:
        """The head (reused first), left in the list."""
        block = self._head.next_free
        if block is self._tail:
            raise RuntimeError("no free KV block left")
        return block

    def popleft(self) -> Block:
        block = self.first()
        self.remove(block)
        return block

    def append(self, block: Block) -> None:
        """Put ``block`` at the tail (most recently used, evicted last)."""
        last = self._tail.prev_free
        block.prev_free, block.next_free = last, self._tail
        last.next_free = block
        self._tail.prev_free = block
        self._len += 1

    def appendleft(self, block: Block) -> None:
        """Put ``block`` at the head (reused first)."""
        first = self._head.next_free
        block.prev_free, block.next_free = self._head, first
        first.prev_free = block
        self._head.next_free = block
        self._len += 1

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"block {block.block_id} is not in the free list")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1


class BlockPool:
    """All device blocks, reference counted, with the hash -> block map of the prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, kv_event_sink=None, *, eviction=None):
        """``kv_event_sink``: told ``stored(hash, parent_hash, token_ids)`` when a block is
        indexed, ``removed(hash)`` when an indexed block is evicted, ``cleared()`` when the
        index is reset (see pagedkv_core.observe.publisher.EngineKVEvents); None: nobody."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, Block] = {}
        self.eviction = LruEviction() if eviction is None else eviction  # picks the cached block to evict
        self.kv_event_sink = kv_event_sink

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references: truly free plus cached-free (evictable)."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def allocate(self) -> Block:
        """Take a free block, ref count 1: one that holds nothing while there is one, else the
        cached block the eviction policy names (LRU: the least recently used), its hash evicted."""
        block = self.free_queue.first()
        if block.block_hash != NO_HASH:  # only cached blocks are free (they sit behind the empty ones)
            block = self.eviction.victim(self.free_queue)
        self.free_queue.remove(block)
        if block.block_hash != NO_HASH:
            self._evict(block)
        block.ref_count = 1
        return block

    def touch(self, block: Block) -> None:
        """One more reference; a cached-free block leaves the free list."""
        if block.ref_count == 0:
            self.free_queue.remove(block)
            if block.block_hash != NO_HASH:
                self.eviction.reused(block)
        block.ref_count += 1

    def release(self, block: Block) -> bool:
        """One reference fewer. Returns True when the block became free (or cached-free)."""
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block.block_id} released with ref count {block.ref_count}")
        block.ref_count -= 1
        if block.ref_count:
            return False
        if block.block_hash != NO_HASH:
            self.free_queue.append(block)
            self.eviction.freed(block)
        else:
            self.free_queue.appendleft(block)
        return True

    def lookup(self, block_hash: int) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def register(self, block: Block, block_hash: int, parent_hash: int = NO_HASH, token_ids=()) -> bool:
        """Index a full, written block under ``block_hash``. A hash already indexed (another
        block holds the same history) is left as it is; returns whether ``block`` was indexed.
        ``parent_hash`` and ``token_ids`` (the block's own) are only told to the event sink."""
        if not self.enable_caching or block.block_hash != NO_HASH or block_hash in self.cached:
            return False
        self.cached[block_hash] = block
        block.block_hash = block_hash
        if self.kv_event_sink is not None:
            self.kv_event_sink.stored(block_hash, parent_hash, token_ids)
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's reset does: only when no block is in use.
        Returns whether it did."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            block.block_hash = NO_HASH
        self.cached.clear()
        if self.kv_event_sink is not None:
            self.kv_event_sink.cleared()
        return True

    def _evict(self, block: Block) -> None:
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
            if self.kv_event_sink is not None:
                self.kv_event_sink.removed(block.block_hash)
        block.block_hash = NO_HASH

    def check_invariants(self) -> None:
        seen: set[int] = set()
        for block in self.free_queue:
            assert block.block_id not in seen, f"block {block.block_id} is in the free list twice"
            seen.add(block.block_id)
            assert block.ref_count == 0, f"free block {block.block_id} has ref count {block.ref_count}"
        assert len(seen) == len(self.free_queue), "free list length is off"
        hashed = [b.block_hash != NO_HASH for b in self.free_queue]
        assert hashed == sorted(hashed), "a cached block is ahead of an empty one in the free list"
        self.eviction.check_invariants(self)
        for block in self.blocks:
            in_list = FreeBlockQueue.contains(block)
            assert in_list == (block.ref_count == 0), f"block {block.block_id}: ref {block.ref_count}, in free list {in_list}"
            if block.block_hash != NO_HASH:
                assert self.cached.get(block.block_hash) is block, f"block {block.block_id} hash not indexed"
        for h, block in self.cached.items():
            assert block.block_hash == h


class HostPool:
    """Host (CPU) blocks for swapped-out sequences: a plain stack of free block ids."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        return self._free.pop()

    def free(self, block_id: int) -> None:
        self._free.append(block_id)
