"""State codes of one KV slot (and, for the paged allocator, of one block).

Stored as ``int8`` in :class:`~pagedkv_core.record.snapshot.StepSnapshot` (``slot_state`` and
``block_state``). A block's code is the code of its written slots: a block that is in use
by one sequence is FILLED once any of its slots holds a token, EMPTY before that.
"""
from __future__ import annotations

from enum import IntEnum


class SlotState(IntEnum):
    FREE = 0  # not allocated, holds nothing
    FILLED = 1  # allocated to one sequence, K/V written
    EMPTY = 2  # allocated (reserved) but no K/V written yet: internal fragmentation
    CACHED = 3  # paged: K/V of a full hashed block no sequence uses; reusable until evicted
    SHARED = 4  # paged: K/V written, the block is referenced by more than one sequence
    FRAGMENT = 5  # contiguous: free, but in a hole too small for the next waiting reservation


SLOT_STATE_NAMES = {int(s): s.name.lower() for s in SlotState}
