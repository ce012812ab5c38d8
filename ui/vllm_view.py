"""The "Your vLLM server" page's parts: which servers the app may connect to, a live observation
that the page pumps, and the figures (the prefix cache as a forest of block chains, blocks stored
and evicted per second, vLLM's signals over time).

Which servers. Connecting is an operator's choice, never a visitor's: in workshop mode
(:func:`ui.workshop.enabled`), or when the app listens beyond loopback, the page connects only to
the servers listed in ``PAGEDKV_VLLM_SERVERS`` (comma-separated ``http://HOST:PORT``), and
:func:`check_server` refuses any other URL whatever the browser sends. Only a one-person app on
127.0.0.1 offers a free-form URL box. The default is the server ``make vllm`` starts.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from pagedkv_core.config import ConfigError
from pagedkv_core.observe.cache_state import CacheState
from pagedkv_core.observe.discovery import discover, server_host
from pagedkv_core.observe.observation import Observation, ObservationRecorder
from pagedkv_core.observe.observer import Observer
from pagedkv_core.observe.server_metrics import SIGNALS, ServerError, scrape
from pagedkv_core.observe.subscriber import Subscriber
from pagedkv_core.record.recording import Recording
from ui import workshop

ENV_SERVERS = "PAGEDKV_VLLM_SERVERS"
DEFAULT_SERVER = "http://127.0.0.1:8000"  # `make vllm` (pagedkv_core/observe/vllm_server.py, port 8000)
MAX_FOREST_BLOCKS = 2000  # an icicle of more cells is unreadable and slow to draw: the most recent ones
PUMP_S = 0.25  # a fragment run reads events for at most this long
FOREST_HEIGHT = 390
SIGNAL_HEIGHT = 125
HIT_RATE_INTERVAL_S = 2.0


# ---------------------------------------------------------------------------- which servers
def listed_servers() -> list[str]:
    """``PAGEDKV_VLLM_SERVERS``: the servers the operator allows, in order."""
    text = os.environ.get(ENV_SERVERS, "")
    return [s.strip().rstrip("/") for s in text.split(",") if s.strip()]


def free_urls(address: str | None) -> bool:
    """Whether a visitor may type any URL: only outside workshop mode, on an app that listens on
    loopback alone (the person at the browser has a shell on the machine already)."""
    return not workshop.enabled() and workshop.is_loopback(address)


def server_choices(address: str | None) -> list[str] | None:
    """The servers to pick from, or None for a free-form URL (default: :data:`DEFAULT_SERVER`)."""
    if free_urls(address):
        return None
    return listed_servers()


def check_server(url: str, address: str | None) -> str:
    """``url`` if the app may connect to it; ConfigError (one line) otherwise."""
    url = (url or "").strip().rstrip("/")
    choices = server_choices(address)
    if choices is not None and url not in choices:
        raise ConfigError(f"this app connects only to the servers its operator lists in {ENV_SERVERS}")
    try:
        server_host(url)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("--server", "the server URL")) from None
    return url


# ---------------------------------------------------------------------------- a live observation
class LiveObservation:
    """An Observer on a server, recorded step by step into an in-memory Recording (a step a pump)."""

    def __init__(self, url: str):
        try:
            first = scrape(url, timeout=3.0)
            sources = discover(url, timeout=3.0)
        except ServerError as exc:
            raise ConfigError(str(exc)) from None
        try:
            subscriber = Subscriber(sources, replay_timeout=1.0)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.url = url
        self.sources = sources
        self.observer = Observer(subscriber, url, metrics_every=1.0)
        self.observer.metrics = first
        self.recording = Recording()
        header = {"server": url, "sources": [s.__dict__ for s in sources]}
        self.recorder = ObservationRecorder(self.recording, header=header)
        self.recorder.on_metrics(first)
        self.observer.on_batch.append(self.recorder.on_batch)
        self.observer.catch_up()
        self.recorder.tick()
        self.observation = Observation({"server": url, "observation": {"unknown": []}}, self.recording)
        self.closed = False

    def pump(self, max_s: float = PUMP_S) -> int:
        """Read what arrived (for at most ``max_s``), scrape /metrics when due, record a step.
        Returns the last step."""
        end = time.monotonic() + max_s
        while time.monotonic() < end:
            if not self.observer.poll(0.05):
                break
        self.recorder.on_metrics(self.observer.metrics)
        return self.recorder.tick()

    def close(self) -> None:
        if not self.closed:
            self.observer.close()
            self.closed = True

    def __del__(self):  # a session the janitor cleared (ui/sessions.py) lets its sockets go with it
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


# ---------------------------------------------------------------------------- figures
@dataclass
class ForestView:
    figure: go.Figure
    shown: int
    total: int


def _short(text: str, n: int = 24) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= n else text[: n - 1] + "…"


def chain_runs(blocks) -> list[list]:
    """``blocks`` (CachedBlock, a parent before its children) cut into runs: a run goes on from a
    block to its only child, and ends where a chain branches or stops. The forest of runs has the
    shape of the forest of blocks with the straight stretches (a long shared system prompt, one
    answer's blocks) drawn as one cell each."""
    by_hash = {b.block_hash: b for b in blocks}
    children: dict[int, list] = {}
    for b in blocks:
        if b.parent in by_hash:
            children.setdefault(b.parent, []).append(b)
    runs = []
    for b in blocks:
        parent = by_hash.get(b.parent)
        if parent is not None and len(children.get(parent.block_hash, ())) == 1:
            continue  # the middle of a run: its start collects it
        run = [b]
        while len(children.get(run[-1].block_hash, ())) == 1:
            run.append(children[run[-1].block_hash][0])
        runs.append(run)
    return runs


def forest_figure(state: CacheState, now: float, color_by: str = "age", text_of=None,
                  max_blocks: int = MAX_FOREST_BLOCKS) -> ForestView:
    """The cached blocks as an icicle: a chain's first cached block on the left, each stretch of
    blocks after the stretch it continues, a cell's height the blocks that continue it (a prefix
    many prompts share is tall). Straight stretches are one cell (:func:`chain_runs`), labelled
    with their first tokens and their length. ``color_by``: "age" (seconds since the newest block
    of the cell was stored) or "reuse" (the most times a hash of the cell was stored: evicted and
    computed again). ``text_of(token_ids)``: decoded text for the labels and hover (None: ids)."""
    blocks = sorted(state.cached().values(), key=lambda b: b.stored_at)[-max_blocks:]
    runs = chain_runs(blocks)
    run_of = {b.block_hash: run[0].block_hash for run in runs for b in run}
    ids, parents, labels, values, hovers, colors = [], [], [], [], [], []
    for run in runs:
        head = run[0]
        ids.append(f"{head.block_hash:016x}")
        parents.append(f"{run_of[head.parent]:016x}" if head.parent in run_of else "")
        tokens = [t for b in run[:4] for t in b.token_ids]
        text = text_of(tokens) if text_of is not None else None
        first = text_of(list(head.token_ids)) if text_of is not None else None
        n = len(run)
        labels.append((_short(first) if first else f"{head.block_hash:016x}"[:8]) + (f" ({n} blocks)" if n > 1 else ""))
        values.append(n)
        shown = text if text is not None else " ".join(map(str, tokens[:24])) + (" …" if len(tokens) > 24 else "")
        age = max(0.0, now - max(b.stored_at for b in run))
        stores = max(b.stores for b in run)
        root = "a chain root" if head.parent is None else (
            "continues the cell before it" if head.parent in run_of else "its parent is no longer cached")
        hovers.append(f"{n} block(s) from {head.block_hash:016x} ({root})<br>newest stored {age:.1f} s ago; "
                      f"stored {stores} time(s)<br>" + shown.replace("<", "&lt;").replace("\n", "⏎")[:300])
        colors.append(age if color_by == "age" else stores)
    fig = go.Figure(go.Icicle(
        ids=ids, parents=parents, labels=labels, values=values, branchvalues="remainder",
        hovertext=hovers, hoverinfo="text", tiling={"orientation": "h"}, maxdepth=6,
        marker={"colors": colors, "colorscale": "Viridis_r" if color_by == "age" else "Oranges", "showscale": True,
                "cmin": 0, "colorbar": {"title": {"text": "age (s)" if color_by == "age" else "times stored"},
                                        "thickness": 12}},
    ))
    fig.update_layout(height=FOREST_HEIGHT, margin={"l": 4, "r": 4, "t": 4, "b": 4})
    return ForestView(fig, len(blocks), state.num_cached)


def _times(obs: Observation) -> np.ndarray:
    t = np.array([r["t"] if r["t"] is not None else np.nan for r in obs.rates()], dtype=float)
    return t - np.nanmin(t) if len(t) and np.isfinite(t).any() else t


def rates_figure(obs: Observation) -> go.Figure:
    """Blocks (hashes) stored and evicted per second of wall time, in one-second bins."""
    rows = obs.rates()
    t = _times(obs)
    stored = np.array([r["stored"] for r in rows], dtype=float)
    removed = np.array([r["removed"] for r in rows], dtype=float)
    n = int(np.nanmax(t)) + 1 if len(t) and np.isfinite(t).any() else 1
    bins = np.nan_to_num(t, nan=0).astype(int).clip(0, n - 1) if len(t) else np.zeros(0, int)
    per_s_stored = np.bincount(bins, stored, minlength=n)
    per_s_removed = np.bincount(bins, removed, minlength=n)
    x = np.arange(n)
    fig = go.Figure([go.Bar(x=x, y=per_s_stored, name="stored (BlockStored)", marker_color="#2a9d8f"),
                     go.Bar(x=x, y=-per_s_removed, name="evicted (BlockRemoved)", marker_color="#e76f51")])
    fig.update_layout(barmode="relative", height=200, margin={"l": 40, "r": 4, "t": 4, "b": 30},
                      xaxis_title="seconds since the observation began", yaxis_title="blocks / s",
                      legend={"orientation": "h", "y": 1.15})
    return fig


SIGNAL_PANELS = (  # (title under vLLM's name, metric column, how to draw, our signal name for the sentence)
    ("vllm:kv_cache_usage_perc", "kv_usage", "share", "kv_cache_usage_perc"),
    ("vllm:num_requests_running, _waiting", ("num_running", "num_waiting"), "count", "num_requests_running"),
    ("vllm:num_preemptions_total", "num_preemptions", "count", "num_preemptions"),
    ("hit rate: Δ vllm:prefix_cache_{hits,queries}_total",
     ("prefix_hit_tokens", "prefix_queried_tokens"), "rate", "prefix_cache_hits"),
)
SENTENCES = {
    "vllm:kv_cache_usage_perc": SIGNALS["kv_cache_usage_perc"][2],
    "vllm:num_requests_running, _waiting": "Requests in the running batch (solid) and queued for admission or "
                                            "preempted (dotted): a queue that grows while usage is high means the "
                                            "pool, not the compute, is the limit.",
    "vllm:num_preemptions_total": SIGNALS["num_preemptions"][2],
    "hit rate: Δ vllm:prefix_cache_{hits,queries}_total":
        "Of the prompt tokens looked up in each 2-second window (Δhits / Δqueries), the share found cached "
        "(full blocks only). "
        "Zero when prompts share no full block, or when the shared blocks were evicted before the next request.",
}


def interval_hit_rate(t, hits, queries, interval: float = HIT_RATE_INTERVAL_S):
    """Δhits / Δqueries over consecutive ``interval``-second windows (at each window's end; NaN
    where nothing was queried). ``t``: seconds of each step; the counters are cumulative."""
    t = np.asarray(t, dtype=float)
    hits, queries = np.asarray(hits, dtype=float), np.asarray(queries, dtype=float)
    ok = np.isfinite(t)
    if not ok.any():
        return np.zeros(0), np.zeros(0)
    t, hits, queries = t[ok], hits[ok], queries[ok]
    window = np.floor(t / interval).astype(int)
    last = np.r_[np.flatnonzero(np.diff(window)), len(t) - 1]  # each window's last step
    h, q = hits[last], queries[last]
    dh, dq = np.diff(h, prepend=hits[0]), np.diff(q, prepend=queries[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dq > 0, dh / np.where(dq > 0, dq, 1), np.nan)
    return (window[last] + 1) * interval, rate


def signal_figure(obs: Observation, panel) -> go.Figure:
    title, column, kind, _ = panel
    t = _times(obs)
    rec = obs.recording
    fig = go.Figure()
    if kind == "share":
        fig.add_scatter(x=t, y=rec.metrics_series(column), mode="lines", line_shape="hv", name=title)
        fig.update_yaxes(range=[0, 1], tickformat=".0%")
    elif kind == "count" and isinstance(column, tuple):
        fig.add_scatter(x=t, y=rec.metrics_series(column[0]), mode="lines", line_shape="hv", name="running")
        fig.add_scatter(x=t, y=rec.metrics_series(column[1]), mode="lines", line_shape="hv", name="waiting",
                        line={"dash": "dot"})
    elif kind == "count":
        fig.add_scatter(x=t, y=rec.metrics_series(column), mode="lines", line_shape="hv", name=title)
    else:
        x, rate = interval_hit_rate(t, rec.metrics_series(column[0]), rec.metrics_series(column[1]))
        fig.add_scatter(x=x, y=rate, mode="markers+lines", connectgaps=False, name="hit rate")
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    fig.update_layout(height=SIGNAL_HEIGHT, margin={"l": 36, "r": 4, "t": 22, "b": 20}, showlegend=kind == "count" and isinstance(column, tuple),
                      title={"text": title, "font": {"size": 12}}, legend={"orientation": "h", "y": 1.25, "x": 0.6})
    return fig
