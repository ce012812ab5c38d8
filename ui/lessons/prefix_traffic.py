"""Lesson 8, the prefix cache on real traffic: Mooncake's production conversation log (FAST'25),
whose requests carry one hash id per 512-token prompt block, on the paged engine.

Why a hit rate is low, on real traffic: the cache is too small (the capacity curve, LRU against
Belady's optimum and the unbounded bound), or the reuse is shorter than one block (the same
traffic cached in bigger blocks). The pool over time at production scale, the longest shared
prefixes and how often each is reused, and the prefill tokens the cache saved.

A window of the log keeps the page interactive: :data:`GUIDE_WINDOW` (the first 2,000
requests, about the first 11 minutes of the hour), every length scaled by 1/16 so that one
engine block of 32 tokens stands for one 512-token hash block. Capacities are said in the
log's tokens (blocks × 512). Every number on the page is computed here from the log, the
replay module (:mod:`pagedkv_core.workloads.prefix_replay`) or the engine's recorded run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from pagedkv_core.kv.prefix_hash import NO_HASH
from pagedkv_core.workloads.prefix_replay import ReplayRequest, replay, requests_from_rows
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.workloads.hashed_log import (
    MOONCAKE_CONV_LOG, HashedLogRow, hashed_log_options, hashed_log_workload, read_hashed_log,
)
from pagedkv_core.workloads.scenarios import LogOptions, Workload
from ui import export, presenter
from ui.guide import GuideStep
from ui.lesson import Export, Lesson
from ui.lesson_figures import _layout
from ui.pool_cells import CACHED_COLOR
from ui.predict import Prediction, number_text, range_options
from ui.runs.model import Run
from ui.runs.scripted import scripted_run

KEY = "ptraffic"
HASH_BLOCK = 512  # log tokens per hash id
SCALE = 16  # every length is divided by this in the engine (--length-scale 1/16)
SECONDS_PER_STEP = 0.8  # log time per engine step: 16 x 50 ms, so a request lives as long as unscaled
BLOCK_SIZE = HASH_BLOCK // SCALE  # engine tokens per block: one hash block
CAPACITIES = (512, 1024, 2048, 4096, 8192, 16384, 32768)  # cache sizes of the curve, in blocks
POOL_BLOCKS = 4096  # the engine run drawn over time: 131,072 slots = 2.1M log tokens
GROUPS = (1, 2, 4, 8)  # cache blocks of 1, 2, 4, 8 hash blocks (512 to 4,096 tokens)
LRU_COLOR, BELADY_COLOR, BOUND_COLOR, ENGINE_COLOR = "#1d4ed8", "#15803d", "#6b7280", "#c2410c"


@dataclass(frozen=True)
class Window:
    """A slice of the log: ``count`` requests from request ``start`` (0-based, arrival order)."""

    start: int
    count: int

    @property
    def label(self) -> str:
        return f"requests {self.start + 1:,}-{self.start + self.count:,}"


GUIDE_WINDOW = Window(0, 2000)
WINDOWS = (GUIDE_WINDOW, Window(0, 1000), Window(4000, 2000))


def tokens_text(tokens: float) -> str:
    """Log tokens, short: 262k, 2.1M, 16.8M."""
    if tokens >= 1e6:
        return f"{tokens / 1e6:.1f}M"
    if tokens >= 1e3:
        return f"{tokens / 1e3:.0f}k"
    return f"{tokens:.0f}"


def blocks_text(blocks: int) -> str:
    return f"{tokens_text(blocks * HASH_BLOCK)} tokens"


# ---------------------------------------------------------------------------- the log
PAPER_FIGURE_9 = ((1_000_000, 0.09), (2_000_000, 0.12), (5_000_000, 0.25), (10_000_000, 0.33), (50_000_000, 0.40))


@st.cache_resource(show_spinner=False, max_entries=8)
def log_rows(start: int, count: int) -> list[HashedLogRow]:
    """The shipped log's requests ``start`` .. ``start + count - 1`` (once per process)."""
    return read_hashed_log(MOONCAKE_CONV_LOG, start, count)


def log_options(start: int, count: int) -> LogOptions:
    return hashed_log_options(start=start, count=count, length_scale=1 / SCALE, seconds_per_step=SECONDS_PER_STEP)


@st.cache_resource(show_spinner=False, max_entries=8)
def log_workload(start: int, count: int) -> Workload:
    """The window as an engine workload: prompts made from the hash ids, every length / SCALE."""
    return hashed_log_workload(log_rows(start, count), MOONCAKE_CONV_LOG.name, log_options(start, count),
                               name=f"mooncake-conversation {start + 1}-{start + count}")


