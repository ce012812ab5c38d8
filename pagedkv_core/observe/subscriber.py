"""ZMQ subscription to one or more event streams, with gaps filled from the replay socket.

A stream is a PUB socket sending ``[topic, seq, payload]`` (``seq``: 8 bytes, big-endian, one per
batch). The subscriber keeps the next sequence it expects per stream; a message past it means
batches were lost (the SUB socket's queue overflowed, or we joined late), and the missing ones
are asked of the stream's ROUTER replay socket: we send ``[b"", start_seq]`` and read ``(seq,
payload)`` replies, with or without a topic frame, until seq -1. Every wait here is bounded by
``replay_timeout``; a replay that does not answer leaves the batches counted as ``missed``.
A frame that is not one of these shapes is counted as ``malformed`` and dropped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import zmq

from .discovery import EventSource
from .wire import END_SEQ, WireError, seq_bytes, seq_of

MAX_FRAMES_PER_POLL = 10_000


@dataclass
class Received:
    source: int  # index into the subscriber's sources
    seq: int
    payload: bytes
    replayed: bool = False


@dataclass
class SubscriberStats:
    frames: int = 0  # messages received live
    malformed: int = 0  # messages of the wrong shape
    gaps: int = 0  # jumps in a stream's sequence
    replayed: int = 0  # batches recovered from a replay socket
    missed: int = 0  # batches lost for good (no replay socket, or it did not have them)
    duplicates: int = 0  # batches seen twice (a replay overlapping live messages)
    before_start: int = 0  # batches sent before we listened that no replay gave back


def split_frames(frames: list[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of ``[topic, seq, payload]`` or ``[seq, payload]``, leading empty frames
    (a ROUTER's delimiter) skipped. WireError when it is neither."""
    while len(frames) > 2 and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        frames = frames[1:]
    if len(frames) != 2:
        raise WireError(f"expected [topic, seq, payload] or [seq, payload], got {len(frames)} frames")
    return seq_of(frames[0]), frames[1]


@dataclass
class _Stream:
    source: EventSource
    sub: zmq.Socket
    replay: zmq.Socket | None = None
    expected: int | None = None
    pending: list = field(default_factory=list)


class Subscriber:
    """SUB sockets on every source's endpoint. ``poll(timeout)`` returns the batches received,
    in order per stream, gaps filled where the replay socket can. ``catch_up``: on the first
    message of a stream, ask the replay socket for everything before it (the cache as it was
    before we listened, as far as the server's buffer reaches)."""

    def __init__(self, sources: list[EventSource], context: zmq.Context | None = None, replay_timeout: float = 2.0,
                 catch_up: bool = True):
        if not sources:
            raise ValueError("no event sources to subscribe to")
        self.sources = list(sources)
        self.context = context or zmq.Context.instance()
        self.replay_timeout = replay_timeout
        self.catch_up = catch_up
        self.stats = SubscriberStats()
        self.poller = zmq.Poller()
        self._streams: list[_Stream] = []
        self._by_socket: dict[zmq.Socket, int] = {}
        try:
            for i, source in enumerate(self.sources):
                sub = self.context.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.RCVHWM, 100_000)
                sub.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
                sub.connect(source.endpoint)
                self._streams.append(_Stream(source, sub))
                self._by_socket[sub] = i
                self.poller.register(sub, zmq.POLLIN)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"cannot subscribe to {source.endpoint}: {exc}") from None

    # ------------------------------------------------------------------ receiving
    def poll(self, timeout: float = 0.1) -> list[Received]:
        """Batches that arrived within ``timeout`` seconds (returns as soon as any did)."""
        out: list[Received] = []
        ready = dict(self.poller.poll(int(timeout * 1000)))
        for sock in ready:
            i = self._by_socket[sock]
            for _ in range(MAX_FRAMES_PER_POLL):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                out.extend(self.take(i, frames))
        return out

    def catch_up_now(self) -> list[Received]:
        """Ask every stream's replay socket for all it still has, before any live message: the
        cache as it was before we listened. Streams without a replay socket are left as they are."""
        out: list[Received] = []
        for i, stream in enumerate(self._streams):
            if stream.expected is None and stream.source.replay:
                got = self._replay(stream, i, 0, 1 << 62)
                if got:
                    stream.expected = got[-1].seq + 1
                out.extend(got)
        return out

    def take(self, i: int, frames: list[bytes]) -> list[Received]:
        """One live message of stream ``i``: the batches it makes available (none when it is
        malformed or a duplicate; several when it revealed a gap that the replay filled)."""
        self.stats.frames += 1
        try:
            seq, payload = split_frames(frames)
        except WireError:
            self.stats.malformed += 1
            return []
        return self._accept(i, seq, payload)

    def next_seq(self, i: int = 0) -> int | None:
        """The sequence number stream ``i`` expects next (None before its first message)."""
        return self._streams[i].expected

    def _accept(self, i: int, seq: int, payload: bytes) -> list[Received]:
        stream = self._streams[i]
        out: list[Received] = []
        if seq < 0:
            self.stats.malformed += 1
            return out
        if stream.expected is None:
            if self.catch_up and seq > 0 and stream.source.replay:
                out.extend(self._replay(stream, i, 0, seq))
            self.stats.before_start += seq - len(out)
        elif seq < stream.expected:
            self.stats.duplicates += 1
            return out
        elif seq > stream.expected:
            self.stats.gaps += 1
            got = self._replay(stream, i, stream.expected, seq) if stream.source.replay else []
            self.stats.missed += (seq - stream.expected) - len(got)
            out.extend(got)
        out.append(Received(i, seq, payload))
        stream.expected = seq + 1
        return out

    def _replay_socket(self, stream: _Stream) -> zmq.Socket:
        if stream.replay is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(stream.source.replay)
            stream.replay = sock
        return stream.replay

    def _drop_replay_socket(self, stream: _Stream) -> None:
        if stream.replay is not None:
            stream.replay.close(0)
            stream.replay = None

    def _replay(self, stream: _Stream, i: int, start: int, stop: int) -> list[Received]:
        """Batches ``start <= seq < stop`` from the replay socket (what it still has)."""
        sock = self._replay_socket(stream)
        got: dict[int, bytes] = {}
        try:
            sock.send_multipart([b"", seq_bytes(start)], zmq.NOBLOCK)
        except zmq.ZMQError:
            self._drop_replay_socket(stream)
            return []
        deadline = time.monotonic() + self.replay_timeout
        for _ in range(max(stop - start, 0) + MAX_FRAMES_PER_POLL):  # a replay that never ends is cut off
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000), zmq.POLLIN):
                self._drop_replay_socket(stream)  # a late answer must not reach the next replay
                break
            try:
                seq, payload = split_frames(sock.recv_multipart(zmq.NOBLOCK))
            except WireError:
                self.stats.malformed += 1
                continue
            except zmq.Again:
                continue
            if seq == END_SEQ:
                break
            if start <= seq < stop:
                got[seq] = payload
            deadline = time.monotonic() + self.replay_timeout  # progress: wait again
        self.stats.replayed += len(got)
        return [Received(i, s, got[s], True) for s in sorted(got)]

    def close(self) -> None:
        for stream in self._streams:
            try:
                self.poller.unregister(stream.sub)
            except KeyError:
                pass
            stream.sub.close(0)
            self._drop_replay_socket(stream)
        self._streams = []
        self._by_socket = {}

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
