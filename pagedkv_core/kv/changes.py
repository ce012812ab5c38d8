"""What an allocator changed, in order: the change log a pool view folds.

An allocator keeps only what allocation needs (block tables, ref counts, the free list, fill
counts; reservations and free runs). What it changes it tells its change log, coarse-grained,
as it goes: *block b taken by sequence s of request o*, *block b filled from offset k with these
tokens*, *block b cached under hash h*, *run [a, a + n) reserved by request o*, ... A
:class:`~pagedkv_core.record.pool_view.PoolView` folds these entries into the per-slot and
per-block arrays that snapshots, recordings and heatmaps read, and names the ranges it touched.

Each entry is a tuple whose first item is its kind (the constants below). Logging is O(1) per
entry (plus the tokens written, which the step computes anyway). The blocks a sequence takes
at once (admission, growth, swap-in), lets go at once (its end, a preemption) or fills up in
one write (indexed in the prefix cache) are one entry, so is a write across many blocks (a
prefill chunk: :data:`FILLED_RUN`), and a step's plain decodes
(:meth:`ChangeLog.decoded`) are one entry for all of them. :class:`NoChangeLog` is what an
allocator gets when nothing records or snapshots the run: every call is a no-op and nothing is kept.
"""
from __future__ import annotations

# Paged: a sequence's blocks taken, let go or indexed at once; the rest one block at a time.
TAKEN = 0  # (TAKEN, blocks, seq_id, owner): free blocks now held by one sequence; empty, uncached
HELD = 1  # (HELD, b, seq_id, owner): one more sequence holds b (prefix hit, fork)
RELEASED = 2  # (RELEASED, blocks, seq_id): the sequence let the blocks go; unheld and uncached, their tokens go too
FILLED = 3  # (FILLED, b, offset, tokens): K/V of ``tokens`` written from ``offset``; fill = offset + len
COPIED = 4  # (COPIED, src, dst, n): copy-on-write: dst holds src's first n tokens
CACHED = 5  # (CACHED, blocks, hashes): blocks[i] indexed in the prefix cache under hashes[i]
UNCACHED = 6  # (UNCACHED, b): b's hash forgotten (a reset of the prefix cache); unheld: its tokens go
TABLE = 7  # (TABLE, seq_id): the sequence's block table changed (grew, was copied on write, or went)
# Contiguous: runs of slots.
RESERVED = 8  # (RESERVED, start, length, owner): a run reserved for request ``owner``, nothing written
WRITTEN = 9  # (WRITTEN, slot, tokens): K/V of ``tokens`` written from ``slot`` on
FREED = 10  # (FREED, start, length): a reservation given back
FRAGMENT = 11  # (FRAGMENT, start, length): a free run too small for the next reservation
UNFRAGMENT = 12  # (UNFRAGMENT, start, length): no longer that hole: what is free in it is plain free
FILLED_RUN = 14  # (FILLED_RUN, blocks, offset, tokens): ``tokens`` written from ``offset`` of blocks[0] on,
#                  through the blocks in order, each filled to its end but the last, each held by its writer
#                  alone (a prefill chunk across many blocks: one entry, not one a block)
# Both layouts: a step's plain decodes at once.
DECODED = 13  # (DECODED, slots, tokens): K/V of tokens[i] written at slots[i], each the next slot of its
#               sequence's own block (paged: held by it alone, not filled up by it) or reservation


class ChangeLog:
    """The entries since the last :meth:`take`, in the order they happened."""

    __slots__ = ("entries",)
    active = True

    def __init__(self) -> None:
        self.entries: list[tuple] = []

    def take(self) -> list[tuple]:
        out, self.entries = self.entries, []
        return out

    # paged ------------------------------------------------------------------------------
    def taken(self, blocks: list[int], seq_id: int, owner: int) -> None:
        self.entries.append((TAKEN, blocks, seq_id, owner))

    def held(self, b: int, seq_id: int, owner: int) -> None:
        self.entries.append((HELD, b, seq_id, owner))

    def released(self, blocks: list[int], seq_id: int) -> None:
        self.entries.append((RELEASED, blocks, seq_id))

    def filled(self, b: int, offset: int, tokens: list[int]) -> None:
        self.entries.append((FILLED, b, offset, tokens))

    def filled_run(self, blocks: list[int], offset: int, tokens: list[int]) -> None:
        self.entries.append((FILLED_RUN, blocks, offset, tokens))

    def copied(self, src: int, dst: int, n: int) -> None:
        self.entries.append((COPIED, src, dst, n))

    def cached(self, blocks: list[int], hashes: list[int]) -> None:
        self.entries.append((CACHED, blocks, hashes))

    def uncached(self, b: int) -> None:
        self.entries.append((UNCACHED, b))

    def table(self, seq_id: int) -> None:
        self.entries.append((TABLE, seq_id))

    def decoded(self, slots: list[int], tokens: list[int]) -> None:
        self.entries.append((DECODED, slots, tokens))

    # contiguous -------------------------------------------------------------------------
    def reserved(self, start: int, length: int, owner: int) -> None:
        self.entries.append((RESERVED, start, length, owner))

    def written(self, slot: int, tokens: list[int]) -> None:
        self.entries.append((WRITTEN, slot, tokens))

    def freed(self, start: int, length: int) -> None:
        self.entries.append((FREED, start, length))

    def fragment(self, start: int, length: int) -> None:
        self.entries.append((FRAGMENT, start, length))

    def unfragment(self, start: int, length: int) -> None:
        self.entries.append((UNFRAGMENT, start, length))


class NoChangeLog:
    """What an allocator keeps when nothing records or snapshots the run: nothing."""

    __slots__ = ()
    active = False

    def take(self) -> list[tuple]:
        return []

    def _nothing(self, *args) -> None:
        pass

    taken = held = released = filled = filled_run = copied = cached = uncached = table = _nothing
    reserved = written = freed = fragment = unfragment = decoded = _nothing
