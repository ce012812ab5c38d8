"""pagedkv's engine publishing vLLM's KV events: anything built for vLLM's stream can watch it.

:class:`KVEventPublisher` is the transport, as vLLM's: a ZMQ PUB socket sending ``[topic, seq,
payload]`` and a ROUTER replay socket that answers ``[b"", start_seq]`` with every buffered
``(seq, payload)`` from ``start_seq`` on, then seq -1. Its endpoint binds or connects as vLLM's
does: ``tcp://*:PORT`` (or ``0.0.0.0``, ``ipc://``) binds, ``tcp://HOST:PORT`` connects (to a
relay that binds); ``bind=True`` forces a bind (``tcp://127.0.0.1:*``: an ephemeral port, see
:attr:`KVEventPublisher.endpoint`). The replay socket always binds.

:class:`EngineKVEvents` is the engine's collaborator (``Engine(..., kv_event_sink=sink)``): the
block pool calls ``stored`` when a full block gets its hash, ``removed`` when a cached block is
evicted for other tokens, ``cleared`` when the prefix cache is reset, and the engine calls
``flush`` at the end of each step, which publishes that step's events as one batch. Consecutive
blocks of one chain stored in a step become one ``BlockStored`` (as vLLM sends them), and our
signed 64-bit hashes go out unsigned (``h mod 2**64``).
"""
from __future__ import annotations

import threading
import time
from collections import deque

import zmq

from ..kv.prefix_hash import NO_HASH
from .cache_state import DEFAULT_MEDIUM
from .discovery import check_endpoint
from .wire import END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored, encode_batch, seq_bytes, seq_of, unsigned_hash

DEFAULT_BUFFER_STEPS = 10_000


def binds(endpoint: str) -> bool:
    """Whether vLLM's rule binds ``endpoint`` (no host named) rather than connecting to it."""
    return endpoint.startswith("ipc://") or endpoint.startswith("inproc://") or any(
        endpoint.startswith(f"tcp://{h}:") for h in ("*", "0.0.0.0", "[::]"))


def default_replay(endpoint: str) -> str | None:
    """The replay endpoint beside a bound tcp endpoint: the next port (5557 -> 5558)."""
    head, _, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not port.isdigit():
        return None
    return f"{head}:{int(port) + 1}" if int(port) < 65535 else None


class KVEventPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 bind: bool | None = None, buffer_steps: int = DEFAULT_BUFFER_STEPS,
                 data_parallel_rank: int | None = None, encoding: str = "array",
                 context: zmq.Context | None = None, linger_ms: int = 1000):
        check_endpoint(endpoint)
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint, "the replay endpoint")
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.encoding = encoding
        self.context = context or zmq.Context.instance()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._linger_ms = linger_ms
        self._pub = self.context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._router = None
        try:
            if binds(endpoint) if bind is None else bind:
                self._pub.bind(endpoint)
                self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._pub.connect(endpoint)
                self.endpoint = endpoint
            self.replay_endpoint = None
            if replay_endpoint is not None:
                self._router = self.context.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.LINGER, 0)
                self._router.bind(replay_endpoint)
                self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"--kv-events: cannot open {endpoint}: {exc}") from None
        if self._router is not None:
            self._thread = threading.Thread(target=self._serve_replay, name="kv-events-replay", daemon=True)
            self._thread.start()

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events, ts: float | None = None, data_parallel_rank: int | None = None) -> int:
        """Send one batch (``data_parallel_rank``: this batch's, else the publisher's); returns
        its sequence number. Safe to call from several threads (one engine each)."""
        rank = self.data_parallel_rank if data_parallel_rank is None else data_parallel_rank
        payload = encode_batch(time.time() if ts is None else ts, events, rank, self.encoding)
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            self._send(seq, payload)
        return seq

    def _send(self, seq: int, payload: bytes) -> None:
        self._pub.send_multipart([self.topic, seq_bytes(seq), payload])

    def _serve_replay(self) -> None:
        router = self._router
        while not self._stop.is_set():
            if not router.poll(100, zmq.POLLIN):
                continue
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                continue
            if len(frames) < 2:
                continue
            identity, rest = frames[0], frames[1:]
            delimiter = [b""] if rest[0] == b"" else []
            try:
                start = seq_of(rest[-1])
            except ValueError:
                continue
            with self._lock:
                backlog = [(s, p) for s, p in self._buffer if s >= start]
            try:
                for s, p in backlog:
                    router.send_multipart([identity, *delimiter, seq_bytes(s), p])
                router.send_multipart([identity, *delimiter, seq_bytes(END_SEQ), b""])
            except zmq.ZMQError:
                continue

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._router is not None:
            self._router.close(0)
            self._router = None
        if self._pub is not None:
            self._pub.close(self._linger_ms)
            self._pub = None

    def __enter__(self) -> "KVEventPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EngineKVEvents:
    """The block pool's ``kv_event_sink``: collects a step's events, publishes them on ``flush``.

    ``publisher`` may be None (events are only collected and counted: tests, the app's preview).
    ``published`` keeps every flushed batch's events when ``keep=True``."""

    def __init__(self, publisher: KVEventPublisher | None, block_size: int, medium: str = DEFAULT_MEDIUM,
                 keep: bool = False, clock=time.time, data_parallel_rank: int | None = None):
        self.publisher = publisher
        self.data_parallel_rank = data_parallel_rank  # several engines on one publisher: one rank each
        self.clock = clock  # the batches' timestamps
        self.block_size = block_size
        self.medium = medium
        self.keep = keep
        self.published: list[list] = []
        self._pending: list = []
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.blocks_stored = 0
        self.blocks_removed = 0
        self.batches = 0

    # ------------------------------------------------------------------ the pool's calls
    def stored(self, block_hash: int, parent_hash: int, token_ids) -> None:
        h = unsigned_hash(block_hash)
        parent = None if parent_hash == NO_HASH else unsigned_hash(parent_hash)
        self.blocks_stored += 1
        last = self._pending[-1] if self._pending else None
        if isinstance(last, BlockStored) and parent is not None and last.block_hashes[-1] == parent:
            last.block_hashes.append(h)
            last.token_ids.extend(int(t) for t in token_ids)
            return
        self._pending.append(BlockStored([h], parent, [int(t) for t in token_ids], self.block_size, None, self.medium))

    def removed(self, block_hash: int) -> None:
        self.blocks_removed += 1
        last = self._pending[-1] if self._pending else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(unsigned_hash(block_hash))
            return
        self._pending.append(BlockRemoved([unsigned_hash(block_hash)], self.medium))

    def cleared(self) -> None:
        self._pending.append(AllBlocksCleared())

    # ------------------------------------------------------------------ the engine's call
    def flush(self, ts: float | None = None) -> list:
        """Publish the step's events as one batch (nothing when there are none); returns them."""
        events, self._pending = self._pending, []
        if not events:
            return events
        for e in events:
            self.counts[type(e).__name__] += 1
        self.batches += 1
        if self.keep:
            self.published.append(events)
        if self.publisher is not None:
            self.publisher.publish(events, self.clock() if ts is None else ts, self.data_parallel_rank)
        return events

    def summary(self) -> dict:
        """What was published: endpoints, batches, events by type, blocks stored and removed."""
        pub = self.publisher
        return {"endpoint": pub.endpoint if pub else None, "replay": pub.replay_endpoint if pub else None,
                "batches": self.batches, "events": dict(self.counts),
                "blocks_stored": self.blocks_stored, "blocks_removed": self.blocks_removed}

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