def coarsened(requests: list[ReplayRequest], k: int) -> list[ReplayRequest]:
    """The same requests cached in blocks of ``k`` hash blocks: a block's key is the chained id of
    its last hash block (so equal keys still mean an equal prefix). A block is cached only when
    its ``k`` hash blocks are all there and full (the replay caches full blocks only)."""
    if k == 1:
        return list(requests)
    return [ReplayRequest(tuple(r.keys[min(len(r.keys), g + k) - 1] for g in range(0, len(r.keys), k)), r.num_tokens)
            for r in requests]


@st.cache_resource(show_spinner=False, max_entries=8)
def replay_requests(start: int, count: int) -> list[ReplayRequest]:
    """The window's requests for the replay module, at the engine's scale (one key per block of 32)."""
    return requests_from_rows(log_rows(start, count), BLOCK_SIZE)


def replay_rate(requests: list[ReplayRequest], capacity: int | None, policy: str, k: int = 1) -> float:
    """Hit rate of the replay module with ``capacity`` blocks of ``k`` hash blocks (None: unbounded)."""
    return replay(requests, k * BLOCK_SIZE, capacity, policy if capacity is not None else "unbounded").hit_rate


# ---------------------------------------------------------------------------- the numbers
@dataclass(frozen=True)
class SharedPrefix:
    """A prefix that more than one request of the window starts with (the chain through one hash id)."""

    hash_id: int
    blocks: int  # hash blocks in the prefix
    tokens: int  # log tokens it covers
    requests: int  # requests of the window that start with it
    first: int  # the first of them (0-based, in the window)

    @property
    def reuses(self) -> int:
        return self.requests - 1


def shared_prefixes(rows) -> tuple[list[SharedPrefix], list[SharedPrefix]]:
    """(the maximal shared prefixes: shared, and no longer shared prefix extends them; every
    shared prefix), from the rows' hash ids. Ids are chained, so one id names one prefix."""
    count: dict[int, int] = {}
    where: dict[int, tuple[int, int, int]] = {}  # id -> (depth, tokens, first request)
    for i, r in enumerate(rows):
        for j, h in enumerate(r.hash_ids):
            count[h] = count.get(h, 0) + 1
            if h not in where:
                where[h] = (j + 1, min((j + 1) * HASH_BLOCK, r.prompt_len), i)
    shared = {h for h, c in count.items() if c > 1}
    extended = set()
    for r in rows:
        ids = r.hash_ids
        for a, b in zip(ids, ids[1:]):
            if b in shared:
                extended.add(a)
    every = [SharedPrefix(h, *where[h][:2], count[h], where[h][2]) for h in shared]
    maximal = [p for p in every if p.hash_id not in extended]
    return maximal, every


@dataclass(frozen=True)
class Curve:
    """Hit rates against cache capacity (blocks of one hash block), from the replay module."""

    capacities: tuple[int, ...]
    lru: tuple[float, ...]
    belady: tuple[float, ...]
    unbounded: float


@st.cache_data(show_spinner=False, max_entries=8)
def capacity_curve(window: Window, capacities: tuple[int, ...] = CAPACITIES) -> Curve:
    reqs = replay_requests(window.start, window.count)
    lru = tuple(replay_rate(reqs, cap, "lru") for cap in capacities)
    belady = tuple(replay_rate(reqs, cap, "belady") for cap in capacities)
    return Curve(tuple(capacities), lru, belady, replay_rate(reqs, None, "unbounded"))


