"""A run's progress as one line on a terminal, for the commands that run long (``simulate`` of a
whole request log takes a minute or more)."""
from __future__ import annotations

import time

EVERY_S = 0.5  # the line is redrawn at most this often


class ProgressLine:
    """Called with the engine after each step; draws one line on ``stream`` (a terminal's
    stderr) at the first step and then at most every ``every_s`` seconds; :meth:`clear` removes
    it at the end."""

    def __init__(self, stream, every_s: float = EVERY_S, clock=time.monotonic):
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self._last = None  # the first step draws at once
        self.drawn = False

    def __call__(self, engine) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        ended = engine.num_finished + engine.num_rejected
        sched = engine.scheduler
        text = (f"step {engine.step_index:,}: {ended:,} of the {engine.num_requests:,} requests submitted so far have "
                f"ended, {len(sched.running):,} running, {len(sched.waiting):,} waiting ({now - self.start:,.0f} s)")
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False
