"""Orca (Max) reservations placed best fit: the smallest free run that is long enough.

Best fit keeps large holes whole for large reservations, at the price of leaving slivers
behind; the block map shows both. The whole allocator is this one method.
"""
from __future__ import annotations

from .contiguous import ContiguousAllocator


class BestFitContiguousAllocator(ContiguousAllocator):
    name = "contiguous-best-fit"

    def choose_run(self, need: int) -> int | None:
        best = None
        for i, length in enumerate(self.free_lens):
            if length >= need and (best is None or length < self.free_lens[best]):
                best = i
                if length == need:
                    break
        return best