@st.cache_data(show_spinner=False, max_entries=8)
def granularity(window: Window, capacity: int, groups: tuple[int, ...] = GROUPS) -> dict[int, tuple[float, float]]:
    """Per cache-block size (in hash blocks): (LRU hit rate with ``capacity`` hash blocks of
    room, unbounded hit rate). A block of k hash blocks is cached only when all k are full and
    is found only when all k match: a shared run shorter than a block is never hashed."""
    reqs = replay_requests(window.start, window.count)
    out = {}
    for k in groups:
        coarse = coarsened(reqs, k)
        out[k] = (replay_rate(coarse, capacity // k, "lru", k), replay_rate(coarse, None, "unbounded", k))
    return out


def engine_run(window: Window, pool_blocks: int = POOL_BLOCKS, eviction: str = "lru") -> Run:
    """The window on the paged engine (scripted tokens from the hash ids), recorded, cached per process."""
    workload = log_workload(window.start, window.count)
    config = EngineConfig(pool_slots=pool_blocks * BLOCK_SIZE, block_size=BLOCK_SIZE, eviction=eviction)
    return scripted_run(config, workload, f"paged, {eviction.upper() if eviction == 'lru' else 'Belady'}")


@dataclass
class TrafficView:
    """Everything the page shows for one window."""

    window: Window
    rows: list
    curve: Curve
    run: Run
    maximal: list[SharedPrefix]
    every: list[SharedPrefix]
    groups: dict[int, tuple[float, float]]

    @property
    def pool_blocks(self) -> int:
        return self.run.config.pool_slots // BLOCK_SIZE

    @property
    def minutes(self) -> float:
        ts = [r.time_s for r in self.rows]
        return (max(ts) - min(ts)) / 60

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.rows)

    def metric(self, name: str) -> list:
        return self.run.metric(name)

    def engine_hit_rate(self) -> float:
        m = self.run.at(self.run.num_steps - 1).metrics
        return m.prefix_hit_tokens / m.prefix_queried_tokens if m.prefix_queried_tokens else 0.0

    def engine_hit_tokens(self) -> int:
        """Prompt tokens the engine took from its cache, in the log's tokens."""
        return int(self.run.at(self.run.num_steps - 1).metrics.prefix_hit_tokens) * SCALE

    def replay_at_pool(self) -> float:
        return self.curve.lru[self.curve.capacities.index(self.pool_blocks)]

    def full_step(self) -> int:
        """The first step at which less than 2% of the pool is free (never-used or evicted blocks
        aside from the cached ones): from then on each new block evicts a cached one. The last
        step when the pool never fills."""
        from pagedkv_core.record.slot_state import SlotState

        limit = 0.02 * self.run.config.pool_slots
        step = self.run.first(lambda snap: np.count_nonzero(snap.slot_state == SlotState.FREE) < limit)
        return self.run.num_steps - 1 if step is None else step

    def pool_counts(self, step: int) -> dict[str, int]:
        """Blocks at ``step``: held by running sequences, cached and unused, free."""
        snap = self.run.at(step)
        held = int(np.count_nonzero(snap.block_ref > 0))
        cached = int(np.count_nonzero((snap.block_ref == 0) & (snap.block_hash != NO_HASH)))
        return {"held": held, "cached": cached, "free": len(snap.block_ref) - held - cached}

    def once_share(self) -> float:
        """Share of the window's distinct hash blocks that only one request uses."""
        seen: dict[int, int] = {}
        for r in self.rows:
            for h in r.hash_ids:
                seen[h] = seen.get(h, 0) + 1
        return sum(1 for c in seen.values() if c == 1) / max(1, len(seen))

    def running_share(self) -> float:
        """Mean share of the pool held by running sequences (allocated slots / pool), over the run."""
        usage = [v for v in self.metric("kv_usage") if v is not None]
        return float(np.mean(usage)) if usage else 0.0


def view(window: Window = GUIDE_WINDOW, pool_blocks: int = POOL_BLOCKS, eviction: str = "lru") -> TrafficView:
    rows = log_rows(window.start, window.count)
    maximal, every = shared_prefixes(rows)
    return TrafficView(window, rows, capacity_curve(window), engine_run(window, pool_blocks, eviction), maximal, every,
                       granularity(window, pool_blocks))


# ---------------------------------------------------------------------------- figures
def capacity_figure(v: TrafficView, *, hide: bool = False, paper: bool = False) -> go.Figure:
    """Hit rate against capacity: LRU and Belady replays, the unbounded bound, the engine's point."""
    c = v.curve
    xs = [cap * HASH_BLOCK for cap in c.capacities]
    fig = go.Figure()
    if not hide:
        fig.add_trace(go.Scatter(x=xs, y=list(c.lru), name="LRU (vLLM's eviction)", mode="lines+markers+text",
                                 line=dict(color=LRU_COLOR, width=2.5), text=[f"{y:.0%}" for y in c.lru],
                                 textposition="bottom right", textfont=dict(size=11, color=LRU_COLOR)))
        fig.add_trace(go.Scatter(x=xs, y=list(c.belady), name="Belady (the offline optimum)", mode="lines+markers+text",
                                 line=dict(color=BELADY_COLOR, width=2.5, dash="dot"), text=[f"{y:.0%}" for y in c.belady],
                                 textposition="top left", textfont=dict(size=11, color=BELADY_COLOR)))
        fig.add_hline(y=c.unbounded, line_dash="dash", line_color=BOUND_COLOR,
                      annotation_text=f"a cache that never evicts: {c.unbounded:.0%}", annotation_position="top left",
                      annotation_font=dict(size=12, color="#374151"))
        fig.add_trace(go.Scatter(x=[v.pool_blocks * HASH_BLOCK], y=[v.engine_hit_rate()], mode="markers",
                                 name=f"the engine's run ({blocks_text(v.pool_blocks)} pool)", marker=dict(color=ENGINE_COLOR, size=12, symbol="diamond")))
        if paper:
            px, py = zip(*PAPER_FIGURE_9)
            fig.add_trace(go.Scatter(x=list(px), y=list(py), name="the paper's Figure 9 (whole log)", mode="markers",
                                     marker=dict(color="#7c3aed", size=9, symbol="x")))
    else:
        fig.add_annotation(text="Answer the prediction above to see the curve.", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=14, color="#6b7280"))
    hi = max(xs + ([t for t, _ in PAPER_FIGURE_9] if paper and not hide else []))
    fig.update_xaxes(type="log", title_text="cache capacity (log tokens; blocks of 512)", tickvals=xs,
                     ticktext=[tokens_text(x) for x in xs], range=[math.log10(min(xs)) - 0.08, math.log10(hi) + 0.08])
    fig.update_yaxes(title_text="hit rate (prompt tokens)", tickformat=".0%", rangemode="tozero",
                     range=[0, max(0.45, c.unbounded * 1.25)])
    fig = _layout(fig, f"Hit rate against cache size ({v.window.label})", 380, legend=True,
                  margin=dict(l=70, r=20, t=50, b=110))
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0))
    return fig


