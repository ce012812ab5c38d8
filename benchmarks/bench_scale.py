"""Scale: recordings of real traffic into production-sized pools, in bounded memory.

The Azure LLM inference trace 2023 (conversation service; ``azure-conv``: 1,000 requests,
mean prompt about 1,000 tokens, mean answer about 250) runs on the scripted source into pools
of 65,536, 262,144 and 1,048,576 slots, paged (block size 16) and contiguous (Orca Max), with a
delta-encoded :class:`~pagedkv_core.record.recording.Recording` on. Each run is its own child process,
so its peak RSS is its own. Figures:

- recording speed: engine steps per second with the recording on (the whole step: scheduling,
  the scripted source, bookkeeping and recording);
- peak RSS and the recording's bytes for a run of up to 5,000 steps;
- the size of the same run written as a version-2 trace (streamed while it runs);
- scrub latency at 1,048,576 slots: server time to rebuild a random step from the recording
  and build its level-of-detail heatmap, serialized as Streamlit sends it (median of 50).

    .venv/bin/python -m benchmarks scale
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

POOLS = (65_536, 262_144, 1_048_576)
ALLOCATORS = ("paged", "contiguous")
MAX_STEPS = 5000
WORKLOAD = "azure-conv"
TARGETS = {
    "recording_steps_per_s_262144": 2000.0,  # at least
    "peak_rss_mb_262144": 300.0,  # at most
    "trace_mb_262144": 50.0,  # at most
    "scrub_ms_1048576": 100.0,  # at most (median)
}


def child(pool: int, allocator: str, mode: str, max_steps: int, workload: str) -> dict:
    """One run in this process: ``mode`` is "memory" (a Recording) or "trace" (a TraceWriter)."""
    from benchmarks.common import peak_rss, rss_bytes
    from pagedkv_core.config import EngineConfig
    from pagedkv_core.engine import Engine
    from pagedkv_core.record.recording import Recording
    from pagedkv_core.sources.scripted import ScriptedSource
    from pagedkv_core.record.trace_file import TraceWriter
    from pagedkv_core.workloads.scenarios import build_workload

    w = build_workload(workload)
    before = rss_bytes()
    out: dict = {"pool_slots": pool, "allocator": allocator, "mode": mode}
    with tempfile.TemporaryDirectory() as d, peak_rss() as peak:
        path = Path(d) / "run.trace"
        rec = Recording() if mode != "trace" else TraceWriter(path)
        engine = Engine(EngineConfig(allocator=allocator, pool_slots=pool), ScriptedSource(), recording=rec)
        w.submit(engine)
        if mode == "trace":
            rec.set_header(engine.trace_header())
        t0 = time.perf_counter()
        steps = 0
        while engine.has_unfinished() and steps < max_steps:
            engine.step(snapshot=False, outputs=False)  # as the app's scripted runs (ui/runs/scripted.py)
            steps += 1
        elapsed = time.perf_counter() - t0
        if mode == "trace":
            rec.close({"summary": engine.summary().to_json()})
            out["trace_bytes"] = path.stat().st_size
        else:
            out["recording_bytes"] = rec.nbytes
        if mode == "scrub":
            out.update(scrub(rec, engine))
    out.update(steps=steps, finished=not engine.has_unfinished(), steps_per_s=steps / elapsed,
               peak_rss_bytes=peak["peak"], rss_before_bytes=before)
    return out


def scrub(rec, engine, samples: int = 50) -> dict:
    """Median server time to rebuild a random step and draw it (cells, figure, JSON)."""
    import numpy as np

    from ui.pool_cells import pool_cells, pool_heatmap

    ids = list(engine.requests)
    rng = np.random.default_rng(0)
    steps = rng.integers(0, rec.num_steps, samples)
    rebuild, draw = [], []
    for s in steps:
        t0 = time.perf_counter()
        snap = rec.at(int(s), copy=False)
        t1 = time.perf_counter()
        cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
        payload = pool_heatmap(cells, f"step {s}", ids, snapshot=snap).to_json()
        t2 = time.perf_counter()
        rebuild.append(t1 - t0)
        draw.append(t2 - t1)
    total = np.add(rebuild, draw)
    return {"scrub_ms_median": float(np.median(total) * 1e3), "scrub_ms_p90": float(np.percentile(total, 90) * 1e3),
            "rebuild_ms_median": float(np.median(rebuild) * 1e3), "draw_ms_median": float(np.median(draw) * 1e3),
            "payload_bytes": len(payload)}


def _spawn(pool: int, allocator: str, mode: str, max_steps: int, workload: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_scale", "--child", str(pool), allocator, mode, str(max_steps), workload]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {pool} {allocator} {mode} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    pools = (65_536,) if quick else POOLS
    max_steps = 300 if quick else MAX_STEPS
    workload = "azure-conv-small" if quick else WORKLOAD
    rows = []
    for pool in pools:
        for allocator in ALLOCATORS:
            mem = _spawn(pool, allocator, "scrub" if pool == max(pools) else "memory", max_steps, workload)
            trace = _spawn(pool, allocator, "trace", max_steps, workload)
            rows.append({
                "pool_slots": pool, "allocator": allocator, "steps": mem["steps"], "finished": mem["finished"],
                "steps_per_s": round(mem["steps_per_s"], 1),
                "peak_rss_mb": round(mem["peak_rss_bytes"] / 1e6, 1),
                "recording_mb": round(mem["recording_bytes"] / 1e6, 1),
                "trace_mb": round(trace["trace_bytes"] / 1e6, 2),
                "trace_steps_per_s": round(trace["steps_per_s"], 1),
                **{k: round(mem[k], 2) for k in ("scrub_ms_median", "scrub_ms_p90", "rebuild_ms_median", "draw_ms_median")
                   if k in mem},
                **({"payload_kb": round(mem["payload_bytes"] / 1024, 1)} if "payload_bytes" in mem else {}),
            })
    targets = []
    if not quick:
        mid = [r for r in rows if r["pool_slots"] == 262_144]
        big = [r for r in rows if r["pool_slots"] == 1_048_576]
        for r in mid:
            a = r["allocator"]
            targets += [
                {"name": f"recording speed at 262,144 slots, {a} (steps/s)", "value": r["steps_per_s"],
                 "target": f">= {TARGETS['recording_steps_per_s_262144']:,.0f}",
                 "pass": r["steps_per_s"] >= TARGETS["recording_steps_per_s_262144"]},
                {"name": f"peak RSS recording {r['steps']:,} steps at 262,144 slots, {a} (MB)", "value": r["peak_rss_mb"],
                 "target": f"<= {TARGETS['peak_rss_mb_262144']:.0f}", "pass": r["peak_rss_mb"] <= TARGETS["peak_rss_mb_262144"]},
                {"name": f"trace of that run, {a} (MB)", "value": r["trace_mb"],
                 "target": f"<= {TARGETS['trace_mb_262144']:.0f}", "pass": r["trace_mb"] <= TARGETS["trace_mb_262144"]},
            ]
        for r in big:
            targets.append({"name": f"scrub latency at 1,048,576 slots, {r['allocator']} (median ms)",
                            "value": r["scrub_ms_median"], "target": f"<= {TARGETS['scrub_ms_1048576']:.0f}",
                            "pass": r["scrub_ms_median"] <= TARGETS["scrub_ms_1048576"]})
    return {"workload": workload, "max_steps": max_steps, "rows": rows, "targets": targets}


COLUMNS = ["pool_slots", "allocator", "steps", "steps_per_s", "peak_rss_mb", "recording_mb", "trace_mb",
           "scrub_ms_median", "payload_kb"]


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    print_table([{c: r.get(c, "-") for c in COLUMNS} for r in result["rows"]], COLUMNS)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        pool, allocator, mode, max_steps, workload = sys.argv[2:7]
        print(json.dumps(child(int(pool), allocator, mode, int(max_steps), workload)))
    else:
        from benchmarks.common import write_result

        res = run("--quick" in sys.argv)
        print_result(res)
        print("wrote", write_result("scale", {"command": "python -m benchmarks scale", "quick": "--quick" in sys.argv, **res}))
