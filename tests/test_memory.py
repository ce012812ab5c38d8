"""Byte budgets: caches evict by bytes, oversize runs are refused with the numbers."""
from __future__ import annotations

import pytest

from pagedkv_core.config import ConfigError
from pagedkv_core.sizing.memory import BudgetError, ByteCache, check_fits, kv_pool_bytes, parse_size, session_budget


def test_cache_evicts_least_recently_used_by_bytes():
    cache = ByteCache(100)
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("c", "C", 40)  # 120 > 100: b goes, not a
    assert "b" not in cache and "a" in cache and "c" in cache and cache.used == 80


def test_cache_refuses_an_entry_larger_than_itself():
    cache = ByteCache(100, "runs of this session")
    with pytest.raises(BudgetError, match=r"needs 200 B, over the memory budget of 100 B"):
        cache.put("x", "X", 200)


def test_growing_entry_evicts_the_others_but_stays():
    cache = ByteCache(100)
    cache.put("old", 1, 30)
    cache.put("live", 2, 30)
    cache.touch("live", 90)
    assert "old" not in cache and cache.get("live") == 2 and cache.used == 90


def test_sizes_and_numbers():
    assert parse_size("64MiB") == 64 << 20 and parse_size("1.5 GB") == 1_500_000_000
    with pytest.raises(ConfigError, match="must be a size such as"):
        parse_size("lots")
    # 65,536 real-model slots plus a 16,384-slot swap pool, fp32 SmolLM2 (46,080 B a token).
    need = kv_pool_bytes(65536, 16384, 46080)
    assert need == 3_774_873_600
    with pytest.raises(BudgetError, match=r"3\.5 GiB, over the memory budget of 1\.0 GiB"):
        check_fits(need, 1 << 30, "this KV pool")


def test_budget_from_environment(monkeypatch):
    monkeypatch.setenv("PAGEDKV_SESSION_BUDGET", "300MB")
    assert session_budget() == 300_000_000
    monkeypatch.setenv("PAGEDKV_SESSION_BUDGET", "-3")
    with pytest.raises(ConfigError, match="PAGEDKV_SESSION_BUDGET must be a size"):
        session_budget()