def prefixes_figure(v: TrafficView) -> go.Figure:
    """Every maximal shared prefix: its length against the requests that start with it."""
    ps = v.maximal
    fig = go.Figure(go.Scatter(
        x=[p.tokens for p in ps], y=[p.requests for p in ps], mode="markers",
        marker=dict(size=7, color="#1d4ed8", opacity=0.45),
        customdata=[[p.blocks, p.reuses, p.first + 1] for p in ps],
        hovertemplate="%{x:,} tokens (%{customdata[0]} blocks of 512)<br>%{y} requests start with it "
                      "(%{customdata[1]} reuses)<br>first: request %{customdata[2]}<extra></extra>"))
    top = max(v.every, key=lambda p: p.requests, default=None)
    if top is not None:
        fig.add_trace(go.Scatter(x=[top.tokens], y=[top.requests], mode="markers+text", marker=dict(size=11, color="#c2410c"),
                                 text=[f"the first block: {top.requests:,} requests"], textposition="middle right",
                                 hoverinfo="skip"))
    xt = [512, 1024, 2048, 5120, 10240, 20480, 51200, 102400, 204800]
    yt = [2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    fig.update_xaxes(type="log", title_text="shared prefix length (log tokens)", tickvals=xt,
                     ticktext=[tokens_text(x) for x in xt], showgrid=True, gridcolor="#eef0f3")
    fig.update_yaxes(type="log", title_text="requests that start with it", tickvals=yt, ticktext=[f"{y:,}" for y in yt],
                     showgrid=True, gridcolor="#eef0f3")
    return _layout(fig, f"Shared prefixes in the window: {len(v.maximal):,} distinct, longest "
                        f"{max((p.tokens for p in v.maximal), default=0):,} tokens", 340)


def saved_figure(v: TrafficView, upto: int | None = None) -> go.Figure:
    """Cumulative prompt tokens over the run: queried, served from the cache (log tokens)."""
    queried = [q * SCALE for q in v.metric("prefix_queried_tokens")]
    hits = [h * SCALE for h in v.metric("prefix_hit_tokens")]
    n = len(queried) if upto is None else upto + 1
    xs = list(range(n))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=queried[:n], name="prompt tokens of admitted requests", mode="lines",
                             line=dict(color="#374151", width=2)))
    fig.add_trace(go.Scatter(x=xs, y=hits[:n], name="served from the prefix cache (prefill skipped)", mode="lines",
                             fill="tozeroy", line=dict(color=LRU_COLOR, width=2)))
    fig.update_xaxes(title_text="engine step", range=[0, max(1, len(queried) - 1)])
    fig.update_yaxes(title_text="log tokens (cumulative)", rangemode="tozero")
    fig = _layout(fig, "Prefill tokens saved by the cache", 320, legend=True, margin=dict(l=70, r=20, t=50, b=90))
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0))
    return fig


