"""What an allocator changed since the last look: the dirty ranges a recording stores.

Allocators mark the slot and block ranges they write as they go; :meth:`ChangeLog.take` hands
them over and starts afresh. A range may be marked twice or cover unchanged entries (the
recording drops entries whose value did not change), but nothing that changed may go
unmarked. Marking is O(1), so a step that touches 30 slots costs about 30 slots to record.
"""
from __future__ import annotations

from typing import NamedTuple

Ranges = list[int]  # flat half-open ranges: [lo0, hi0, lo1, hi1, ...] (cheaper than tuples)


class Changes(NamedTuple):
    slots: Ranges  # slot ranges whose slot_state / slot_owner / slot_token may have changed
    blocks: Ranges  # block ranges whose block_state / ref / fill / hash may have changed
    tables: set[int]  # seq ids whose block table changed (or went)


class ChangeLog:
    __slots__ = ("_slots", "_blocks", "_tables", "slots_per_block")

    def __init__(self, slots_per_block: int = 1):
        self.slots_per_block = slots_per_block
        self._slots: Ranges = []
        self._blocks: Ranges = []
        self._tables: set[int] = set()

    def table(self, seq_id: int) -> None:
        """The block table of sequence ``seq_id`` changed (grew, was copied on write, or went)."""
        self._tables.add(seq_id)

    def slots(self, lo: int, hi: int) -> None:
        self._slots += (lo, hi)

    def block(self, b: int) -> None:
        """Block ``b`` and all of its slots."""
        bs = self.slots_per_block
        self._blocks += (b, b + 1)
        self._slots += (b * bs, b * bs + bs)

    def block_and_slot(self, b: int, slot: int) -> None:
        """Block ``b``'s own arrays and one of its slots (a decode writes one token)."""
        self._blocks += (b, b + 1)
        self._slots += (slot, slot + 1)

    def take(self) -> Changes:
        out = Changes(self._slots, self._blocks, self._tables)
        self._slots, self._blocks, self._tables = [], [], set()
        return out


class NoChangeLog:
    """What an allocator keeps when nobody records the run: nothing (every mark is a no-op)."""

    __slots__ = ()

    def table(self, seq_id: int) -> None:
        pass

    def slots(self, lo: int, hi: int) -> None:
        pass

    def block(self, b: int) -> None:
        pass

    def block_and_slot(self, b: int, slot: int) -> None:
        pass

    def take(self) -> Changes:
        return Changes([], [], set())


def change_log(track: bool, slots_per_block: int = 1) -> ChangeLog | NoChangeLog:
    return ChangeLog(slots_per_block) if track else NoChangeLog()
