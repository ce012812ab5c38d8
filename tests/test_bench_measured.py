"""``bench replay-speed`` measures each case by itself (benchmarks/bench_replay_speed.py, ``measured``):
a process started from the benchmark would report at least the benchmark's own peak RSS."""
from __future__ import annotations

import sys

from benchmarks.bench_replay_speed import measured

MB = 1024


def test_a_case_reports_its_own_peak_not_the_benchmarks():
    held = bytearray(120 * 1024 * 1024)  # the benchmark, grown by the traces it has read back
    held[::4096] = b"\1" * len(held[::4096])
    grows = "b = bytearray(60 * 1024 * 1024); b[::4096] = b'\\1' * len(b[::4096]); print(len(b))"
    run = measured([sys.executable, "-c", grows])
    assert run.returncode == 0 and run.out == f"{60 * 1024 * 1024}\n" and run.err == ""
    assert 60 * MB <= run.peak_rss_kb < 110 * MB  # its 60 MB and an interpreter, not the 120 MB held here
    assert run.cpu_s > 0
    assert all(kb < 110 * MB for kb in run.hwm_kb.values())
    del held


def test_a_failing_case_keeps_its_exit_code_and_its_error():
    run = measured([sys.executable, "-c", "import sys; sys.stderr.write('bad input\\n'); sys.exit(2)"])
    assert run.returncode == 2 and run.err == "bad input\n" and run.out == ""


def test_every_azure_row_runs_paged_only_and_is_judged_on_the_issues_targets(monkeypatch):
    """``azure-conv-all`` runs all 19,366 rows in full at a 16,384-token context, paged only (Orca
    (Max) would reserve the whole context a request), without the older engine; the default
    context's whole log runs on this engine, then this engine and the older one on the same
    requests (the rows that fit: ``--overlong leave-out``), back to back, and the pairs are set
    side by side."""
    import benchmarks.bench_replay_speed as rs

    asked = []

    def fake_case(root, log, allocator, count, quick, flags=()):
        asked.append((log, allocator, count, root == rs.ROOT, flags))
        wall = 20.0 if root == rs.ROOT else 40.0
        return {"log": log, "allocator": allocator, "count": count, "requests": 19_366 if log == "azure-conv-all" else 16_528,
                "wall_s": wall, "cpu_s": 2 * wall, "peak_rss_sum_mb": 120.0, "trace_mb": 172.0, "busy_steps_per_cpu_s": 900.0}

    monkeypatch.setattr(rs, "case", fake_case)
    monkeypatch.setattr(rs, "baseline_root", lambda commit=rs.BASELINE_COMMIT: rs.ROOT.parent / "elsewhere")
    result = rs.run(logs=("azure-conv", "azure-conv-all"))
    fit = ("--overlong", "leave-out")
    assert asked == [("azure-conv", "paged", None, True, ()), ("azure-conv", "orca-max", None, True, ()),
                     ("azure-conv", "paged", None, True, fit), ("azure-conv", "paged", None, False, ()),
                     ("azure-conv", "orca-max", None, True, fit), ("azure-conv", "orca-max", None, False, ()),
                     ("azure-conv-all", "paged", None, True, ())]
    assert [(r["engine"], r["allocator"]) for r in result["rows"]][2:4] == [(rs.LIKE_FOR_LIKE, "paged"), (rs.BASELINE_COMMIT, "paged")]
    assert [(r["allocator"], r["wall_speedup"], r["cpu_speedup"]) for r in result["side_by_side"]] == [
        ("paged", 2.0, 2.0), ("orca-max", 2.0, 2.0)]
    assert rs.LOGS["azure-conv-all"][1] == ["--max-context", "16384"]
    names = [t["name"] for t in result["targets"]]
    assert len(names) == 15  # five targets each: Azure paged and Orca (Max) at the default context, every row paged
    every_row = [t for t in result["targets"] if "all 19,366 rows (16,384-token context)" in t["name"]]
    assert len(every_row) == 5 and all(t["name"].count("paged") == 1 for t in every_row)
    trace = next(t for t in every_row if t["name"].endswith("trace (MB)"))
    assert trace["value"] == 172.0 and trace["pass"] is False
    wall = next(t for t in result["targets"] if t["name"].endswith("orca-max: wall time (s)"))
    assert wall["value"] == 20.0 and wall["target"] == "<= 15" and wall["pass"] is False