def granularity_figure(v: TrafficView, *, hide: bool = False) -> go.Figure:
    """Hit rate against the cache block's size, the same traffic, at the pool's capacity and unbounded."""
    ks = list(v.groups)
    labels = [f"{k * HASH_BLOCK:,}" for k in ks]
    fig = go.Figure()
    if not hide:
        at = [v.groups[k][0] for k in ks]
        unb = [v.groups[k][1] for k in ks]
        fig.add_trace(go.Bar(x=labels, y=at, name=f"LRU, {blocks_text(v.pool_blocks)} of cache", marker_color=LRU_COLOR,
                             text=[f"{y:.1%}" for y in at], textposition="outside"))
        fig.add_trace(go.Bar(x=labels, y=unb, name="a cache that never evicts", marker_color=BOUND_COLOR,
                             text=[f"{y:.1%}" for y in unb], textposition="outside"))
    else:
        fig.add_annotation(text="Answer the prediction above to see the bars.", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=14, color="#6b7280"))
        fig.add_trace(go.Bar(x=labels, y=[0] * len(ks), showlegend=False))
    fig.update_xaxes(title_text="cache block size (log tokens)", type="category")
    fig.update_yaxes(title_text="hit rate", tickformat=".0%", rangemode="tozero",
                     range=[0, max(0.05, max((u for _, u in v.groups.values()), default=0) * 1.25)])
    fig = _layout(fig, "The same traffic in bigger blocks", 340, legend=True, margin=dict(l=70, r=20, t=50, b=100))
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0), barmode="group")
    return fig


def prefix_tables(v: TrafficView, n: int = 8) -> tuple[list[dict], list[dict]]:
    """(the longest shared prefixes, the most reused), as table rows."""
    def row(p: SharedPrefix) -> dict:
        return {"shared prefix (tokens)": p.tokens, "blocks of 512": p.blocks, "requests starting with it": p.requests,
                "reuses": p.reuses, "first request": p.first + 1 + v.window.start,
                "prefill tokens it can save": p.reuses * p.tokens}
    longest = sorted(v.maximal, key=lambda p: (-p.tokens, -p.requests))[:n]
    most = sorted(v.every, key=lambda p: (-p.requests, -p.tokens))[:n]
    return [row(p) for p in longest], [row(p) for p in most]


def pool_figure_title(v: TrafficView, step: int) -> str:
    m = v.run.at(step).metrics
    return (f"The pool at step {step} of {v.run.num_steps - 1}: {v.pool_blocks:,} blocks of {BLOCK_SIZE} "
            f"({blocks_text(v.pool_blocks)} of the log), {m.num_running} running, hit rate so far "
            f"{m.prefix_hit_tokens / m.prefix_queried_tokens if m.prefix_queried_tokens else 0:.1%}")


def pool_heatmap(v: TrafficView, step: int, *, key: str, height: int = 420):
    from ui import pool_view

    snap = v.run.at(step)
    return pool_view.pool_chart(snap, v.run.request_ids, pool_figure_title(v, step), key=key, height=height)


# ---------------------------------------------------------------------------- the guide
UNBOUNDED_RANGES = [("under 20%", 0.2), ("20% to 40%", 0.4), ("40% to 60%", 0.6), ("over 60%", float("inf"))]
BIG_BLOCK = 4  # hash blocks per cache block in the third question: 2,048 tokens
RATIO_RANGES = [("less than half as much", 0.5), ("between half and 90% as much", 0.9), ("about the same", 1.1),
                ("more", float("inf"))]


