"""How many steps of a whole request log hold nothing but decodes: what coalescing could take.

Issue 55 suggests that steps in which nothing happens but plain decodes be coalesced and recorded
as one run. This counts, for ``bench replay-speed``'s logs (at its 262,144 slots, paged, the
scripted source), the steps in which sequences run and no event happens at all (no arrival,
admission, new block, cache hit, finish, preemption or swap), and how they lie: a stretch of k
such steps could pass as one, so it saves k - 1. Counted through the engine's recording
interface (a recorder that keeps nothing but the events' count), so the engine runs as
``simulate --trace-out`` runs it. An upper bound: a step without events may still fill a block
(hashed and indexed), which is not a plain decode. ``Engine(coalesce=True)`` takes such stretches in
one call where no trace is written (``simulate`` without ``--trace-out``): on the whole Mooncake
log it takes 30,578 steps so (README, *Whole request logs*).

    python benchmarks/quiet_steps.py [--log azure-conv] [--count N] [--out FILE]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.whole_logs import log_parser, parse, stream_log, write_result  # noqa: E402
from pagedkv_core.engine import Engine  # noqa: E402
from pagedkv_core.sources.scripted import ScriptedSource  # noqa: E402
from pagedkv_core.workloads.scenarios import LogStream  # noqa: E402


class QuietSteps:
    """A recording (``start`` and ``record``, as the engine calls them) that keeps only where
    the steps without events lie."""

    def __init__(self):
        self.steps = self.busy = self.quiet = 0
        self.stretches: list[int] = []  # lengths of the stretches of quiet steps, in order
        self._open = 0

    def start(self, scalars: dict, arrays=None, step: int = -1) -> None:
        pass

    def record(self, step: int, changes, seqs: dict, events, metrics) -> None:
        self.steps += 1
        busy = metrics.num_running > 0
        self.busy += busy
        if busy and not events:
            self.quiet += 1
            self._open += 1
        else:
            self._close()

    def _close(self) -> None:
        if self._open:
            self.stretches.append(self._open)
            self._open = 0

    def result(self) -> dict:
        self._close()
        long = [k for k in self.stretches if k >= 2]
        saved = sum(long) - len(long)
        return {"steps": self.steps, "busy_steps": self.busy, "quiet_busy_steps": self.quiet,
                "quiet_stretches": len(self.stretches), "longest_stretch": max(self.stretches, default=0),
                "steps_in_stretches_of_2_or_more": sum(long), "steps_coalescing_could_save": saved,
                "share_of_busy_steps_saved": round(saved / self.busy, 4) if self.busy else 0.0}


def count(log: str, requests: int | None = None) -> dict:
    workload, config = stream_log(log, requests)
    counter = QuietSteps()
    engine = Engine(config, ScriptedSource(), recording=counter, snapshots=False, skip_idle=True)
    if isinstance(workload, LogStream):
        engine.feed(workload.requests())
    else:
        workload.submit(engine)
    t = time.perf_counter()
    engine.run(snapshot=False)
    return {"log": log, "requests": requests or "all", "block_size": config.block_size, "pool_slots": config.pool_slots,
            "seconds": round(time.perf_counter() - t, 1), **counter.result()}


def main(argv: list[str] | None = None) -> int:
    args = parse(log_parser(__doc__), argv)
    rows = [count(log, args.count) for log in args.log]
    for r in rows:
        print(f"{r['log']}: {r['busy_steps']:,} busy steps, {r['quiet_busy_steps']:,} without events in "
              f"{r['quiet_stretches']:,} stretches (longest {r['longest_stretch']}); coalescing could save "
              f"{r['steps_coalescing_could_save']:,} steps ({r['share_of_busy_steps_saved']:.1%} of the busy ones)")
    write_result("quiet_steps.py", "steps without events in whole request logs (what coalescing could take)", argv,
                 rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
