"""``python -m pagedkv_core observe``: watch a vLLM server's KV cache through its events and /metrics.

    python -m pagedkv_core observe --server http://127.0.0.1:8000 --duration 60 --json
    python -m pagedkv_core observe --kv-events tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 \
        --trace-out observed.trace

``--server`` finds the event endpoints in ``GET /kv_event_sources`` and scrapes ``/metrics``;
``--kv-events``/``--replay``/``--topic`` name one stream and override discovery. On a terminal
a status line is redrawn as events arrive; ``--json`` prints one object at the end (see
:meth:`pagedkv_core.observe.observer.Observer.summary`). ``--trace-out`` records the observation
as a pagedkv trace for the app's "Your vLLM server" page.

A server that does not answer, or no event within ``--first-event-timeout`` seconds (or the whole
``--duration``), is one line on stderr and exit code 2, never a hang.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from ..config import ConfigError
from ..safe_io import check_writable

EXIT_NO_EVENTS = 2
DEFAULT_FIRST_EVENT_TIMEOUT = 60.0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "observe",
        help="watch a vLLM server's KV cache (KV events and /metrics)",
        description="Watch a vLLM server's KV cache: its KV-cache events (ZMQ) and its Prometheus /metrics.",
    )
    p.add_argument("--server", metavar="URL", help="the server, http://HOST:PORT: finds the event endpoints "
                   "(/kv_event_sources) and scrapes /metrics")
    p.add_argument("--kv-events", metavar="ENDPOINT", help="the PUB endpoint, tcp://HOST:5557 (overrides discovery)")
    p.add_argument("--replay", metavar="ENDPOINT", help="the replay endpoint, tcp://HOST:5558 (gaps are filled from it)")
    p.add_argument("--topic", default=None, metavar="TOPIC", help="the events' topic (default: every topic)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: at Ctrl-C)")
    p.add_argument("--first-event-timeout", type=float, default=None, metavar="S",
                   help=f"give up when no event came in S seconds (default {DEFAULT_FIRST_EVENT_TIMEOUT:g}, "
                        "or the whole --duration)")
    p.add_argument("--metrics-every", type=float, default=1.0, metavar="S", help="scrape /metrics every S seconds (default 1)")
    p.add_argument("--trace-out", metavar="PATH", help="record the observation as a pagedkv trace")
    p.add_argument("--json", action="store_true", help="print one JSON object when it ends")
    p.set_defaults(func=cmd_observe)


def _positive(value, flag: str) -> None:
    if value is not None and not (value > 0 and value < 1e9):
        raise ConfigError(f"{flag} must be a number of seconds > 0, got {value!r}")


def _sources(args):
    from ..observe.discovery import EventSource, discover
    from .kv_events import check_endpoints

    if args.kv_events:
        check_endpoints((args.kv_events, "--kv-events"), (args.replay, "--replay"))
        return [EventSource(args.kv_events, args.replay, args.topic or "")]
    sources = discover(args.server)
    if args.replay or args.topic is not None:
        sources = [EventSource(s.endpoint, args.replay or s.replay, s.topic if args.topic is None else args.topic, s.rank)
                   for s in sources]
    return sources


def cmd_observe(args: argparse.Namespace) -> int:
    from ..observe.discovery import server_host
    from ..observe.observation import ObservationRecorder
    from ..observe.observer import Observer
    from ..observe.server_metrics import ServerError, scrape
    from ..observe.subscriber import Subscriber
    from .parsing import trace_writer

    if not args.server and not args.kv_events:
        raise ConfigError("give --server http://HOST:PORT, or --kv-events tcp://HOST:PORT")
    _positive(args.duration, "--duration")
    _positive(args.first_event_timeout, "--first-event-timeout")
    _positive(args.metrics_every, "--metrics-every")
    if args.trace_out:
        check_writable(args.trace_out, "trace")
    first_sample = None
    try:
        if args.server:
            try:
                server_host(args.server)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            first_sample = scrape(args.server)  # a server that does not answer fails here, at once
        sources = _sources(args)
    except ServerError as exc:
        raise ConfigError(str(exc)) from None
    try:
        subscriber = Subscriber(sources)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    observer = Observer(subscriber, args.server, metrics_every=args.metrics_every)
    recorder = None
    if args.trace_out:
        header = {"server": args.server, "sources": [s.__dict__ for s in sources]}
        recorder = ObservationRecorder(trace_writer(args.trace_out, header), header=header)
        recorder.on_metrics(first_sample)
        observer.on_batch.append(recorder.on_batch)
    if first_sample is not None:
        observer.metrics = first_sample
        observer.metrics_history.append(first_sample)
        observer._next_scrape = time.time() + args.metrics_every
    live = sys.stderr.isatty() and not args.json
    first_event_timeout = args.first_event_timeout or (args.duration if args.duration else DEFAULT_FIRST_EVENT_TIMEOUT)
    stop = {"now": False}
    previous = signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    start = time.monotonic()
    last_tick = start
    try:
        observer.catch_up()  # what the replay buffers still hold: the cache before we listened
        while not stop["now"]:
            elapsed = time.monotonic() - start
            if args.duration is not None and elapsed >= args.duration:
                break
            if observer.counts.batches == 0 and elapsed >= first_event_timeout:
                break
            n = observer.poll(0.2)
            if recorder is not None:
                recorder.on_metrics(observer.metrics)
                if n or time.monotonic() - last_tick >= 1.0:
                    recorder.tick()
                    last_tick = time.monotonic()
            if live:
                print("\r\033[K" + observer.status_line()[:200], end="", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, previous)
        if live:
            print(file=sys.stderr)
        if recorder is not None:
            recorder.tick()
            recorder.close({"summary": observer.summary()})
        observer.close()
    summary = observer.summary()
    if args.json:
        print(json.dumps(summary))
    elif not live:
        print(observer.status_line())
    if observer.counts.batches == 0:
        where = ", ".join(s.endpoint for s in sources)
        print(f"error: no KV events from {where} in {time.monotonic() - start:.0f} s (is the server started with "
              "--kv-events-config and serving requests?)", file=sys.stderr)
        return EXIT_NO_EVENTS
    return 0