def guide_steps(v: TrafficView) -> list[GuideStep]:
    """The walkthrough of :data:`GUIDE_WINDOW`; every number is read off the log, the replay or
    the run. ``show``: ``figure`` (prefixes, pool, saved, curve, blocks), ``step`` (the pool's),
    ``hide`` (the figure's data while its prediction is open)."""
    c = v.curve
    n = len(v.rows)
    mean_prompt = v.prompt_tokens / n
    longest = max(v.maximal, key=lambda p: (p.tokens, p.requests))
    top = max(v.every, key=lambda p: (p.requests, p.tokens))
    everyone = f"all {n:,}" if top.requests == n else f"{top.requests:,} of the {n:,}"
    pool = blocks_text(v.pool_blocks)
    rate = v.engine_hit_rate()
    full = v.full_step()
    at_full = v.pool_counts(full)
    first_hit = next((i for i, h in enumerate(v.metric("prefix_hit_tokens")) if h), 0)
    at_pool = v.replay_at_pool()
    i_pool = c.capacities.index(v.pool_blocks)
    small, large = c.capacities[0], c.capacities[-1]
    q = v.run.at(v.run.num_steps - 1).metrics
    big, one = v.groups[BIG_BLOCK][0], v.groups[1][0]
    ratio = big / one if one else 1.0
    head_share = top.tokens * top.requests / v.prompt_tokens
    return [
        GuideStep("Real traffic", (
            f"Mooncake's conversation log (Kimi's production service): this window holds {n:,} requests, "
            f"{v.minutes:.0f} minutes of traffic, with prompts of {mean_prompt:,.0f} tokens on average. The log gives "
            "no text, but one hash id per 512-token prompt block, chained: two requests whose first k ids are equal "
            f"share their first k × 512 tokens. The engine replays them with every length ÷ {SCALE}, so one block of "
            f"{BLOCK_SIZE} tokens stands for one hash block."), {"figure": "prefixes"}),
        GuideStep("Shared prefixes", (
            f"{len(v.maximal):,} distinct prefixes are shared by two or more requests. The longest runs {longest.tokens:,} "
            f"tokens ({longest.blocks} blocks) and {longest.requests} requests start with it, most likely a long "
            f"conversation's history reused by its next turn. The most reused is the first block: {everyone} requests start with the "
            f"same {top.tokens} tokens, a system prompt."), {"figure": "prefixes"}),
        GuideStep("A cache of " + pool, (
            f"The engine's pool holds {v.pool_blocks:,} blocks: {pool} of the log, a production GPU's worth. "
            f"Step {first_hit}: the first cache hit. The requests keep arriving at their recorded times."),
            {"figure": "pool", "step": first_hit},
            predict=Prediction(
                "ptraffic_hit_pool", f"Predict: what share of the window's prompt tokens (in %) will this "
                f"{pool.replace(' tokens', '-token')} cache serve?", round(100 * rate, 1),
                f"The engine served {rate:.1%} of the prompt tokens from its cache. The first block alone is "
                f"{head_share:.1%} of all prompt tokens; conversations come back too late for a cache this size to "
                f"still hold them.", tolerance=5, unit="%"),
            reveal={"step": full}),
        GuideStep("The pool over time", (
            f"Step {full}: the pool is full. {at_full['held']:,} blocks belong to the {v.run.at(full).metrics.num_running} "
            f"running sequences (coloured) and {at_full['cached']:,} are cached (pale blue): their requests have "
            "finished and the blocks keep their hashes until the pool needs the room. From now on every new block "
            f"evicts a cached one, the least recently freed first (LRU). Over the run, running sequences hold "
            f"{v.running_share():.0%} of the pool on average: blocks that cannot be evicted (their prompt blocks are "
            "hashed too, so another request can still hit them)."),
            {"figure": "pool", "step": full}),
        GuideStep("Prefill saved", (
            f"By the end the engine took {q.prefix_hit_tokens * SCALE:,} of {q.prefix_queried_tokens * SCALE:,} prompt "
            f"tokens from its cache ({rate:.1%}): prefill that never ran. The ideal LRU replay of the hash ids, a cache of "
            f"the same size with nothing else in it, gets {at_pool:.1%}"
            + (": the running sequences' blocks are the most recent ones, which LRU would keep anyway, so sharing the "
               "pool with them costs it little." if abs(at_pool - rate) < 0.02 else
               f": the running sequences hold {v.running_share():.0%} of the pool, room the ideal cache has for itself.")),
            {"figure": "saved"}),
        GuideStep("How big must it be?", (
            f"The replay module runs the same hash ids through caches from {blocks_text(small)} to {blocks_text(large)}, "
            "with LRU and with Belady's optimum."), {"figure": "curve", "hide": True},
            predict=Prediction(
                "ptraffic_unbounded", "Predict: with a cache that never evicts anything, what share of the window's "
                "prompt tokens could come from the cache?",
                why=f"{c.unbounded:.1%}: every block seen before is a hit, and that is all the reuse this traffic has. "
                "The rest is new text: new conversations, and each turn's new messages.",
                source="Measured by the replay", **range_options(c.unbounded, UNBOUNDED_RANGES)),
            reveal={"hide": False}),
        GuideStep("Too small: LRU against Belady", (
            f"At {pool}: LRU {c.lru[i_pool]:.1%}, Belady {c.belady[i_pool]:.1%}, no limit {c.unbounded:.1%}. "
            f"{v.once_share():.0%} of the window's blocks are never used again, and LRU keeps each of them as long as "
            "a block that will come back. Belady evicts the block needed furthest ahead, a never-used one first; no "
            "server knows the future, so it is a yardstick for how far LRU is from perfect, not a policy. LRU climbs "
            f"from {c.lru[0]:.1%} at {blocks_text(small)} (the shared first block alone is {head_share:.1%} of the "
            f"prompt tokens) to {c.lru[-1]:.1%} at {blocks_text(large)}."),
            {"figure": "curve"}),
        GuideStep("Shorter than a block", (
            "The second reason a hit rate is low: a block is cached only when it is full and found only when all of it "
            f"matches. Now the same traffic and the same {pool.replace(' tokens', '-token')} cache in blocks of {BIG_BLOCK * HASH_BLOCK:,} tokens "
            "instead of 512."), {"figure": "blocks", "hide": True},
            predict=Prediction(
                "ptraffic_big_blocks", f"Predict: in blocks of {BIG_BLOCK * HASH_BLOCK:,} tokens, the same cache will serve…",
                why=f"{big:.1%} instead of {one:.1%}: the {top.tokens}-token system prompt that every request shares is "
                f"shorter than one block of {BIG_BLOCK * HASH_BLOCK:,}, so it is never hashed on its own; a conversation "
                "shares only its whole blocks.", source="Measured by the replay",
                **range_options(ratio, RATIO_RANGES)),
            reveal={"hide": False}),
        GuideStep("Why is my hit rate low?", (
            f"Two reasons. The cache is too small for how late the reuse comes back: LRU {c.lru[i_pool]:.0%} at {pool}, "
            f"{c.unbounded:.0%} with no limit; Belady's {c.belady[i_pool]:.0%} is how much of that a better eviction "
            "order could win back, a bigger cache wins the rest. Or the reuse is shorter than a block: a shared system "
            "prompt smaller than the block size is never a hit, the question vLLM's issue tracker hears most."),
            {"figure": "curve"}),
    ]


