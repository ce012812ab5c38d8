"""The run model: one engine run as the pages read it (:class:`Run`), what it holds in bytes,
and how the pages name its allocator. No Streamlit here.

A run keeps its steps as a delta-encoded :class:`~pagedkv_core.record.recording.Recording`
(what changed each step, a keyframe every K steps), never one full snapshot per step, and knows
its size in bytes (:attr:`Run.nbytes`). :class:`Run`'s fields apply to every run; what only one
kind of run has lives on that kind's class: :class:`ui.runs.scripted.ScriptedRun` (its memory-waste
breakdown) and :class:`ui.runs.live.LiveRun` (its model's token texts, KV pools and answers).
"""
from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import Event
from pagedkv_core.kv.registry import allocator_kind
from pagedkv_core.record.recording import Recording, pool_bytes
from pagedkv_core.record.snapshot import ARRAY_FIELDS, StepSnapshot
from pagedkv_core.record.trace_file import write_recording

CACHED_SNAPSHOTS = 2  # full snapshots a run keeps rebuilt (a page asks for step 0 and the shown step in turn)
# Python objects of a paged allocator per block (free-list node, holder list, fill, host pool):
# measured 225 B at 1,048,576 slots, both at block size 1 and 16.
ENGINE_BYTES_PER_BLOCK = 240
BASELINE_LABELS = {
    "contiguous": "Orca Max",
    "contiguous-pow2": "Orca Pow2",
    "contiguous-oracle": "Orca Oracle",
    "paged": "vLLM (paged)",
}
RESERVES = {
    "contiguous": "reserves prompt + max_tokens",
    "contiguous-pow2": "reserves prompt + the answer's length rounded up to a power of two",
    "contiguous-oracle": "reserves prompt + exactly the answer's length",
}


def allocator_title(allocator: str, block_size: int = 1) -> str:
    """How the pages head an allocator's side: "Contiguous (Orca Max)", "Paged (blocks of 16)"
    (what each contiguous policy reserves is :data:`RESERVES`)."""
    if allocator_kind(allocator) == "paged":
        return f"Paged (blocks of {block_size})"
    return f"Contiguous ({BASELINE_LABELS.get(allocator, allocator)})"


def still_stepping(run) -> bool:
    """Whether ``run`` still steps: an engine records it and not every request has ended (a live
    run while it runs; a recorded or finished run does not)."""
    return getattr(run, "engine", None) is not None and not run.done


def _snapshot_bytes(snap: StepSnapshot) -> int:
    return sum(getattr(snap, name).nbytes for name in ARRAY_FIELDS)


