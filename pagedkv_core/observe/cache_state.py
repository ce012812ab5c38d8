"""The cached blocks a server announced, folded from its events: a forest of prefix chains per medium.

Each block knows its parent (the block before it in the prompt that filled it; None for a chain
root), its token ids, and when it was stored and removed. The server's events say nothing about
which request holds a block, whether a block is in use or cached-free, or partial blocks (only
full blocks get a hash): this state does not guess them. A ``BlockRemoved`` for a hash never
stored, or a ``BlockStored`` whose parent is unknown (stored before we listened), is kept and
counted, not refused: :attr:`CacheState.orphans` says how many chains start from a parent we never
saw.

The same events fold into a pool view too (:class:`CacheView`, a
:class:`~pagedkv_core.record.pool_view.PoolView` that knows only what the server tells: cached
full blocks, their hashes and tokens; owners stay unknown). Give one to ``CacheState(view=...)``
and every event applied to the state is applied to the view as well.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..record.pool_view import PoolView
from .wire import AllBlocksCleared, BlockRemoved, BlockStored, signed_hash

DEFAULT_MEDIUM = "GPU"


@dataclass
class CachedBlock:
    block_hash: int
    parent: int | None
    token_ids: tuple[int, ...]
    medium: str
    stored_at: float
    removed_at: float | None = None
    stores: int = 1  # times this hash was stored (a block evicted and computed again counts twice)


@dataclass
class CacheCounts:
    stored_events: int = 0
    removed_events: int = 0
    cleared_events: int = 0
    blocks_stored: int = 0  # hashes announced, over all BlockStored events
    blocks_removed: int = 0  # hashes announced, over all BlockRemoved events
    removed_unknown: int = 0  # removals of a hash we had not seen stored


@dataclass
class CacheState:
    """Blocks by medium and hash. ``apply(event, t)`` folds one decoded event in."""

    blocks: dict[str, dict[int, CachedBlock]] = field(default_factory=dict)
    removed: list[CachedBlock] = field(default_factory=list)  # most recent last, at most ``keep_removed``
    counts: CacheCounts = field(default_factory=CacheCounts)
    block_size: int | None = None
    keep_removed: int = 10_000
    view: CacheView | None = None  # also folds every event applied here

    def apply(self, event, t: float) -> None:
        if self.view is not None:
            self.view.apply(event)
        if isinstance(event, BlockStored):
            self._stored(event, t)
        elif isinstance(event, BlockRemoved):
            self._removed(event, t)
        elif isinstance(event, AllBlocksCleared):
            self.counts.cleared_events += 1
            media = [event.medium] if event.medium else list(self.blocks)
            for medium in media:
                for block in self.blocks.pop(medium, {}).values():
                    self._retire(block, t)

    def _stored(self, event: BlockStored, t: float) -> None:
        self.counts.stored_events += 1
        self.counts.blocks_stored += len(event.block_hashes)
        self.block_size = event.block_size
        medium = event.medium or DEFAULT_MEDIUM
        table = self.blocks.setdefault(medium, {})
        parent = event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            old = table.get(h)
            if old is not None:
                old.stores += 1
            else:
                table[h] = CachedBlock(h, parent, tuple(event.block_tokens(i)), medium, t)
            parent = h

    def _removed(self, event: BlockRemoved, t: float) -> None:
        self.counts.removed_events += 1
        self.counts.blocks_removed += len(event.block_hashes)
        medium = event.medium or DEFAULT_MEDIUM
        table = self.blocks.get(medium, {})
        for h in event.block_hashes:
            block = table.pop(h, None)
            if block is None:
                self.counts.removed_unknown += 1
            else:
                self._retire(block, t)

    def _retire(self, block: CachedBlock, t: float) -> None:
        block.removed_at = t
        self.removed.append(block)
        if len(self.removed) > 2 * self.keep_removed:
            del self.removed[: len(self.removed) - self.keep_removed]

    # ------------------------------------------------------------------ queries
    def cached(self, medium: str = DEFAULT_MEDIUM) -> dict[int, CachedBlock]:
        return self.blocks.get(medium, {})

    def hashes(self, medium: str = DEFAULT_MEDIUM) -> set[int]:
        return set(self.cached(medium))

    @property
    def num_cached(self) -> int:
        return sum(len(t) for t in self.blocks.values())

    def roots(self, medium: str = DEFAULT_MEDIUM) -> list[CachedBlock]:
        """Blocks whose parent is not cached: a chain root, or a chain whose start was evicted
        (or stored before we listened)."""
        table = self.cached(medium)
        return [b for b in table.values() if b.parent is None or b.parent not in table]

    @property
    def orphans(self) -> int:
        """Cached blocks whose parent hash is named but not cached."""
        return sum(1 for t in self.blocks.values() for b in t.values() if b.parent is not None and b.parent not in t)

    def chain_tokens(self, block_hash: int, medium: str = DEFAULT_MEDIUM) -> list[int]:
        """The tokens from the chain's first cached block down to ``block_hash``, in order."""
        table = self.cached(medium)
        parts = []
        block = table.get(block_hash)
        seen = set()
        while block is not None and block.block_hash not in seen:
            seen.add(block.block_hash)
            parts.append(block.token_ids)
            block = table.get(block.parent) if block.parent is not None else None
        return [t for part in reversed(parts) for t in part]


class CacheView:
    """A server's cached blocks as a pool view: each block stored takes a display position (the
    events name no physical block id), its slots hold its tokens, state ``cached``; a removed
    block's position is freed. Blocks past ``num_blocks`` are counted in ``overflow``, not drawn.
    What the view cannot know (who holds a block, whether it is in use, partial blocks) it shows
    as unknown: ``view.knows`` lacks those fields and owners are ``UNKNOWN_OWNER``. Blocks are
    keyed by (data-parallel rank, hash): several ranks may share one display pool."""

    def __init__(self, num_blocks: int, block_size: int, medium: str = DEFAULT_MEDIUM):
        self.view = PoolView.observed(num_blocks, block_size)
        self.medium = medium
        self.overflow = 0
        self._position: dict[tuple[int, int], int] = {}  # (rank, hash) -> display block
        self._free = list(range(num_blocks - 1, -1, -1))

    def apply(self, event, rank: int = 0) -> None:
        if (getattr(event, "medium", None) or DEFAULT_MEDIUM) != self.medium:
            return
        if isinstance(event, BlockStored):
            bs = event.block_size
            for i, h in enumerate(event.block_hashes):
                self.place(rank, h, event.token_ids[i * bs:(i + 1) * bs])
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                self.forget(rank, h)
        elif isinstance(event, AllBlocksCleared):
            for r, h in [k for k in self._position if k[0] == rank]:
                self.forget(r, h)

    def place(self, rank: int, h: int, tokens) -> None:
        if (rank, h) in self._position:
            return
        if not self._free:
            self.overflow += 1
            return
        b = self._position[(rank, h)] = self._free.pop()
        self.view.place(b, signed_hash(h), tokens)

    def forget(self, rank: int, h: int) -> None:
        b = self._position.pop((rank, h), None)
        if b is not None:
            self.view.forget(b)
            self._free.append(b)

    def position(self, h: int, rank: int = 0) -> int | None:
        """The display block showing hash ``h`` (None: not cached, or past the pool)."""
        return self._position.get((rank, h))

    @property
    def num_cached(self) -> int:
        return len(self._position)
