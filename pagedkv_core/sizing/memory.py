"""Memory budgets: what a run may hold, caches that evict by bytes, and refusals with numbers.

A shared server must not let one visitor's choice (a 1M-slot pool, a real-model pool of many
GiB) take the machine. Everything the app keeps knows its size in bytes (a
:class:`~pagedkv_core.record.recording.Recording` has ``nbytes``; a real-model pool is
slots x bytes per token); caches hold up to a byte capacity and evict the least recently used
entries; a run that could not fit is refused up front with the numbers.

Budgets come from the environment, defaulting to a share of the machine's memory:

- ``PAGEDKV_MEMORY_BUDGET``: what the whole app process may keep (default: half of RAM);
- ``PAGEDKV_SESSION_BUDGET``: what one browser session may keep (default: a quarter of that).

Both take sizes such as ``512MiB`` or ``2GB`` (:func:`parse_size`).
"""
from __future__ import annotations

import os
from collections import OrderedDict

from ..config import ConfigError
from .kv_math import format_bytes

PROCESS_SHARE = 0.5  # of the machine's memory, for the whole app
SESSION_SHARE = 0.25  # of the process budget, for one session

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


class BudgetError(ConfigError):
    """A run or an allocation that would not fit its memory budget (one line, with numbers)."""


def parse_size(text: str, what: str = "size") -> int:
    """``"64MiB"`` -> 67108864. ConfigError (one line) for anything else."""
    t = str(text).strip().lower().replace(" ", "").replace("_", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 < value < float(1 << 60):
        raise ConfigError(f"{what} must be a size such as 64MiB or 1GB, got {text!r}")
    return int(value * _UNITS[unit])


def machine_memory_bytes() -> int:
    """Physical memory of this machine (or of the cgroup that limits this process, if smaller)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def process_budget() -> int:
    env = os.environ.get("PAGEDKV_MEMORY_BUDGET")
    return parse_size(env, "PAGEDKV_MEMORY_BUDGET") if env else int(machine_memory_bytes() * PROCESS_SHARE)


def session_budget() -> int:
    env = os.environ.get("PAGEDKV_SESSION_BUDGET")
    return parse_size(env, "PAGEDKV_SESSION_BUDGET") if env else int(process_budget() * SESSION_SHARE)


def check_fits(need: int, budget: int, what: str, *, hint: str = "") -> None:
    """BudgetError unless ``need`` bytes fit in ``budget``."""
    if need > budget:
        raise BudgetError(
            f"{what} needs {format_bytes(need)}, over the memory budget of {format_bytes(budget)}"
            + (f"; {hint}" if hint else "")
        )


def kv_pool_bytes(pool_slots: int, swap_slots: int, bytes_per_token: int) -> int:
    """Device pool plus host swap pool of a real model, before either is allocated."""
    return (int(pool_slots) + int(swap_slots)) * int(bytes_per_token)


class ByteCache:
    """An LRU map whose capacity is bytes, not entries: ``put(key, value, nbytes)``.

    An entry bigger than the whole capacity is refused (BudgetError): keeping it would evict
    everything else and still not fit. ``nbytes`` may be a callable, read when the entry is
    stored, so a value that grows (a live recording) can be re-measured with :meth:`touch`.
    """

    def __init__(self, capacity: int, what: str = "cache"):
        self.capacity = int(capacity)
        self.what = what
        self._items: OrderedDict = OrderedDict()  # key -> (value, nbytes)
        self.used = 0

    def __contains__(self, key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key, default=None):
        item = self._items.get(key)
        if item is None:
            return default
        self._items.move_to_end(key)
        return item[0]

    def put(self, key, value, nbytes: int) -> None:
        check_fits(nbytes, self.capacity, f"keeping this run ({self.what})",
                   hint="pick a smaller pool or fewer requests")
        self.pop(key)
        self._items[key] = (value, int(nbytes))
        self.used += int(nbytes)
        self._evict()

    def touch(self, key, nbytes: int) -> None:
        """``key``'s value grew (or shrank) to ``nbytes``; evict others if needed."""
        if key in self._items:
            value, old = self._items[key]
            self._items[key] = (value, int(nbytes))
            self.used += int(nbytes) - old
            self._items.move_to_end(key)
            self._evict(keep=key)

    def pop(self, key):
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.used -= item[1]
        return item[0]

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def _evict(self, keep=None) -> None:
        while self.used > self.capacity and self._items:
            oldest = next(iter(self._items))
            if oldest == keep:
                if len(self._items) == 1:
                    break
                self._items.move_to_end(oldest)
                continue
            self.pop(oldest)
