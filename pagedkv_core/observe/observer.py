"""The observer: a subscriber's batches decoded and folded into cache state, plus /metrics scrapes.

    observer = Observer(Subscriber(sources), server="http://127.0.0.1:8000")
    while ...:
        observer.poll(0.2)          # never raises on bad input: it is counted
    observer.summary()              # what ``observe --json`` prints

One :class:`~.cache_state.CacheState` per data-parallel rank: the batch's own rank field when it
has one, else the rank of the endpoint it came on (0 when neither says). ``on_batch`` callbacks
(a recorder) see every batch folded in.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .cache_state import CacheState
from .server_metrics import SIGNALS, MetricsSample, ServerError, scrape
from .subscriber import Subscriber
from .wire import EVENT_TYPES, WireError, decode_batch


@dataclass
class ObservedBatch:
    t: float  # the batch's own timestamp (the server's clock)
    received: float  # when we folded it in (our clock)
    rank: int
    seq: int
    events: list
    replayed: bool


@dataclass
class ObserverCounts:
    batches: int = 0
    events: dict[str, int] = field(default_factory=lambda: {name: 0 for name in EVENT_TYPES})
    malformed_payloads: int = 0
    bad_events: int = 0
    unknown_fields: int = 0
    unknown_events: dict[str, int] = field(default_factory=dict)


class Observer:
    def __init__(self, subscriber: Subscriber | None, server: str | None = None, *, metrics_every: float = 1.0,
                 metrics_timeout: float = 5.0, clock: Callable[[], float] = time.time):
        self.subscriber = subscriber
        self.server = server.rstrip("/") if server else None
        self.metrics_every = metrics_every
        self.metrics_timeout = metrics_timeout
        self.clock = clock
        self.states: dict[int, CacheState] = {}
        self.counts = ObserverCounts()
        self.metrics: MetricsSample | None = None  # the last scrape
        self.metrics_history: list[MetricsSample] = []
        self.metrics_error: str | None = None
        self._next_scrape = 0.0
        self.on_batch: list[Callable[[ObservedBatch], None]] = []
        self.started = clock()

    # ------------------------------------------------------------------ input
    def state(self, rank: int = 0) -> CacheState:
        st = self.states.get(rank)
        if st is None:
            st = self.states[rank] = CacheState()
        return st

    def _source_rank(self, index: int) -> int:
        if self.subscriber is None:
            return 0
        rank = self.subscriber.sources[index].rank
        return index if rank is None else rank

    def handle(self, payload: bytes, rank: int = 0, seq: int = -1, replayed: bool = False) -> ObservedBatch | None:
        """Decode one payload and fold it in. Never raises on bad input: it is counted."""
        try:
            batch = decode_batch(payload)
        except WireError:
            self.counts.malformed_payloads += 1
            return None
        c = self.counts
        c.batches += 1
        c.bad_events += batch.bad_events
        c.unknown_fields += batch.unknown_fields
        for name, n in batch.unknown_events.items():
            c.unknown_events[name] = c.unknown_events.get(name, 0) + n
        if batch.data_parallel_rank is not None:
            rank = batch.data_parallel_rank
        state = self.state(rank)
        for event in batch.events:
            c.events[type(event).__name__] += 1
            state.apply(event, batch.ts)
        observed = ObservedBatch(batch.ts, self.clock(), rank, seq, batch.events, replayed)
        for callback in self.on_batch:
            callback(observed)
        return observed

    def catch_up(self) -> int:
        """Fold in what the servers' replay buffers still hold (the cache before we listened).
        Returns the number of batches."""
        n = 0
        if self.subscriber is not None:
            for got in self.subscriber.catch_up_now():
                if self.handle(got.payload, self._source_rank(got.source), got.seq, got.replayed) is not None:
                    n += 1
        return n

    def poll(self, timeout: float = 0.1) -> int:
        """Take what arrived within ``timeout`` seconds (and scrape /metrics when due).
        Returns the number of batches folded in."""
        n = 0
        if self.subscriber is not None:
            for got in self.subscriber.poll(timeout):
                if self.handle(got.payload, self._source_rank(got.source), got.seq, got.replayed) is not None:
                    n += 1
        elif timeout > 0:
            time.sleep(timeout)
        if self.server is not None and self.clock() >= self._next_scrape:
            self.scrape_metrics()
        return n

    def scrape_metrics(self) -> MetricsSample | None:
        self._next_scrape = self.clock() + self.metrics_every
        try:
            sample = scrape(self.server, self.metrics_timeout)
        except ServerError as exc:
            self.metrics_error = str(exc)
            return None
        self.metrics_error = None
        self.metrics = sample
        self.metrics_history.append(sample)
        return sample

    # ------------------------------------------------------------------ output
    @property
    def cached_blocks(self) -> int:
        return sum(s.num_cached for s in self.states.values())

    @property
    def block_size(self) -> int | None:
        return next((s.block_size for s in self.states.values() if s.block_size), None)

    def summary(self) -> dict:
        """The ``observe --json`` object."""
        sub = self.subscriber.stats if self.subscriber is not None else None
        blocks_stored = sum(s.counts.blocks_stored for s in self.states.values())
        blocks_removed = sum(s.counts.blocks_removed for s in self.states.values())
        metrics = {name: (self.metrics.get(name) if self.metrics else None) for name in SIGNALS}
        out = {
            "batches": self.counts.batches,
            "events": dict(self.counts.events),
            "blocks_stored": blocks_stored,
            "blocks_removed": blocks_removed,
            "cached_blocks": self.cached_blocks,
            "block_size": self.block_size,
            "gaps": sub.gaps if sub else 0,
            "replayed": sub.replayed if sub else 0,
            "missed": sub.missed if sub else 0,
            "before_start": sub.before_start if sub else 0,
            "malformed": (sub.malformed if sub else 0) + self.counts.malformed_payloads,
            "bad_events": self.counts.bad_events,
            "unknown_fields": self.counts.unknown_fields,
            "unknown_events": dict(self.counts.unknown_events),
            "ranks": sorted(self.states),
            "seconds": round(self.clock() - self.started, 3),
            "metrics": {
                "kv_cache_usage_perc": metrics["kv_cache_usage_perc"],
                "prefix_cache_hits": metrics["prefix_cache_hits"],
                "prefix_cache_queries": metrics["prefix_cache_queries"],
                "num_preemptions": metrics["num_preemptions"],
                "num_requests_running": metrics["num_requests_running"],
                "num_requests_waiting": metrics["num_requests_waiting"],
            },
        }
        if self.metrics_error:
            out["metrics_error"] = self.metrics_error
        return out

    def status_line(self) -> str:
        m = self.metrics.values if self.metrics else {}
        usage = m.get("kv_cache_usage_perc")
        parts = [f"{self.counts.batches} batches", f"{self.cached_blocks} blocks cached",
                 f"+{sum(s.counts.blocks_stored for s in self.states.values())}"
                 f"/-{sum(s.counts.blocks_removed for s in self.states.values())}"]
        if usage is not None:
            parts.append(f"kv usage {usage:.1%}")
        if "prefix_cache_queries" in m and m["prefix_cache_queries"]:
            parts.append(f"hits {m['prefix_cache_hits']:.0f}/{m['prefix_cache_queries']:.0f}")
        if "num_requests_running" in m:
            parts.append(f"running {m['num_requests_running']:.0f} waiting {m.get('num_requests_waiting', 0):.0f}")
        if self.subscriber is not None and self.subscriber.stats.gaps:
            parts.append(f"gaps {self.subscriber.stats.gaps}")
        return " | ".join(parts)

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.close()
