"""``python -m pagedkv_core bench`` (a launcher of ``python -m benchmarks``): result files are
written and well-formed; bad input exits 2; the flags and exit codes pass through.

No timing assertions here: speed targets live in the benchmarks (``benchmarks/results``), never
in timed tests. ``--quick`` runs tiny sizes into a temporary ``--out-dir``; without one it writes to
``benchmarks/results/quick/``: the published results are never overwritten.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_core.cli import main

ROOT = Path(__file__).resolve().parents[1]


def bench(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagedkv_core", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def check_result(path: Path, name: str) -> dict:
    data = json.loads(path.read_text())
    assert data["benchmark"] == name
    assert data["quick"] is True
    assert data["command"].startswith("python -m pagedkv_core bench")
    assert data["date"][:4].isdigit()
    assert data["machine"]["cores"] >= 1 and data["machine"]["cpu"]
    assert isinstance(data["targets"], list)
    for t in data["targets"]:
        assert set(t) >= {"name", "value", "target", "pass"} and isinstance(t["pass"], bool)
    return data


def test_quick_simulator_and_allocation_write_results(tmp_path):
    proc = bench("simulator", "allocation", "--quick", "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    sim = check_result(tmp_path / "simulator.json", "simulator")
    assert sim["targets"] and sim["paged_steps_per_s_median"] > 0
    assert {r["allocator"] for r in sim["closed_loop"]} == {"paged", "contiguous"}
    alloc = check_result(tmp_path / "allocation.json", "allocation")
    assert {r["workload"] for r in alloc["rows"]} == {"explainer40", "shared_preamble", "trickle"}
    for r in alloc["rows"]:
        assert 0.0 < r["mean_token_utilization"] <= 1.0 and r["finished"] + r["rejected"] == r["requests"]
    table = (tmp_path / "README_TABLE.md").read_text()
    assert "| Benchmark | Measured | Target | Result |" in table and "simulator" in table
    assert "python -m pagedkv_core bench" in table and "one torch thread" in table
    assert "skipped" in table  # GPU row without GPU results
    assert f"results in `{tmp_path}/*.json`" in table and "`benchmarks/results/" not in table  # its own folder
    from pagedkv_core.sources.model import cpu_isa_flags

    if cpu_isa_flags() is not None:  # the machine line names the CPU's fast-path flags
        assert sim["machine"]["isa_flags"] == cpu_isa_flags()
        assert f"(flags {' '.join(cpu_isa_flags()) or 'none of the fast paths'})" in table
    assert "simulator" in proc.stdout and "allocation" in proc.stdout
    assert not (tmp_path / "throughput.json").exists()


def test_quick_step_cost_measures_each_way_and_the_table_reports_it(tmp_path):
    from benchmarks import bench_step_cost, report

    result = bench_step_cost.run(quick=True, baseline=None)
    e = result["engines"]["this engine"]
    assert set(e["us_per_step"]) == {"plain", "recorded", "traced"}
    assert all(set(way) == {"1", "16", "64"} and all(v > 0 for v in way.values()) for way in e["us_per_step"].values())
    rows = report._rows("step-cost", result)
    assert len(rows) == 3 and all(r[0].startswith("step cost") for r in rows)
    assert "trace file" in rows[2][0]


@pytest.mark.parametrize("args, needle", [
    (["nope"], "unknown benchmark 'nope'"),
    (["simulator", "--rounds", "0"], "--rounds must be >= 1"),
])  # fmt: skip
def test_bad_input_exits_2_with_one_line(capsys, args, needle):
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_unknown_name_from_the_command_line():
    proc = bench("allocation", "throughputt", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown benchmark 'throughputt'" in proc.stderr
    assert proc.stdout == ""  # nothing ran


@pytest.mark.slow
def test_quick_model_benchmarks_write_results(tmp_path):
    proc = bench("overhead", "prefix", "throughput", "memory", "--quick", "--out-dir", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    thr = check_result(tmp_path / "throughput.json", "throughput")
    assert set(thr["main"]["variants"]) == {"hf_one_at_a_time", "hf_static_batch", "hf_generate_batch",
                                            "pagedkv_paged", "pagedkv_contiguous"}
    assert {t["name"].split(" (")[0] for t in thr["targets"]} >= {"paged / hf generate_batch", "paged / hf static batch"}
    assert "pagedkv_paged" in thr["main"]["token_identity_vs_hf_static_batch"]
    assert thr["tight"]["paged"]["useful_tokens"] > 0
    ov = check_result(tmp_path / "overhead.json", "overhead")
    assert ov["decode"]["engine_step_ms"] > 0 and ov["prefill"]["steps_per_round"] == 1
    pre = check_result(tmp_path / "prefix.json", "prefix")
    assert pre["setup"]["system_prompt_tokens"] == 600 and pre["B_prefill_tokens_computed"] < pre["B_prompt_tokens"]
    mem = check_result(tmp_path / "memory.json", "memory")
    assert mem["peak_rss_bytes"] > mem["rss_by_phase_bytes"]["imports"]
    assert (tmp_path / "README_TABLE.md").exists()


def test_gpu_is_skipped_with_the_reason_without_cuda(monkeypatch, capsys, tmp_path):
    # The benchmarks run in a child process (python -m benchmarks): hide the GPUs from it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["bench", "gpu", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: no CUDA device" in out
    assert not list(tmp_path.glob("gpu*.json"))  # a skip never overwrites GPU results
    assert "not measured: no CUDA device" in (tmp_path / "README_TABLE.md").read_text()


def test_help_and_usage_errors_pass_through_the_launcher():
    helped = bench("--help", timeout=60)
    assert helped.returncode == 0 and "--rounds" in helped.stdout and "throughput" in helped.stdout
    assert helped.stdout.startswith("usage: python -m pagedkv_core bench")
    bad = bench("--rounds", "x", timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "error: python -m pagedkv_core bench: argument --rounds: invalid int value: 'x'\n"


def test_benchmarks_run_as_their_own_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "allocation", "--quick", "--out-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "allocation.json").read_text())
    assert data["command"] == f"python -m benchmarks allocation --quick --out-dir {tmp_path}"
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown benchmark 'nope'")


def test_a_quick_run_without_out_dir_never_replaces_a_published_result():
    """`bench NAME --quick` (the README's smoke run) writes to benchmarks/results/quick/, and the
    published NAME.json and README table stay as they were."""
    results, quick = ROOT / "benchmarks" / "results", ROOT / "benchmarks" / "results" / "quick"
    published = {p: p.read_bytes() for p in (results / "allocation.json", ROOT / "benchmarks" / "README_TABLE.md")}
    had, had_dir = (quick / "allocation.json").exists(), quick.exists()
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks", "allocation", "--quick"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert json.loads((quick / "allocation.json").read_text())["quick"] is True
        assert (quick / "README_TABLE.md").exists()
        assert all(p.read_bytes() == before for p, before in published.items())
    finally:  # leave the tree as it was: the folder the run made, or the file it added
        if not had_dir:
            shutil.rmtree(quick, ignore_errors=True)
        elif not had:
            (quick / "allocation.json").unlink(missing_ok=True)


def test_write_result_keeps_a_quick_payload_apart(monkeypatch, tmp_path):
    import benchmarks.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(common, "QUICK_RESULTS", tmp_path / "results" / "quick")
    assert common.write_result("x", {"quick": True}) == tmp_path / "results" / "quick" / "x.json"
    assert common.write_result("x", {"quick": False}) == tmp_path / "results" / "x.json"
    assert common.write_result("x", {"quick": True}, out_dir=tmp_path / "mine") == tmp_path / "mine" / "x.json"


def test_the_library_never_imports_the_benchmarks():
    import ast

    for path in (ROOT / "pagedkv_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(n.split(".")[0] == "benchmarks" for n in names), path
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
                raise AssertionError(f"{path}: __import__")
