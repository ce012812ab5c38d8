"""benchmarks/quiet_steps.py: the steps without events, counted through the recording interface,
equal those a full snapshot of every step shows."""
from __future__ import annotations

from benchmarks.quiet_steps import QuietSteps
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource

REQUESTS = [("a", 8, 40, 0), ("b", 20, 9, 3), ("c", 5, 30, 30)]  # id, prompt, answer, arrival step


def _engine(recording=None) -> Engine:
    engine = Engine(EngineConfig(pool_slots=1024, block_size=16), ScriptedSource(), recording=recording,
                    snapshots=recording is None)
    for rid, prompt, answer, arrival in REQUESTS:
        engine.add_request(rid, list(range(3, 3 + prompt)), SamplingParams(max_tokens=answer), output_len=answer,
                           arrival_step=arrival)
    return engine


def test_quiet_steps_are_the_steps_whose_snapshot_has_running_sequences_and_no_event():
    counter = QuietSteps()
    _engine(counter).run(snapshot=False)
    got = counter.result()

    snaps = []
    _engine().run(on_step=lambda outputs, snap: snaps.append(snap))
    quiet = [bool(s.metrics.num_running) and not s.events for s in snaps]
    stretches, k = [], 0
    for q in [*quiet, False]:
        if q:
            k += 1
        elif k:
            stretches.append(k)
            k = 0
    assert got["steps"] == len(snaps) == 60  # c arrives at step 30; its 30 tokens come in steps 30 to 59
    assert got["busy_steps"] == sum(bool(s.metrics.num_running) for s in snaps)
    assert got["quiet_busy_steps"] == sum(quiet) and got["quiet_stretches"] == len(stretches)
    assert got["longest_stretch"] == max(stretches)
    long = [k for k in stretches if k >= 2]
    assert got["steps_coalescing_could_save"] == sum(long) - len(long) > 0
    # every block boundary, admission and finish is an event: with block size 16 no stretch reaches 16 steps
    assert got["longest_stretch"] < 16


def test_the_benchmark_table_reports_each_log():
    from benchmarks import report

    counter = QuietSteps()
    _engine(counter).run(snapshot=False)
    row = {"log": "tiny", "block_size": 16, **counter.result()}
    rows = report._rows("quiet-steps", {"rows": [row, {**row, "log": "other"}]})
    assert [r[0].split("`")[1] for r in rows] == ["tiny", "other"]
    assert rows[0][1].startswith(f"{row['steps_coalescing_could_save']} of {row['busy_steps']} busy steps")