def figure_for(v: TrafficView, show: dict) -> go.Figure | None:
    """The step's one figure (None for the pool, which pool_view draws)."""
    which = show.get("figure", "curve")
    if which == "prefixes":
        return prefixes_figure(v)
    if which == "saved":
        return saved_figure(v)
    if which == "curve":
        return capacity_figure(v, hide=bool(show.get("hide")))
    if which == "blocks":
        return granularity_figure(v, hide=bool(show.get("hide")))
    return None


def slide(v: TrafficView, show: dict) -> None:
    """Presenter mode: the step's one figure."""
    fig = figure_for(v, show)
    if fig is None:
        pool_heatmap(v, int(show.get("step", 0)), key=f"{KEY}_slide_pool",
                     height=presenter.slide_height(caption_lines=2))  # the slots of each state under it
        return
    presenter.slide(fig, KEY)


def guided(v: TrafficView, show: dict) -> None:
    """Guide mode, not presenting: the step's figure at full size, with its table when it has one."""
    fig = figure_for(v, show)
    if fig is None:
        pool_heatmap(v, int(show.get("step", 0)), key=f"{KEY}_pool")
        return
    st.plotly_chart(fig, width="stretch", key=f"{KEY}_{show.get('figure')}", config=export.png_config(f"{KEY}-{show.get('figure')}"))
    if show.get("figure") == "prefixes":
        longest, _ = prefix_tables(v)
        st.dataframe(longest, hide_index=True, width="stretch")


# ---------------------------------------------------------------------------- explore
def explore_settings() -> tuple[Window, int, str]:
    c = st.columns(3)
    window = c[0].selectbox("Window of the log", WINDOWS, key=f"{KEY}_window", format_func=lambda w: w.label,
                            help=f"Requests in arrival order, every length ÷ {SCALE}; one engine step = "
                                 f"{SECONDS_PER_STEP * 1000:.0f} ms of log time.")
    pool = c[1].selectbox("Engine pool (log tokens)", CAPACITIES, index=CAPACITIES.index(POOL_BLOCKS),
                          key=f"{KEY}_pool_blocks", format_func=lambda b: f"{blocks_text(b)} ({b * BLOCK_SIZE:,} slots)")
    eviction = c[2].radio("Eviction", ("lru", "belady"), key=f"{KEY}_eviction", horizontal=True,
                          format_func=lambda e: "LRU" if e == "lru" else "Belady",
                          help="Belady evicts the cached block needed furthest in the future: it knows the workload, "
                               "which no server does. A yardstick, not a policy.")
    return window, pool, eviction


