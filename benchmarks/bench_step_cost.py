"""Step cost against the batch: an engine step's CPU time with 1 to 1,024 sequences decoding.

Each case builds an engine (scripted source, block size 16, 1,048,576 slots, prefix caching on),
submits ``N`` requests with prompts of 8 to 40 tokens (seeded) and answers long enough to keep
all of them decoding, steps until every one decodes, then times ``STEPS`` steps with
``step(snapshot=False, outputs=False)`` as a replay takes them (CPU seconds of the process).
Three ways: ``plain`` (no pool view, nothing recorded: ``simulate`` without ``--trace-out``),
``recorded`` (an in-memory :class:`Recording` of every step) and ``traced`` (a trace file written
in this process, as ``simulate --trace-out`` writes it on one core: the step record narrowed and
deflated as well). The figures are the cost a step, the cost each running sequence adds to it (the
slope between 64 and 1,024 sequences) and, at one sequence, the floor: what a step costs whatever
it does.

A sequence that decodes into a block it holds alone (15 of every 16 tokens here) is taken by
whole columns (``pagedkv_core/running.py``); the slope that is left is the sequences that cross
a block boundary each step (1 in 8 of them: the token that fills a block is hashed for the
prefix cache, the next one gets a new block), each worked on alone, and appending each new
token to its sequence's list.

``--baseline COMMIT`` (default ``334a5fe``, the engine before the columns, checked out with
``git worktree add``) runs the same cases with that commit's engine, alternating with this one,
each in a fresh child process; medians of ``ROUNDS``.

    python -m benchmarks step-cost [--quick]
    python benchmarks/bench_step_cost.py [--rounds 3] [--no-baseline] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script too: benchmarks.* from this tree
BASELINE_COMMIT = "334a5fe"
SIZES = (1, 16, 64, 256, 1024)
SLOPE = (64, 1024)  # the sizes the per-sequence slope is taken between (quick: 16 and 64)
STEPS = 300
ROUNDS = 3
WAYS = ("plain", "recorded", "traced")

# Run in a child under a tree's root: prints {way: {n: microseconds per step}} as JSON.
CHILD = r"""
import json, os, sys, tempfile, time
import numpy as np
sys.path.insert(0, ".")
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.record.trace_file import TraceWriter
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource
sizes, steps, ways = json.loads(sys.argv[1])
out = {}
where = tempfile.mkdtemp()
for way in ways:
    out[way] = {}
    for n in sizes:
        rng = np.random.default_rng(n)
        trace = os.path.join(where, f"{n}.trace")
        rec = Recording() if way == "recorded" else TraceWriter(trace) if way == "traced" else None
        engine = Engine(EngineConfig(pool_slots=1 << 20, block_size=16, max_model_len=8192), ScriptedSource(),
                        recording=rec, snapshots=rec is not None)
        for i in range(n):
            prompt = rng.integers(3, 49152, size=int(rng.integers(8, 41))).tolist()
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4000), output_len=3000)
        for _ in range(5):
            engine.step(snapshot=False, outputs=False)
        assert len(engine.scheduler.running) == n, "not every sequence runs"
        t = time.process_time()
        for _ in range(steps):
            engine.step(snapshot=False, outputs=False)
        out[way][str(n)] = (time.process_time() - t) / steps * 1e6
        if way == "traced":
            rec.close()
            os.remove(trace)
os.rmdir(where)
print(json.dumps(out))
"""


def _measure(root: Path, sizes, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([list(sizes), steps, list(WAYS)])], cwd=root,
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _slope(costs: dict, lo: int, hi: int) -> float:
    return (costs[str(hi)] - costs[str(lo)]) / (hi - lo)


def run(quick: bool = False, rounds: int = ROUNDS, baseline: str | None = BASELINE_COMMIT) -> dict:
    from benchmarks.bench_replay_speed import baseline_root, cpu_info

    sizes, steps = ((1, 16, 64), 30) if quick else (SIZES, STEPS)
    rounds = 1 if quick else rounds
    roots = {"this engine": ROOT}
    base = baseline_root(baseline) if baseline else None
    if base is not None:
        roots[f"commit {baseline}"] = base
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in roots}
    for _ in range(rounds):  # alternating, so that a change in the machine's speed hits both
        for name, root in roots.items():
            runs[name].append(_measure(root, sizes, steps))
    lo, hi = (16, 64) if quick else SLOPE
    engines = {}
    for name, got in runs.items():
        med = {way: {str(n): round(statistics.median(r[way][str(n)] for r in got), 1) for n in sizes} for way in WAYS}
        engines[name] = {"us_per_step": med,
                         "us_per_sequence": {way: round(_slope(med[way], lo, hi), 3) for way in WAYS},
                         "rounds": got}
    result = {
        "setup": {"sizes": list(sizes), "steps": steps, "rounds": rounds, "block_size": 16, "pool_slots": 1 << 20,
                  "token_source": "scripted", "prefix_caching": True, "slope_between": [lo, hi],
                  "baseline": baseline if base is not None else None},
        **cpu_info(),
        "load_average_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "engines": engines,
        "targets": [],  # figures to report: the target here is the structure (see the module docstring)
    }
    if base is not None:
        this, old = engines["this engine"], engines[f"commit {baseline}"]
        result["ratio_per_sequence"] = {way: round(old["us_per_sequence"][way] / this["us_per_sequence"][way], 2)
                                        for way in WAYS if this["us_per_sequence"][way] > 0}
    return result


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    sizes = result["setup"]["sizes"]
    rows = []
    for name, e in result["engines"].items():
        for way in WAYS:
            rows.append({"engine": name, "way": way,
                         **{f"{n} seqs (µs/step)": e["us_per_step"][way][str(n)] for n in sizes},
                         "µs per sequence": e["us_per_sequence"][way]})
    print_table(rows, ["engine", "way", *[f"{n} seqs (µs/step)" for n in sizes], "µs per sequence"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--baseline", default=BASELINE_COMMIT, help="the older engine's commit")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", type=Path, default=None, help="where step-cost.json goes (default benchmarks/results)")
    args = p.parse_args(argv)
    from benchmarks.common import write_result

    result = run(quick=args.quick, rounds=args.rounds, baseline=None if args.no_baseline else args.baseline)
    print_result(result)
    cmd = "python benchmarks/bench_step_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"wrote {write_result('step-cost', {'command': cmd.strip(), 'quick': args.quick, **result}, out_dir=args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
