"""Where a vLLM server publishes its KV events: ``GET /kv_event_sources``, endpoints made reachable.

vLLM answers with the events config of every engine rank (``endpoint``, ``replay_endpoint``,
``topic``, ...). A bound endpoint names no host (``tcp://*:5557``, ``tcp://0.0.0.0:5557``): it
is reached at the server's own host. The answer's exact nesting has changed between versions,
so every object in it that names an ``endpoint`` is taken as one source.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .server_metrics import ServerError, http_get_json

_WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")
_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d{1,5}|\*)$")  # port * : an ephemeral one (bind only)
_RANK_KEYS = ("data_parallel_rank", "dp_rank", "rank")


@dataclass(frozen=True)
class EventSource:
    """One engine rank's event stream."""

    endpoint: str  # tcp://HOST:PORT of the PUB socket
    replay: str | None = None  # tcp://HOST:PORT of the ROUTER replay socket
    topic: str = ""
    rank: int | None = None  # data-parallel rank, when the endpoint stands for one


def check_endpoint(endpoint: str, what: str = "--kv-events") -> str:
    """A ZMQ endpoint we may use: tcp://HOST:PORT or ipc://PATH. ValueError (one line) otherwise."""
    if not isinstance(endpoint, str) or not (endpoint.startswith("ipc://") and len(endpoint) > 6 or _TCP.match(endpoint)):
        raise ValueError(f"{what} must be tcp://HOST:PORT (or ipc://PATH), got {endpoint!r}")
    m = _TCP.match(endpoint)
    if m and m["port"] != "*" and not 0 < int(m["port"]) < 65536:
        raise ValueError(f"{what}: port {m['port']} is out of range")
    return endpoint


def reachable(endpoint: str, server_host: str) -> str:
    """``endpoint`` with a wildcard host replaced by ``server_host``."""
    m = _TCP.match(endpoint)
    if m and m["host"] in _WILDCARD_HOSTS:
        host = f"[{server_host}]" if ":" in server_host and not server_host.startswith("[") else server_host
        return f"tcp://{host}:{m['port']}"
    return endpoint


def _configs(data, rank=None, depth: int = 0):
    """(config dict, rank) for every dict under ``data`` that names an endpoint."""
    if depth > 6:
        return
    if isinstance(data, dict):
        if isinstance(data.get("endpoint"), str):
            yield data, rank
            return
        for key, value in data.items():
            yield from _configs(value, int(key) if str(key).isdigit() else rank, depth + 1)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _configs(value, i if len(data) > 1 else rank, depth + 1)


def parse_sources(data, server_host: str) -> list[EventSource]:
    sources = []
    for config, rank in _configs(data):
        if config.get("enable_kv_cache_events") is False or config.get("publisher") in ("null", None) and "publisher" in config:
            continue
        for key in _RANK_KEYS:
            if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
                rank = config[key]
        replay = config.get("replay_endpoint")
        source = EventSource(
            reachable(config["endpoint"], server_host),
            reachable(replay, server_host) if isinstance(replay, str) and replay else None,
            config.get("topic") if isinstance(config.get("topic"), str) else "",
            rank,
        )
        if source not in sources:
            sources.append(source)
    return sources


def server_host(server: str) -> str:
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--server must be http://HOST:PORT, got {server!r}")
    return parts.hostname


def discover(server: str, timeout: float = 5.0) -> list[EventSource]:
    """The event sources ``server`` reports. ServerError when it does not answer or reports none."""
    host = server_host(server)
    try:
        data = http_get_json(server.rstrip("/") + "/kv_event_sources", timeout)
    except ServerError as exc:
        if "HTTP 404" in str(exc):
            raise ServerError(f"{server} has no /kv_event_sources (an older vLLM?): give the event endpoint "
                              "with --kv-events tcp://HOST:5557") from None
        raise
    sources = parse_sources(data, host)
    if not sources:
        raise ServerError(f"{server} publishes no KV events (start vLLM with --kv-events-config "
                          "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}')")
    return sources