def explore(v: TrafficView) -> None:
    st.header("Shared prefixes")
    st.plotly_chart(prefixes_figure(v), width="stretch", key=f"{KEY}_prefixes", config=export.png_config(f"{KEY}-prefixes"))
    longest, most = prefix_tables(v)
    left, right = st.columns(2)
    left.markdown("**The longest shared prefixes**")
    left.dataframe(longest, hide_index=True, width="stretch")
    right.markdown("**The most reused**")
    right.dataframe(most, hide_index=True, width="stretch")

    st.header("Hit rate against cache size")
    st.plotly_chart(capacity_figure(v, paper=True), width="stretch", key=f"{KEY}_curve", config=export.png_config(f"{KEY}-curve"))
    c = v.curve
    st.dataframe([{"capacity (log tokens)": blocks_text(cap), "blocks of 512": cap, "LRU": f"{lru:.1%}",
                   "Belady": f"{bel:.1%}"}
                  for cap, lru, bel in zip(c.capacities, c.lru, c.belady)], hide_index=True, width="stretch")
    st.caption(f"The replay of this window's hash ids (a cache of that size with nothing else in it); no limit: "
               f"{c.unbounded:.1%}. The paper's Figure 9 points are for the whole hour, whose cache keeps warming up "
               "(see the README's prefix-capacity benchmark for the whole log).")

    st.header("The pool over time")
    n = v.run.num_steps
    step = st.slider("Step", 0, max(1, n - 1), value=min(n - 1, v.full_step()), key=f"{KEY}_step")
    pool_heatmap(v, step, key=f"{KEY}_pool")
    cols = st.columns(4)
    cols[0].metric("hit rate (engine)", f"{v.engine_hit_rate():.1%}")
    cols[1].metric("same size, ideal LRU replay", f"{v.replay_at_pool() if v.pool_blocks in c.capacities else float('nan'):.1%}")
    cols[2].metric("pool held by running sequences", f"{v.running_share():.0%}", help="Mean over the run's steps.")
    cols[3].metric("prefill tokens saved", f"{v.engine_hit_tokens():,}")

    st.header("Prefill tokens saved")
    st.plotly_chart(saved_figure(v), width="stretch", key=f"{KEY}_saved", config=export.png_config(f"{KEY}-saved"))

    st.header("Reuse shorter than a block")
    st.plotly_chart(granularity_figure(v), width="stretch", key=f"{KEY}_blocks", config=export.png_config(f"{KEY}-blocks"))


# ---------------------------------------------------------------------------- the page
GUIDE_HELP = (f"A fixed walkthrough of the log's {GUIDE_WINDOW.label}, lengths ÷ {SCALE}, blocks of {BLOCK_SIZE}, "
              f"a {POOL_BLOCKS * BLOCK_SIZE:,}-slot pool, LRU.")


def scenario(guided: bool) -> TrafficView:
    """The guide's window, pool and LRU, or the ones picked here; the replay of every cache size."""
    window, pool, eviction = (GUIDE_WINDOW, POOL_BLOCKS, "lru") if guided else explore_settings()
    try:
        with st.spinner(f"Replaying {window.count:,} requests of the log…"):
            v = view(window, pool, eviction)
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    if not presenter.on(KEY):
        st.caption(f"The window: the log's {window.label} ({len(v.rows):,} requests, {v.minutes:.0f} minutes of the "
                   f"hour), every length ÷ {SCALE} so that one engine block of {BLOCK_SIZE} tokens is one "
                   f"512-token hash block; one engine step = {SECONDS_PER_STEP * 1000:.0f} ms of log time. "
                   "Capacities are in the log's tokens (blocks × 512). The whole hour is in the README's "
                   "prefix-capacity benchmark.")
    return v


def export_files(v: TrafficView) -> Export:
    return Export([v.run], f"Prefix cache on real traffic: the log's {v.window.label} on {v.pool_blocks:,} blocks of "
                  f"{BLOCK_SIZE}", "prefix-traffic")


LESSON = Lesson(key=KEY, title="Prefix cache on real traffic", help=GUIDE_HELP, scenario=scenario,
                guide_steps=guide_steps, guide_view=guided, slide=slide, explore=explore, export=export_files)
