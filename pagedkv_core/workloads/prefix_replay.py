"""The ideal prefix cache: a request log's block keys replayed through a cache of a given size.

No engine, no running sequences: requests come one at a time in arrival order, each into a
cache of ``capacity`` blocks with nothing else in it, under the engine's own rules:

- a request's keys are chained (one per block, equal keys = an equal prefix up to there); it
  hits the longest cached prefix of its full blocks, but never its last token (at most
  ``(tokens - 1) // block`` blocks, as the engine and vLLM leave one token to compute);
- while it runs, all its blocks are held (hits included), each new one taking an empty block or
  else evicting a cached block that nobody holds; then its full blocks are cached (a key already
  cached keeps its place); a partial last block is not;
- when it ends its blocks are released tail first, so under LRU its head is the most recent;
- a request that needs more blocks than the cache has (prompt + one token) is rejected, as the
  engine rejects it, and counts nowhere.

Policies: ``"lru"`` (least recently released, vLLM's order), ``"belady"`` (the cached block
whose next use lies furthest ahead, or never comes: the offline optimum, a yardstick no server
can run) and ``"unbounded"`` (``capacity`` ignored: the most any cache could serve). The hit
rate is hit tokens / queried tokens, prompt tokens of admitted requests, as ``simulate --json``
reports ``prefix_cache_hit_rate``.

With a hashed log replayed at the scale where one engine block is one hash block
(``requests_from_rows``), an engine whose pool never holds two requests at once matches this
replay exactly (``tests/test_hashed_log.py``); under real load the running sequences hold part of
the pool, so the engine's cache is smaller than its pool and its hit rate lower.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REPLAY_POLICIES = ("lru", "belady", "unbounded")
_NEVER = float("inf")


@dataclass(frozen=True)
class ReplayRequest:
    keys: tuple[int, ...]  # one per block, the last one possibly partial
    num_tokens: int  # prompt tokens


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity_blocks: int | None  # None: unbounded
    block_tokens: int
    hit_tokens: int  # prompt tokens served from the cache
    queried_tokens: int  # prompt tokens of admitted requests
    requests: int  # admitted
    rejected: int  # longer than the cache

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def to_json(self) -> dict:
        return {"policy": self.policy, "capacity_blocks": self.capacity_blocks, "block_tokens": self.block_tokens,
                "hit_tokens": self.hit_tokens, "queried_tokens": self.queried_tokens, "hit_rate": self.hit_rate,
                "requests": self.requests, "rejected": self.rejected}


def requests_from_rows(rows: Iterable, block_tokens: int) -> list[ReplayRequest]:
    """Hashed-log rows (:class:`~pagedkv_core.workloads.hashed_log.HashedLogRow`) at the scale where a hash
    block is ``block_tokens`` tokens: one key per hash block, the prompt scaled as the workload
    scales it."""
    from .hashed_log import scaled_prompt_len

    return [ReplayRequest(tuple(r.hash_ids), scaled_prompt_len(r, block_tokens)) for r in rows]


def _next_uses(requests: Sequence[ReplayRequest], block_tokens: int) -> list[list[float]]:
    """For each request's full blocks, the position of the next request that uses the same key
    (one backward pass; position = (request, block) as a pair, so the deeper block of one future
    request counts as further ahead)."""
    seen: dict[int, tuple[int, int]] = {}
    out: list[list[float]] = [[] for _ in requests]
    for k in range(len(requests) - 1, -1, -1):
        r = requests[k]
        full = r.num_tokens // block_tokens
        nxt = []
        for j in range(full):
            key = r.keys[j]
            nxt.append(seen.get(key, _NEVER))
            seen[key] = (k, j)
        out[k] = nxt
    return out


class _Lru:
    def __init__(self) -> None:
        self.free: OrderedDict[int, None] = OrderedDict()  # cached, not held: least recent first

    def hold(self, key: int) -> None:
        del self.free[key]

    def release(self, key: int, k: int, j: int) -> None:
        self.free[key] = None
        self.free.move_to_end(key)

    def victim(self) -> int:
        return self.free.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self.free)


class _Belady:
    """Cached keys nobody holds in a max-heap of their next use, with lazy deletion."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []  # (-next use, order, key)
        self.live: dict[int, int] = {}  # key -> order of its valid heap entry
        self.order = 0
        self.next_of: dict[int, object] = {}  # key -> its next use, as of its last request

    def hold(self, key: int) -> None:
        del self.live[key]

    def release(self, key: int, k: int, j: int) -> None:
        self.order += 1
        self.live[key] = self.order
        nxt = self.next_of.get(key, _NEVER)
        rank = _NEVER if nxt == _NEVER else nxt[0] * (1 << 21) + nxt[1]
        heapq.heappush(self.heap, (-rank, self.order, key))

    def victim(self) -> int:
        while True:
            _, order, key = heapq.heappop(self.heap)
            if self.live.get(key) == order:
                del self.live[key]
                return key

    def __len__(self) -> int:
        return len(self.live)


def replay(requests: Sequence[ReplayRequest], block_tokens: int, capacity_blocks: int | None,
           policy: str = "lru") -> ReplayResult:
    """Replay ``requests`` in order through a cache of ``capacity_blocks`` blocks of
    ``block_tokens`` tokens under ``policy`` (see the module's rules)."""
    if policy not in REPLAY_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(REPLAY_POLICIES)}, got {policy!r}")
    if policy == "unbounded":
        capacity_blocks = None
    elif capacity_blocks is None or capacity_blocks < 1:
        raise ValueError(f"a {policy} cache needs a capacity of at least one block, got {capacity_blocks!r}")
    bt = block_tokens
    cached: set[int] = set()
    free = _Belady() if policy == "belady" else _Lru()
    nexts = _next_uses(requests, bt) if policy == "belady" else None
    hit_tokens = queried = admitted = rejected = 0
    for k, r in enumerate(requests):
        n_blocks = -(-r.num_tokens // bt)
        full = r.num_tokens // bt
        bounded = capacity_blocks is not None
        too_long = bounded and -(-(r.num_tokens + 1) // bt) > capacity_blocks
        hits = 0
        if not too_long:
            limit = (r.num_tokens - 1) // bt
            while hits < limit and r.keys[hits] in cached:
                hits += 1
            if bounded:
                for j in range(hits):
                    free.hold(r.keys[j])
        if nexts is not None:  # this request's uses are past: each key's next use is a later request's
            for j in range(full):
                key = r.keys[j]
                free.next_of[key] = nexts[k][j]
                if key in free.live:  # cached, not held: re-keyed
                    free.release(key, k, j)
        if too_long:
            rejected += 1
            continue
        admitted += 1
        queried += r.num_tokens
        hit_tokens += hits * bt
        if bounded:
            held_empty = 0  # new blocks of this request that hold no cached key yet
            for _ in range(n_blocks - hits):
                if len(cached) + held_empty >= capacity_blocks:  # no empty block: evict one
                    cached.discard(free.victim())
                held_empty += 1
        stored = []
        for j in range(hits, full):
            key = r.keys[j]
            if key not in cached:  # a key still cached elsewhere keeps its place
                cached.add(key)
                stored.append(j)
        if bounded:
            for j in sorted(set(range(hits)) | set(stored), reverse=True):  # released tail first
                free.release(r.keys[j], k, j)
    return ReplayResult(policy, capacity_blocks, bt, hit_tokens, queried, admitted, rejected)