@dataclass(eq=False)
class Run:
    """One engine run: its recorded steps, the request ids by index (the owner ids in snapshots),
    its trace header, the engine that records it while it runs, and how it ended.

    Pages and figures read the steps only through :attr:`num_steps`, :meth:`at` (a full
    snapshot, rebuilt from the recording) and :meth:`step_events` / :meth:`events` (which decode
    a step's events without rebuilding its arrays). :meth:`at` is safe from several sessions at
    once (a process-wide run is shared): the recording's cursor moves under a lock and the
    snapshots it returns are copies.
    """

    label: str
    config: EngineConfig
    request_ids: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)  # the trace header (requests' prompts as int32 arrays)
    done: bool = False  # every request ended
    engine: Engine | None = None  # the engine recording this run while it steps; None once let go (or a replay)
    recording: Recording = field(default_factory=Recording, repr=False)
    stopped: str = ""  # why the run was stopped before its end ("" = it was not, or ran out of steps)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _snaps: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)

    def __post_init__(self) -> None:
        # A recording that another thread writes (a live run's, see ui.live_stepper) brings the
        # lock it is written under: reading it under the same lock sees whole steps only.
        self._lock = getattr(self.recording, "lock", None) or self._lock

    def __getstate__(self) -> dict:
        """What a stored run keeps (:mod:`ui.run_store`): its recorded steps and facts, not its lock
        or the snapshots rebuilt from the steps. A run still holding its engine is not stored."""
        if self.engine is not None:
            raise TypeError(f"run {self.label!r} still holds its engine: release it before storing it")
        state = dict(self.__dict__)
        del state["_lock"]
        state["_snaps"] = OrderedDict()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self.__post_init__()

    @property
    def allocator(self) -> str:
        """The allocator's registry name (``paged``, ``contiguous``, ``contiguous-pow2``, ...)."""
        return self.config.allocator

    @property
    def kind(self) -> str:
        """How the allocator lays sequences out: "paged" or "contiguous"."""
        return allocator_kind(self.config.allocator)

    @property
    def num_steps(self) -> int:
        return self.recording.num_steps

    def _index(self, step: int) -> int:
        if not self.recording.num_steps:
            raise IndexError(f"run {self.label!r} has no steps yet")
        return max(0, min(int(step), self.recording.num_steps - 1))

    def at(self, step: int) -> StepSnapshot:
        """The snapshot at ``step``, clamped to the steps recorded (the last one when this run
        ended earlier). IndexError when nothing is recorded yet."""
        i = self._index(step)
        with self._lock:
            snap = self._snaps.get(i)
            if snap is None:
                snap = self.recording.at(self.recording.first_step + i)
                self._snaps[i] = snap
                while len(self._snaps) > CACHED_SNAPSHOTS:
                    self._snaps.popitem(last=False)
            else:
                self._snaps.move_to_end(i)
            return snap

    def step_events(self, step: int) -> tuple[Event, ...]:
        """The events of ``step`` (clamped like :meth:`at`), without rebuilding its arrays."""
        i = self._index(step)
        with self._lock:
            return self.recording.events(self.recording.first_step + i)

    def events(self, *kinds: str, upto: int | None = None) -> list[tuple[int, Event]]:
        """(step, event) of the given kinds (all kinds when none given), in order, up to ``upto``."""
        last = self.num_steps if upto is None else min(upto + 1, self.num_steps)
        out = []
        for i in range(last):
            out += [(i, e) for e in self.step_events(i) if not kinds or e.kind in kinds]
        return out

    def first(self, predicate, start: int = 0) -> int | None:
        """The first step from ``start`` whose snapshot satisfies ``predicate``, or None. The
        predicate sees each step's arrays in place (no copy), so it must not keep the snapshot."""
        rec = self.recording
        with self._lock:
            for i in range(max(0, start), rec.num_steps):
                snap = rec.at(rec.first_step + i, copy=False)
                if predicate(snap):
                    return snap.step
        return None

    def metric(self, name: str, *, steps: int | None = None, empty_as_none: bool = False) -> list:
        """One StepMetrics field per step, padded with None to ``steps``; ``empty_as_none``: None
        where nothing was allocated (a ratio of nothing)."""
        with self._lock:
            values = self.recording.metrics_series(name).tolist() if self.num_steps else []
            empty = (self.recording.metrics_series("allocated_slots") == 0).tolist() if empty_as_none and values else []
        if empty:
            values = [None if e else v for v, e in zip(values, empty)]
        n = len(values) if steps is None else steps
        return values[:n] + [None] * (n - len(values))

    def _snapshot_bytes(self) -> int:
        """One rebuilt snapshot: the largest kept so far, or the pool's arrays before any."""
        kept = [_snapshot_bytes(s) for s in list(self._snaps.values())]
        scalars = self.recording.scalars or {}
        return max(kept, default=pool_bytes(scalars.get("num_slots", 0), scalars.get("num_blocks", 0)))

    @property
    def nbytes(self) -> int:
        """What this run holds: its recording, the snapshots it keeps rebuilt (counted full, so
        the figure is known up front), its header, and its engine's allocator arrays while it
        holds one."""
        held = self.recording.nbytes + CACHED_SNAPSHOTS * self._snapshot_bytes()
        held += sum(np.asarray(r.get("prompt", ())).nbytes for r in self.header.get("requests", ()))
        if self.engine is not None:
            held += engine_bytes(self.config)
        return held

    def trace_bytes(self) -> bytes:
        """This run as a trace, in the current version (see :mod:`pagedkv_core.record.trace_file`)."""
        with tempfile.TemporaryDirectory() as d, self._lock:
            path = write_recording(Path(d) / "trace.jsonl", self.recording, json_header(self.header))
            return path.read_bytes()


def engine_bytes(config: EngineConfig) -> int:
    """An engine's allocator state: its per-slot and per-block arrays (9 B a slot, 15 B a block)
    and, for a paged pool, the Python bookkeeping of every device and host block."""
    paged = allocator_kind(config.allocator) == "paged"
    blocks = config.num_blocks if paged else 0
    host_blocks = config.num_host_blocks if paged else 0
    return pool_bytes(config.pool_slots, blocks) + ENGINE_BYTES_PER_BLOCK * (blocks + host_blocks)


def compact_header(engine: Engine) -> dict:
    """The engine's trace header with each prompt as an int32 array (a list of Python ints costs
    9 times as much; :func:`json_header` turns them back into lists for a download)."""
    header = engine.trace_header()
    for r in header["requests"]:
        r["prompt"] = np.asarray(r["prompt"], dtype=np.int32)
    return header


def json_header(header: dict) -> dict:
    if not header.get("requests"):
        return header
    return {**header, "requests": [{**r, "prompt": np.asarray(r.get("prompt", ())).tolist()} for r in header["requests"]]}
