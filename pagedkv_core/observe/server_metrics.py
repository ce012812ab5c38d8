"""A vLLM server's Prometheus signals, read from ``/metrics`` with prometheus_client's own parser.

What each signal counts (the page shows these sentences beside the series):
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Our name -> (vLLM's sample name, how several engines combine, what it counts)
SIGNALS = {
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "mean",
                            "Share of KV blocks held by running requests, 0 to 1. It counts blocks, not tokens, "
                            "and a block that is cached but used by no request counts as free."),
    "num_requests_running": ("vllm:num_requests_running", "sum",
                             "Requests in the running batch (their blocks are allocated)."),
    "num_requests_waiting": ("vllm:num_requests_waiting", "sum",
                             "Requests queued for admission, or preempted and waiting to be recomputed."),
    "num_preemptions": ("vllm:num_preemptions_total", "sum",
                        "Running requests preempted so far (their blocks freed, to be recomputed) because "
                        "the pool ran out of free blocks."),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "sum",
                             "Prompt tokens looked up in the prefix cache at admission, so far."),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "sum",
                          "Of those, tokens found in the cache (full blocks only), so far."),
}
SAMPLE_NAMES = {sample: ours for ours, (sample, _, _) in SIGNALS.items()}
__doc__ += "\n".join(f"\n- ``{v[0]}``: {v[2]}" for v in SIGNALS.values())

MAX_RESPONSE_BYTES = 32 << 20


class ServerError(RuntimeError):
    """The server did not answer, or answered something unreadable. One line."""


def http_get(url: str, timeout: float = 5.0) -> bytes:
    """GET ``url``; ServerError (one line) when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (the operator's URL)
            body = resp.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ServerError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"{url} does not answer ({reason})") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise ServerError(f"{url} answered more than {MAX_RESPONSE_BYTES >> 20} MiB")
    return body


def http_get_json(url: str, timeout: float = 5.0):
    body = http_get(url, timeout)
    try:
        return json.loads(body)
    except ValueError:
        raise ServerError(f"{url} did not answer JSON") from None


@dataclass
class MetricsSample:
    t: float
    values: dict[str, float] = field(default_factory=dict)  # our signal names; missing = not reported
    num_gpu_blocks: int | None = None  # from vllm:cache_config_info, when the server reports it

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_metrics(text: str, t: float | None = None) -> MetricsSample:
    """The six signals from a Prometheus text exposition (several engines: counts summed,
    usage averaged). Lines the parser cannot read end the parse with ServerError."""
    found: dict[str, list[float]] = {}
    num_gpu_blocks = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                ours = SAMPLE_NAMES.get(sample.name)
                if ours is not None:
                    found.setdefault(ours, []).append(float(sample.value))
                elif sample.name == "vllm:cache_config_info" and "num_gpu_blocks" in sample.labels:
                    try:
                        num_gpu_blocks = int(sample.labels["num_gpu_blocks"])
                    except ValueError:
                        pass
    except (ValueError, TypeError, IndexError) as exc:
        raise ServerError(f"/metrics is not Prometheus text ({str(exc)[:60]})") from None
    values = {}
    for ours, samples in found.items():
        how = SIGNALS[ours][1]
        values[ours] = sum(samples) / len(samples) if how == "mean" else sum(samples)
    return MetricsSample(time.time() if t is None else t, values, num_gpu_blocks)


def scrape(server: str, timeout: float = 5.0) -> MetricsSample:
    """GET ``server``/metrics and parse it."""
    body = http_get(server.rstrip("/") + "/metrics", timeout)
    return parse_metrics(body.decode("utf-8", "replace"))


def hit_rate(before: MetricsSample, after: MetricsSample) -> float | None:
    """Prefix-cache hit rate between two scrapes: Δhits / Δqueries (None when nothing was queried,
    or a counter went back: the server restarted)."""
    try:
        dq = after.values["prefix_cache_queries"] - before.values["prefix_cache_queries"]
        dh = after.values["prefix_cache_hits"] - before.values["prefix_cache_hits"]
    except KeyError:
        return None
    if dq <= 0 or dh < 0:
        return None
    return dh / dq
