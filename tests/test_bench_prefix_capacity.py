"""``bench prefix-capacity --quick``: the result file is well-formed, its ideal replays are the replay
module's, Belady is at least LRU on the engine and in the replay, the README table has its rows, and a
quick run leaves the published plot alone. No timing assertions (the seconds are reported, not tested)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_prefix_capacity as bench
from benchmarks.report import build_table
from pagedkv_core.workloads.hashed_log import MOONCAKE_CONV_LOG, read_hashed_log
from pagedkv_core.workloads.prefix_replay import replay, requests_from_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    plot = bench.PLOT.stat().st_mtime_ns if bench.PLOT.exists() else None
    proc = subprocess.run([sys.executable, "-m", "pagedkv_core", "bench", "prefix-capacity", "--quick", "--out-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (bench.PLOT.stat().st_mtime_ns if bench.PLOT.exists() else None) == plot  # quick runs never redraw it
    return json.loads((out / "prefix-capacity.json").read_text()), (out / "README_TABLE.md").read_text()


def test_result_file(quick):
    r, _ = quick
    assert r["benchmark"] == "prefix-capacity" and r["quick"] is True
    assert r["command"].startswith("python -m pagedkv_core bench prefix-capacity --quick")
    assert r["requests"] == bench.QUICK_REQUESTS and r["block_size"] == 32 and r["length_scale"] == "1/16"
    assert [p["blocks"] for p in r["points"]] == list(bench.QUICK_BLOCKS)
    for p in r["points"]:
        assert p["capacity_tokens"] == p["blocks"] * 512 and p["pool_slots"] == p["blocks"] * 32
        for e in ("lru", "belady"):
            run = p[f"engine_{e}_run"]
            assert run["finished"] + run["rejected"] == r["requests"] and run["pool_slots"] == p["pool_slots"]
            assert run["hit_rate"] == pytest.approx(run["hit_tokens"] / run["queried_tokens"], abs=1e-4)
        assert p["engine_belady"] >= p["engine_lru"] and p["ideal_belady"] >= p["ideal_lru"]
        assert max(p["engine_belady"], p["ideal_belady"]) <= r["unbounded"]
        assert 0 < p["running_share"] < 1
    assert r["targets"] and r["targets"][0]["pass"] is True


def test_ideal_replays_are_the_replay_modules(quick):
    r, _ = quick
    reqs = requests_from_rows(read_hashed_log(MOONCAKE_CONV_LOG, 0, bench.QUICK_REQUESTS), 32)
    assert r["unbounded"] == round(replay(reqs, 32, None, "unbounded").hit_rate, 4)
    for p in r["points"]:
        for policy in ("lru", "belady"):
            assert p[f"ideal_{policy}"] == round(replay(reqs, 32, p["blocks"], policy).hit_rate, 4)
            assert p[f"ideal_{policy}_at_left_over"] == round(replay(reqs, 32, p["left_over_blocks"], policy).hit_rate, 4)


def test_table_rows_and_figure(quick):
    r, table = quick
    assert "prefix-capacity: 0.1M-token cache, Mooncake conversation trace" in table
    assert "prefix-capacity: unbounded cache" in table
    assert "prefix-capacity" in build_table({"prefix-capacity": r})
    fig = bench.figure(r)
    names = [t.name for t in fig.data]
    assert any("ideal LRU" in n for n in names) and any("engine, Belady" in n for n in names)
    paper = next(t for t in fig.data if "Figure 9" in t.name)
    assert list(paper.y) == [v for _, v in bench.PAPER_FIGURE_9]


def test_engine_runs_on_two_processes_match_one_after_another():
    rows = read_hashed_log(MOONCAKE_CONV_LOG, 0, 200)
    workload = bench.log_workload(rows)
    jobs = [(256, "lru"), (256, "belady"), (1024, "lru")]
    strip = lambda runs: [{k: v for k, v in r.items() if k != "seconds"} for r in runs]  # noqa: E731
    one = bench.engine_points(workload, jobs, 1)
    assert strip(bench.engine_points(workload, jobs, 2)) == strip(one)
    assert [(r["pool_slots"], r["eviction"]) for r in one] == [(b * 32, e) for b, e in jobs]
    assert all(r["finished"] + r["rejected"] == 200 for r in one)
