"""A trace written by a process of its own, so that a long run uses a second core for its trace.

Writing a trace costs about as much as the run it records: at 262,144 slots, encoding a step's
record, narrowing it to its file form and deflating it take about half of a ``simulate
--trace-out`` step. :class:`TraceWriterProcess` takes the engine's steps as a
:class:`~pagedkv_core.record.trace_file.TraceWriter` does, but only gathers each step's changed
values (the pool view's arrays move on with the next step) and packs them into one buffer
(:func:`pack_delta`); a child process holds the real TraceWriter and does the rest. The file is the same, byte for byte.

- **Bounded.** Steps go over a pipe in batches of :data:`BATCH_STEPS`; when the child falls
  behind, the pipe fills and the engine waits. Nothing piles up in memory.
- **Errors.** A file that cannot be opened fails in the constructor, as an ``OSError`` with the
  child's ``strerror``. A write that fails later (a full disk) is reported by the child at
  once; the parent raises it, one line, at its next batch or at :meth:`close`.
- **Ends.** :meth:`close` ends the file as TraceWriter does (the end line) and waits for the
  child. A parent that dies without closing leaves the child reading the end of its pipe: the
  child then closes the file, which loads up to its last step as a truncated trace. The child
  ignores Ctrl-C: the parent's ``close`` in its ``finally`` ends it.

:func:`open_trace_writer` picks: this where the process may run on more than one core and the
platform forks, a plain TraceWriter otherwise (one core gains nothing from a second process).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
from pathlib import Path

import numpy as np

from ..metrics import StepMetrics
from .recording import StepDelta, engine_step_delta

BATCH_STEPS = 16  # steps sent at once (one pipe write, one wake-up of the child)
_START, _HEADER, _REQUESTS, _DELTA, _FLUSH, _CLOSE, _RUN, _IDLE = range(8)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def open_trace_writer(path, header: dict | None = None):
    """A trace writer for an engine's run into ``path``: :class:`TraceWriterProcess` where a
    second core and ``fork`` are there, else a TraceWriter in this process. Either raises
    ``OSError`` when the file cannot be created."""
    if usable_cores() > 1 and can_fork():
        return TraceWriterProcess(path, header)
    from .trace_file import TraceWriter

    return TraceWriter(path, header)


_POOL_FIELDS = ("slot_idx", "slot_state", "slot_owner", "slot_token", "block_idx", "block_state", "block_ref",
                "block_fill", "block_hash")


def pack_delta(delta: StepDelta) -> tuple[bytes, bytes]:
    """A StepDelta as (its small parts pickled, its arrays' bytes end to end): taken now, so
    that nothing the engine changes later (its block tables are live lists) reaches the child.
    Measured at 262,144 slots: 52 µs a step paged, 30 contiguous, against 97 and 84 for pickling
    the delta whole (one buffer here, not an object per array)."""
    arrays = [getattr(delta, name) for name in _POOL_FIELDS]
    seq_names = list(delta.seqs)
    arrays += [np.asarray(delta.seqs[name]) for name in seq_names]
    if delta.table_ids is not None:
        arrays.append(delta.table_ids)
    layout = [(a.dtype.str, len(a)) for a in arrays]
    small = (delta.step, seq_names, layout, delta.table_ids is not None, delta.waiting, delta.running,
             delta.swapped, delta.events, delta.metrics.__dict__, delta.table_source)
    return pickle.dumps(small, protocol=pickle.HIGHEST_PROTOCOL), b"".join([a.tobytes() for a in arrays])


def unpack_delta(small: bytes, data: bytes) -> StepDelta:
    """The StepDelta :func:`pack_delta` took apart (its arrays writable views of one buffer)."""
    step, seq_names, layout, has_table_ids, waiting, running, swapped, events, metrics, table_source = pickle.loads(small)
    buffer = bytearray(data)
    arrays, at = [], 0
    for dtype, n in layout:
        a = np.frombuffer(buffer, dtype=dtype, count=n, offset=at)
        arrays.append(a)
        at += a.nbytes
    pool = dict(zip(_POOL_FIELDS, arrays))
    seqs = dict(zip(seq_names, arrays[len(_POOL_FIELDS):]))
    return StepDelta(step=step, **pool, seqs=seqs, waiting=waiting, running=running, swapped=swapped, events=events,
                     metrics=StepMetrics(**metrics), table_ids=arrays[-1] if has_table_ids else None,
                     table_source=table_source)


class TraceWriterError(RuntimeError):
    """The child could not write the trace (the message is one line)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _apply(writer, message: tuple) -> bool:
    """One message to the child's TraceWriter; True when it was the close."""
    kind = message[0]
    if kind == _DELTA:
        writer.append_delta(unpack_delta(message[1], message[2]))
    elif kind == _RUN:
        writer.record_decode_run(message[1], message[2])
    elif kind == _IDLE:
        writer.append_idle(message[1], message[2])
    elif kind == _START:
        writer.start(message[1], message[2], message[3])
    elif kind == _HEADER:
        writer.set_header(message[1])
    elif kind == _REQUESTS:
        writer.add_requests(message[1])
    elif kind == _FLUSH:
        writer.flush()
    elif kind == _CLOSE:
        writer.close(message[1])
        return True
    return False


def _serve(conn, parent_end, path, header: dict | None) -> None:
    """The child: a TraceWriter fed from ``conn`` until a close message or the pipe's end. After
    an error it reports it at once and reads on (the parent must never block on a full pipe)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's close ends us, not its Ctrl-C
    parent_end.close()  # forked with us: held here, the pipe would never end when the parent goes
    from .trace_file import TraceWriter

    try:
        writer = TraceWriter(path, header)
    except OSError as exc:
        conn.send(("oserror", exc.errno, exc.strerror or str(exc)))
        return
    conn.send(("ready",))
    failed = closed = False
    try:
        while not closed:
            try:
                batch = conn.recv()
            except EOFError:  # the parent is gone without closing: keep what was written
                break
            except Exception as exc:  # noqa: BLE001 - a message cut short (the parent interrupted mid-send)
                if not failed:
                    conn.send(("error", _one_line(exc)))
                failed = True
                break
            for message in batch:
                if failed:
                    closed = message[0] == _CLOSE
                    continue
                try:
                    closed = _apply(writer, message)
                except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
                    failed = True
                    closed = message[0] == _CLOSE
                    conn.send(("error", _one_line(exc)))
        if closed and not failed:
            conn.send(("closed",))
    finally:
        writer.abandon()  # closed already, unless the run ended without a close
        conn.close()


class TraceWriterProcess:
    """The engine-facing half of a trace written by a child process (see the module
    docstring): ``start``, ``record``, ``record_decode_run`` and ``append_idle`` as the engine calls them, ``set_header``,
    ``add_requests``, ``flush`` and ``close`` as a TraceWriter's."""

    def __init__(self, path, header: dict | None = None):
        self.path = Path(path)
        ctx = multiprocessing.get_context("fork")
        for stream in (sys.stdout, sys.stderr):  # the child would write out what they hold again
            stream.flush()
        self._conn, child_conn = ctx.Pipe()
        self._child = ctx.Process(target=_serve, args=(child_conn, self._conn, os.fspath(path), header), daemon=True,
                                  name="pagedkv-trace-writer")
        self._child.start()
        child_conn.close()
        self._batch: list[tuple] = []
        self._live: dict | None = None
        self._recorded = False
        self._closed = False
        reply = self._reply()
        if reply[0] == "oserror":
            self._child.join()
            self._closed = True
            raise OSError(reply[1], reply[2])

    def _reply(self) -> tuple:
        try:
            return self._conn.recv()
        except EOFError:
            self._child.join()
            raise TraceWriterError(f"the trace writer process ended (exit code {self._child.exitcode})") from None

    def _raise_if_failed(self) -> None:
        if self._conn.poll():
            reply = self._reply()
            if reply[0] == "error":
                self._abandon()
                raise TraceWriterError(f"writing the trace failed: {reply[1]}")

    def _send(self, message: tuple, now: bool = False) -> None:
        if self._closed:
            raise ValueError("the trace writer is closed")
        self._batch.append(message)
        if now or len(self._batch) >= BATCH_STEPS:
            self._raise_if_failed()
            batch, self._batch = self._batch, []
            try:
                self._conn.send(batch)
            except (BrokenPipeError, ConnectionResetError):
                self._abandon()
                raise TraceWriterError("the trace writer process is gone") from None

    def _abandon(self) -> None:
        self._closed = True
        self._conn.close()
        self._child.join(timeout=30)
        if self._child.is_alive():
            self._child.kill()
            self._child.join()

    # ------------------------------------------------------------------ what the engine calls
    def start(self, scalars: dict, arrays: dict | None = None, step: int = -1) -> None:
        """As Recorder.start: the pool's sizes and its arrays before the first step (copied for
        the child; the live ones are read at each :meth:`record`)."""
        self._live = arrays
        copies = None if arrays is None else {name: a.copy() for name, a in arrays.items()}
        self._send((_START, dict(scalars), copies, step))

    def record(self, step: int, changes, seqs: dict, events, metrics) -> None:
        """As Recorder.record: the step's values gathered and packed now, written by the child."""
        delta = engine_step_delta(step, self._live, changes, seqs, events, metrics)
        self._recorded = True
        self._send((_DELTA, *pack_delta(delta)))

    def record_decode_run(self, first_step: int, writes) -> None:
        """As Recorder.record_decode_run: what the run wrote (its own arrays, which the engine
        does not change later), written by the child as one frame."""
        self._recorded = True
        self._send((_RUN, first_step, writes))

    def append_idle(self, count: int, metrics) -> None:
        """As Recorder.append_idle: ``count`` steps that repeat the last one (an idle stretch)."""
        self._recorded = True
        self._send((_IDLE, count, metrics))

    # ------------------------------------------------------------------ a TraceWriter's others
    def set_header(self, header: dict) -> None:
        if self._recorded:
            raise ValueError("the trace header is already written")
        self._send((_HEADER, dict(header)))

    def add_requests(self, requests: list[dict]) -> None:
        self._send((_REQUESTS, list(requests)))

    def flush(self) -> None:
        self._send((_FLUSH,), now=True)

    def close(self, footer: dict | None = None) -> Path:
        """End the file (its end line) and wait for the child; raises TraceWriterError, one
        line, if the child could not write it."""
        if self._closed:
            return self.path
        self._send((_CLOSE, footer), now=True)
        reply = self._reply()
        self._abandon()
        if reply[0] == "error":
            raise TraceWriterError(f"writing the trace failed: {reply[1]}")
        return self.path

    def __enter__(self) -> "TraceWriterProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
