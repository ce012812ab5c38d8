"""Live real-model runs stepped off the page's thread, so that the page draws one step while the
engines compute the next ones.

A page that played a live pair used to step both engines, one after the other, inside its
fragment, and draw only then: every frame paid for two forwards and the figures in turn. A
:class:`LiveStepper` instead keeps its runs stepping on a thread of its own, up to the step the
page asked for (:meth:`LiveStepper.advance`: the step it wants to show next, plus a lookahead),
and the page draws whatever is recorded by then. Each step is a task on :func:`forward_pool`, a
process-wide pool with one worker per core: the page's engines step in lockstep, their forwards
as one (``together``, :func:`ui.models.step_together`: the model's weights read once a step for
both), and torch releases the GIL inside its kernels, so however many sessions play at once, no
more forwards run than there are cores (each on the threads its share of the cores allows, see
:class:`ui.models.CoreShare`). Without ``together`` each engine's step is a task of its own.

The stepping thread exists only while there is work: it ends when every run has reached the step
asked for (a paused player, a closed tab) or has ended, so an abandoned session costs at most its
lookahead. The runs' recordings are written under each run's lock (:class:`GuardedRecording`),
which is the lock :class:`ui.runs.model.Run` reads them under.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pagedkv_core.record.recording import Recording
from ui.runs.model import still_stepping

ADVANCE_TIMEOUT_S = 60.0  # the longest a page waits for a step it asked for (a first prefill on a busy machine)

_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def forward_pool() -> ThreadPoolExecutor:
    """The process-wide pool the live engines' steps run on: one worker per core this process
    may use (``available_cores``: at most ``OMP_NUM_THREADS``), shared by every session."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from pagedkv_core.sources.model.runner import available_cores

            _POOL = ThreadPoolExecutor(max_workers=available_cores(), thread_name_prefix="pagedkv-forward")
        return _POOL


class GuardedRecording(Recording):
    """A recording that one thread writes (the engine's ``record`` each step) while others read
    it: every write holds :attr:`lock`, and readers take the same lock (``Run`` does)."""

    def __init__(self, keyframe_every: int | None = None):
        super().__init__(keyframe_every)
        self.lock = threading.RLock()

    def __getstate__(self) -> dict:  # a stored run's recording (ui.run_store): the steps, not the lock
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()

    def start(self, *args, **kwargs) -> None:
        with self.lock:
            super().start(*args, **kwargs)

    def record(self, *args, **kwargs) -> None:
        with self.lock:
            super().record(*args, **kwargs)


class LiveStepper:
    """Steps ``runs`` (live :class:`ui.runs.live.LiveRun` objects: an ``engine`` while they run) ahead of
    the page. ``after_step(runs)`` is called on the stepping thread after every step of the
    group (it finishes the runs that ended and stops those past their memory budget; it must not
    touch Streamlit). A run steps while ``run.engine`` is set and ``run.done`` is false.
    ``together(engines)``, if given, steps several engines at once, as one task on the forward
    pool (:func:`ui.models.step_together`: their forwards as one); without it each engine's step
    is a task of its own, side by side."""

    def __init__(self, runs: list, after_step: Callable[[list], None],
                 together: Callable[[list], None] | None = None):
        self.runs = list(runs)
        self._after_step = after_step
        self._together = together  # steps several engines at once (their forwards as one), if given
        self._cond = threading.Condition()
        self._target = -1  # the last step the runs should record
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.steps_taken = 0

    def _behind(self, step: int) -> list:
        return [r for r in self.runs if still_stepping(r) and r.num_steps <= step]

    def advance(self, to_step: int, *, ahead: int = 0, timeout: float = ADVANCE_TIMEOUT_S) -> bool:
        """Keep the runs stepping until each has recorded ``to_step + ahead`` (or ended), and
        return once each has recorded ``to_step`` (or ended): True then, False after ``timeout``
        seconds. A lower target than before stops the stepping there (the page paused).
        Re-raises, on the caller's thread, an error a step raised."""
        to_step, ahead = int(to_step), max(0, int(ahead))
        with self._cond:
            self._raise_error()
            self._target = to_step + ahead
            if self._thread is None and self._behind(self._target):
                self._thread = threading.Thread(target=self._loop, name="pagedkv-live-stepper", daemon=True)
                self._thread.start()
            deadline = time.monotonic() + timeout
            while self._behind(to_step) and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0 or (self._thread is None and self._behind(to_step)):
                    return not self._behind(to_step)
                self._cond.wait(left)
            self._raise_error()
            return True

    def cancel(self) -> None:
        """Stop after the step in progress (the runs were replaced)."""
        with self._cond:
            self._target = -1

    @property
    def stepping(self) -> bool:
        """Whether the stepping thread is running now."""
        return self._thread is not None

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _loop(self) -> None:
        pool = forward_pool()
        try:
            while True:
                with self._cond:
                    todo = self._behind(self._target)
                    if not todo:
                        self._thread = None
                        self._cond.notify_all()
                        return
                if self._together is not None and len(todo) > 1:
                    futures = [pool.submit(self._together, [run.engine for run in todo])]
                else:
                    futures = [pool.submit(run.engine.step, snapshot=False) for run in todo]
                errors = [f.exception() for f in futures]
                self.steps_taken += 1
                first_error = next((e for e in errors if e is not None), None)
                if first_error is not None:
                    raise first_error
                self._after_step(self.runs)
                with self._cond:
                    self._cond.notify_all()
        except BaseException as exc:  # shown on the page by the next advance()
            with self._cond:
                self._error = exc
                self._thread = None
                self._cond.notify_all()
