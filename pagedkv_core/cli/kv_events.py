"""``--kv-events ENDPOINT``: an engine command publishes vLLM's KV-cache events (see
:mod:`pagedkv_core.observe.publisher`). ``tcp://*:PORT`` binds (the replay socket then binds the
next port unless ``--kv-events-replay`` says otherwise), ``tcp://HOST:PORT`` connects."""
from __future__ import annotations

import argparse
import atexit
import time

from ..config import ConfigError

JOIN_S = 0.3


def add_kv_events_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("KV events (vLLM's wire format)")
    g.add_argument("--kv-events", metavar="ENDPOINT",
                   help="publish the prefix cache's BlockStored/BlockRemoved/AllBlocksCleared events as vLLM does: "
                        "tcp://*:PORT binds, tcp://HOST:PORT connects")
    g.add_argument("--kv-events-replay", metavar="ENDPOINT",
                   help="the replay socket (default: the next port when --kv-events binds tcp://*:PORT)")
    g.add_argument("--kv-events-topic", default="", metavar="TOPIC", help="the topic frame (default empty)")


def check_endpoints(*flags: tuple[str | None, str]) -> None:
    """Each given (endpoint, flag name) is a ZMQ TCP endpoint; ConfigError (one line) otherwise."""
    from ..observe.discovery import check_endpoint

    try:
        for endpoint, flag in flags:
            if endpoint:
                check_endpoint(endpoint, flag)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_kv_events(args: argparse.Namespace, allocator: str) -> None:
    """The flags' values, before anything is built or run. ConfigError (one line)."""
    if args.kv_events is None:
        if args.kv_events_replay:
            raise ConfigError("--kv-events-replay needs --kv-events")
        return
    from ..kv.registry import allocator_kind

    check_endpoints((args.kv_events, "--kv-events"), (args.kv_events_replay, "--kv-events-replay"))
    if allocator_kind(allocator) != "paged":
        raise ConfigError(f"--kv-events needs a paged allocator (the prefix cache's events); {allocator} has none")


def open_kv_events(args: argparse.Namespace, block_size: int):
    """The engine's event sink publishing on the flags' endpoints, or None without --kv-events."""
    if args.kv_events is None:
        return None
    from ..observe.publisher import EngineKVEvents, KVEventPublisher, binds, default_replay

    replay = args.kv_events_replay or (default_replay(args.kv_events) if binds(args.kv_events) else None)
    try:
        publisher = KVEventPublisher(args.kv_events, replay, topic=args.kv_events_topic)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    atexit.register(publisher.close)  # idempotent: also when the command ends by an exception
    if binds(args.kv_events):
        time.sleep(JOIN_S)  # subscribers already waiting reconnect every 100 ms: let them join first
    return EngineKVEvents(publisher, block_size)
