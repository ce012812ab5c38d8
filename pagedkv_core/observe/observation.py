"""An observation of a vLLM server, recorded as a pagedkv trace, and read back.

Each observed tick is one step of an ordinary pagedkv recording (:class:`~pagedkv_core.record.trace_file.
TraceWriter` for ``--trace-out``, :class:`~pagedkv_core.record.recording.Recording` in the app), so the
player scrubs it like any run:

- the pool is a display pool of ``num_blocks`` blocks (the server's ``num_gpu_blocks`` when its
  /metrics reports it), a :class:`~.cache_state.CacheView` (a pool view that knows no owners:
  they show as ``UNKNOWN_OWNER``): each cached block the server announced takes a position, and its
  slots hold its token ids, state ``cached``; a removed block's position is freed. The positions
  are ours: vLLM's physical block ids are not in its events;
- the step's events carry the server's, whole (``kv_stored``: hashes, parent, tokens, block size,
  medium, rank, server time; ``kv_removed``; ``kv_cleared``), and an ``observed`` event with the
  wall time, so the forest of chains at any step is rebuilt by folding them (:meth:`Observation.
  state_at`);
- the step's metrics are the last /metrics scrape, in pagedkv's names: ``kv_usage`` =
  ``vllm:kv_cache_usage_perc``, ``num_running``/``num_waiting`` = ``vllm:num_requests_*``,
  ``num_preemptions``, ``prefix_hit_tokens``/``prefix_queried_tokens`` = the prefix-cache counters.

A server tells less than our engine: the header's ``observation.unknown`` lists what the view does
not know (no request owns a block here, no block is partial, no block is known to be in use), and
the page says so rather than inventing it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..events import Event
from ..metrics import StepMetrics
from ..record.snapshot import SEQ_ARRAYS
from .cache_state import DEFAULT_MEDIUM, CacheState, CacheView
from .observer import ObservedBatch
from .server_metrics import MetricsSample
from .wire import AllBlocksCleared, BlockRemoved, BlockStored

OBSERVATION_KIND = "vllm-observation"
DEFAULT_DISPLAY_BLOCKS = 4096
MAX_DISPLAY_SLOTS = 1 << 20
STORED, REMOVED, CLEARED, OBSERVED = "kv_stored", "kv_removed", "kv_cleared", "observed"
UNKNOWN = (
    "which request holds a block (the events name none)",
    "whether a cached block is in use or cached-free (both look alike here)",
    "partial blocks (only full blocks get a hash and an event)",
    "physical block ids (positions here are assigned by the observer)",
)

# A server tells no sequences: every tick records empty per-sequence arrays and queues.
NO_SEQUENCES = {**{name: np.zeros(0, dtype=dtype) for name, dtype in SEQ_ARRAYS.items()},
                "seq_table_offsets": np.zeros(1, dtype=np.int32), "seq_tables": np.zeros(0, dtype=np.int32),
                "waiting": (), "running": (), "swapped": ()}


def _event_of(e, rank: int, t: float) -> Event:
    if isinstance(e, BlockStored):
        return Event(STORED, -1, "", {"hashes": list(e.block_hashes), "parent": e.parent_block_hash,
                                      "tokens": list(e.token_ids), "block_size": e.block_size,
                                      "medium": e.medium or DEFAULT_MEDIUM, "rank": rank, "t": t})
    if isinstance(e, BlockRemoved):
        return Event(REMOVED, -1, "", {"hashes": list(e.block_hashes), "medium": e.medium or DEFAULT_MEDIUM,
                                       "rank": rank, "t": t})
    return Event(CLEARED, -1, "", {"medium": e.medium, "rank": rank, "t": t})


def _wire_of(event: Event):
    d = event.detail
    if event.kind == STORED:
        return BlockStored(list(d["hashes"]), d.get("parent"), list(d["tokens"]), int(d["block_size"]), None, d.get("medium"))
    if event.kind == REMOVED:
        return BlockRemoved(list(d["hashes"]), d.get("medium"))
    if event.kind == CLEARED:
        return AllBlocksCleared(d.get("medium"))
    return None


class ObservationRecorder:
    """Feeds an observer's batches and scrapes into ``recorder`` (a Recording or TraceWriter),
    one step per :meth:`tick`. ``num_blocks``: the display pool (default: the server's
    ``num_gpu_blocks``, else 4,096); blocks past it are counted in ``overflow``, not drawn."""

    def __init__(self, recorder, num_blocks: int | None = None, block_size: int | None = None,
                 header: dict | None = None, medium: str = DEFAULT_MEDIUM, clock=time.time):
        self.recorder = recorder
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.header = dict(header or {})
        self.medium = medium
        self.clock = clock
        self._pending: list[Event] = []
        self.metrics: MetricsSample | None = None
        self.steps = 0
        self._cache: CacheView | None = None  # the display pool, folded from the events (from the first tick)

    # ------------------------------------------------------------------ input
    def on_batch(self, batch: ObservedBatch) -> None:
        for e in batch.events:
            if isinstance(e, BlockStored) and self.block_size is None:
                self.block_size = e.block_size
            self._pending.append(_event_of(e, batch.rank, batch.t))

    def on_metrics(self, sample: MetricsSample | None) -> None:
        if sample is not None:
            self.metrics = sample
            if self.num_blocks is None and sample.num_gpu_blocks:
                self.num_blocks = sample.num_gpu_blocks

    # ------------------------------------------------------------------ steps
    def _start(self) -> None:
        bs = self.block_size or 16
        nb = max(1, min(self.num_blocks or DEFAULT_DISPLAY_BLOCKS, MAX_DISPLAY_SLOTS // bs))
        self.block_size, self.num_blocks = bs, nb
        self._cache = CacheView(nb, bs, self.medium)
        set_header = getattr(self.recorder, "set_header", None)
        if set_header is not None:
            set_header({**self.header, "observation": {"kind": OBSERVATION_KIND, "unknown": list(UNKNOWN),
                                                       "medium": self.medium}})
        view = self._cache.view  # recorded as an engine's is: the ranges its folds touched, each tick
        self.recorder.start(view.scalars(), view.arrays, step=self.steps - 1)

    @property
    def overflow(self) -> int:
        """Blocks announced while every display position was taken (counted, not drawn)."""
        return self._cache.overflow if self._cache is not None else 0

    def _fold(self, event: Event) -> None:
        d = event.detail
        if d.get("medium") not in (None, self.medium):
            return
        rank = d["rank"]
        if event.kind == STORED:
            bs = int(d["block_size"])
            for i, h in enumerate(d["hashes"]):
                self._cache.place(rank, h, d["tokens"][i * bs:(i + 1) * bs])
        elif event.kind == REMOVED:
            for h in d["hashes"]:
                self._cache.forget(rank, h)
        elif event.kind == CLEARED:
            self._cache.apply(AllBlocksCleared(self.medium), rank)

    def _metrics(self) -> StepMetrics:
        v = self.metrics.values if self.metrics else {}
        hits, queries = int(v.get("prefix_cache_hits", 0)), int(v.get("prefix_cache_queries", 0))
        return StepMetrics(kv_usage=float(v.get("kv_cache_usage_perc", 0.0)), num_running=int(v.get("num_requests_running", 0)),
                           num_waiting=int(v.get("num_requests_waiting", 0)), num_preemptions=int(v.get("num_preemptions", 0)),
                           prefix_hit_tokens=hits, prefix_queried_tokens=queries,
                           prefix_cache_hit_rate=hits / queries if queries else 0.0)

    def tick(self, t: float | None = None) -> int:
        """Record one step with what arrived since the last tick; returns its step number."""
        if self._cache is None:
            self._start()
        events, self._pending = self._pending, []
        for e in events:
            self._fold(e)
        t = self.clock() if t is None else t
        events.append(Event(OBSERVED, -1, "", {"t": t, "cached": self._cache.num_cached, "overflow": self.overflow,
                                                "metrics": self.metrics is not None}))
        step = self.steps
        self.recorder.record(step, self._cache.view.take_changes(), NO_SEQUENCES, tuple(events), self._metrics())
        self.steps += 1
        return step

    def close(self, footer: dict | None = None):
        close = getattr(self.recorder, "close", None)
        if self._cache is None:
            self.tick()
        if close is not None:
            return close(footer)
        return None


@dataclass
class Observation:
    """A recorded observation: the trace header and its Recording, with the forest rebuilt at any step."""

    header: dict
    recording: object  # pagedkv_core.record.recording.Recording

    @property
    def num_steps(self) -> int:
        return self.recording.num_steps

    def events(self, step: int) -> tuple[Event, ...]:
        return self.recording.events(step)

    def time_at(self, step: int) -> float | None:
        for e in self.events(step):
            if e.kind == OBSERVED:
                return float(e.detail["t"])
        return None

    def has_metrics(self, step: int) -> bool:
        """Whether the observation had a /metrics scrape by ``step`` (an event stream alone has none)."""
        for e in self.events(step):
            if e.kind == OBSERVED:
                return bool(e.detail.get("metrics", True))
        return False

    def state_at(self, step: int, rank: int = 0) -> CacheState:
        """The cache of ``rank`` as the server's events left it after ``step``: folded from step 0,
        or on from the step asked for last (scrubbing forward costs the steps in between). The
        state returned is shared with the next call: read it, do not change it."""
        cursor = self.__dict__.get("_cursor")
        if cursor is not None and cursor[0] == rank and cursor[1] <= step:
            _, start, state = cursor
            start += 1
        else:
            state, start = CacheState(), self.recording.first_step
        self._fold(state, start, step, rank)
        self.__dict__["_cursor"] = (rank, step, state)
        return state

    def _fold(self, state: CacheState, first: int, step: int, rank: int) -> None:
        for s in range(first, step + 1):
            t = self.time_at(s) or 0.0
            for e in self.events(s):
                wire = _wire_of(e) if e.detail.get("rank", rank) == rank else None
                if wire is not None:
                    state.apply(wire, float(e.detail.get("t", t)))

    def rates(self) -> list[dict]:
        """Per step: wall time, blocks stored and removed in it (hashes, not events). Kept: a
        recording that grows (a live observation) costs its new steps only."""
        out = self.__dict__.setdefault("_rates", [])
        for s in range(self.recording.first_step + len(out), self.recording.first_step + self.num_steps):
            stored = removed = 0
            for e in self.events(s):
                if e.kind == STORED:
                    stored += len(e.detail["hashes"])
                elif e.kind == REMOVED:
                    removed += len(e.detail["hashes"])
            out.append({"step": s, "t": self.time_at(s), "stored": stored, "removed": removed})
        return out


def is_observation(header: dict) -> bool:
    obs = header.get("observation")
    return isinstance(obs, dict) and obs.get("kind") == OBSERVATION_KIND


def load_observation(path) -> Observation:
    """A trace written by ``observe --trace-out``. TraceError (one line) when it is not one."""
    from ..record.trace_file import TraceError, load_recording

    header, recording = load_recording(path)
    if not is_observation(header):
        raise TraceError(f"{path} is a pagedkv trace, but not an observation of a vLLM server")
    return Observation(header, recording)
