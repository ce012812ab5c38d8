"""``python -m pagedkv_core simulate``: JSON summary, table, trace, bad input -> exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_core.cli import add_engine_args, config_from_args, main
from pagedkv_core import events
from pagedkv_core.record.trace_file import read_trace

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {
    "allocator", "block_size", "pool_slots", "steps", "requests", "finished", "rejected", "preemptions",
    "swaps_out", "swaps_in", "recomputes", "peak_running", "mean_running", "mean_kv_usage",
    "mean_token_utilization", "prefix_cache_hit_rate", "tokens_generated",
}  # fmt: skip


def simulate_json(capsys, *args) -> dict:
    assert main(["simulate", *args, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object on stdout
    return json.loads(out)


def test_json_summary_has_every_field(capsys):
    s = simulate_json(capsys, "--workload", "explainer40")
    assert REQUIRED <= set(s)
    assert s["allocator"] == "paged" and s["block_size"] == 16 and s["pool_slots"] == 2048
    assert s["requests"] == s["finished"] == 40 and s["rejected"] == []
    assert s["mean_token_utilization"] >= 0.9 and s["peak_running"] > 20
    assert s["tokens_generated"] > 0 and s["steps"] > 0


def test_every_row_of_a_log_runs_or_is_rejected_with_its_reason(capsys):
    """Every row of a request log is submitted: a row longer than the context is served as a
    server with that context serves it (its answer cut there), and a row whose prompt alone fills
    the context is rejected, with its reason, in the JSON's ``rejected`` and the text's last lines.
    The first 200 rows of the Azure log hold 15 longer than 2,048 tokens, each with a prompt of
    2,048 tokens or more."""
    log = ["--workload-file", str(ROOT / "pagedkv_core" / "data" / "azure_conv_2023.csv"), "--trace-count", "200"]
    s = simulate_json(capsys, *log)
    assert "left_out" not in s and s["requests"] == 200 and s["finished"] == 185 and len(s["rejected"]) == 15
    assert s["rejected"][0] == {"id": "r14", "reason": "prompt of 2,221 tokens leaves no room for an answer in the "
                                                       "2,048-token context"}
    wide = simulate_json(capsys, *log, "--max-context", "16384")
    assert wide["finished"] == 200 and wide["rejected"] == []
    fit = simulate_json(capsys, *log, "--overlong", "leave-out")  # the rows that fit: 200 of the first 215
    assert fit["left_out"] == {"rows": 15, "reason": "prompt + answer longer than the 2,048-token context"}
    assert fit["requests"] == fit["finished"] == 200 and fit["rejected"] == []
    assert main(["simulate", *log]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "rejected r188: prompt of 4,082 tokens leaves no room for an answer in the 2,048-token context")
    assert main(["simulate", "--workload-file", log[1], "--trace-count", "400"]) == 0  # 26 rejected: 20 lines, then a count
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("rejected r") for line in lines) == 20
    assert lines[-1] == "... and 6 more rejected (--json lists every one)"


def test_flags_reach_the_engine(capsys):
    s = simulate_json(
        capsys, "--workload", "burst", "--allocator", "paged", "--pool-slots", "1024", "--block-size", "8",
        "--watermark", "0.05", "--preemption", "swap", "--swap-slots", "256", "--no-prefix-caching",
        "--max-batch-tokens", "256", "--seed", "3",
    )  # fmt: skip
    assert s["pool_slots"] == 1024 and s["block_size"] == 8 and s["preemption"] == "swap"
    assert s["watermark"] == 0.05 and s["prefix_caching"] is False and s["seed"] == 3
    assert s["prefix_cache_hit_rate"] == 0.0
    assert s["swaps_out"] > 0 and s["recomputes"] > 0  # a 256-slot host pool fills up at times
    assert s["preemptions"] == s["swaps_out"] + s["recomputes"]


def test_contiguous_run_and_rejections_from_a_workload_file(capsys, tmp_path):
    path = tmp_path / "w.json"
    path.write_text(
        json.dumps(
            [
                {"id": "fits", "prompt_len": 10, "output_len": 5, "max_tokens": 20},
                {"id": "never", "prompt_len": 100, "output_len": 5, "max_tokens": 200},
            ]
        )
    )
    s = simulate_json(capsys, "--workload-file", str(path), "--allocator", "contiguous", "--pool-slots", "256")
    assert s["finished"] == 1 and [r["id"] for r in s["rejected"]] == ["never"]
    assert "300" in s["rejected"][0]["reason"] and s["peak_running"] == 1


def test_human_table(capsys):
    assert main(["simulate", "--workload", "trickle"]) == 0
    out = capsys.readouterr().out
    assert "token utilization" in out and "preemptions" in out and "trickle" in out
    assert not out.lstrip().startswith("{")


def test_trace_out_writes_a_readable_trace(capsys, tmp_path):
    trace = tmp_path / "run.jsonl"
    s = simulate_json(capsys, "--workload", "shared_preamble", "--trace-out", str(trace))
    header, snaps = read_trace(trace)
    assert len(snaps) == s["steps"] and header["workload"] == "shared_preamble"
    assert len(header["requests"]) == s["requests"] and header["config"]["pool_slots"] == s["pool_slots"]
    assert [snap.step for snap in snaps] == list(range(s["steps"]))
    kinds = {e.kind for snap in snaps for e in snap.events}
    assert {events.ADMIT, events.CACHE_HIT, events.FINISH} <= kinds <= set(events.EVENT_KINDS)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--block-size", "0"], "block_size must be >= 1, got 0"),
        (["--block-size", "-4"], "got -4"),
        (["--watermark", "1"], "watermark must be in [0, 1), got 1.0"),
        (["--watermark", "-0.1"], "got -0.1"),
        (["--pool-slots", "8"], "got 8"),
        (["--allocator", "buddy"], "'buddy'"),
        (["--preemption", "drop"], "'drop'"),
        (["--swap-slots", "-1"], "got -1"),
        (["--max-batch-tokens", "0"], "got 0"),
        (["--block-size", "big"], "'big'"),
    ],
)
def test_bad_settings_exit_2_with_one_line(capsys, args, fragment):
    assert main(["simulate", "--workload", "explainer40", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and fragment in captured.err


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("[{", "not valid JSON"),
        ('[{"id": "a", "prompt_len": "5", "output_len": 2, "max_tokens": 3}]', "prompt_len must be an integer, got '5'"),
        ('{"id": "a"}', "JSON list"),
    ],
)
def test_bad_workload_files_exit_2(capsys, tmp_path, content, fragment):
    path = tmp_path / "w.json"
    path.write_text(content)
    assert main(["simulate", "--workload-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


def test_a_request_out_of_bounds_is_rejected_while_the_others_run(capsys, tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([
        {"id": "neg", "prompt_len": 5, "output_len": -2, "max_tokens": 3, "arrival_step": 4},
        {"id": "ok", "prompt_len": 5, "output_len": 2, "max_tokens": 3},
    ]))
    s = simulate_json(capsys, "--workload-file", str(path))
    assert s["rejected"] == [{"id": "neg", "reason": "output_len must be >= 1, got -2"}]
    assert s["finished"] == 1 and s["tokens_generated"] == 2 and s["steps"] == 5  # rejected at its arrival


def test_unknown_workload_and_missing_source(capsys):
    assert main(["simulate", "--workload", "nope"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert main(["simulate"]) == 2
    assert "--workload" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_module_entry_point_exit_codes_without_traceback():
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "pagedkv_core", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    ok = run("simulate", "--workload", "explainer40", "--allocator", "contiguous", "--json")
    assert ok.returncode == 0, ok.stderr
    s = json.loads(ok.stdout)
    assert s["allocator"] == "contiguous" and s["peak_running"] == 3
    bad = run("simulate", "--workload", "explainer40", "--block-size", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


def test_engine_flag_helpers_are_reusable():
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--block-size", "32", "--allocator", "contiguous"])
    cfg = config_from_args(args, pool_slots=4096)
    assert cfg.block_size == 32 and cfg.allocator == "contiguous" and cfg.pool_slots == 4096


@pytest.mark.parametrize(
    "allocator, policy, expected, peak",
    [
        ("contiguous", "max", "contiguous", 3),  # Orca (Max): prompt + max_tokens per reservation
        ("contiguous", "pow2", "contiguous-pow2", 10),
        ("contiguous", "oracle", "contiguous-oracle", 11),  # exactly the answer: the most at once
        ("paged", "oracle", "paged", None),  # a paged allocator ignores the policy
        ("contiguous-pow2", "pow2", "contiguous-pow2", 10),  # a policy that agrees is fine
    ],
)
def test_contiguous_policy_selects_the_allocator(capsys, allocator, policy, expected, peak):
    s = simulate_json(capsys, "--workload", "explainer40", "--allocator", allocator, "--contiguous-policy", policy)
    assert s["allocator"] == expected and s["finished"] == 40
    if peak is not None:
        assert s["peak_running"] == peak


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--contiguous-policy", "huge"], "--contiguous-policy must be one of max, pow2, oracle, got 'huge'"),
        (["--allocator", "contiguous-pow2", "--contiguous-policy", "oracle"], "selects contiguous-oracle"),
    ],
)
def test_bad_contiguous_policy_exits_2(capsys, args, fragment):
    assert main(["simulate", "--workload", "explainer40", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


def test_flag_defaults_and_help_come_from_the_config():
    import argparse
    import dataclasses

    from pagedkv_core.kv.registry import ALLOCATORS
    from pagedkv_core.cli.flags import NOT_FLAGS, engine_settings
    from pagedkv_core.config import EngineConfig, setting_spec

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    settings = engine_settings(parser.parse_args([]))
    names = [f.name for f in dataclasses.fields(EngineConfig) if f.name not in NOT_FLAGS and f.name != "pool_slots"]
    assert list(settings) == names
    assert settings == {name: setting_spec(name).default for name in names}
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["watermark"].endswith("in [0, 1) (default 0.01)")
    assert helps["pool_slots"].endswith("in [1, 1,048,576] (default 2048)") and helps["seed"].endswith("(default 0)")
    assert " | ".join(ALLOCATORS) in helps["allocator"]


AZURE_CSV = ROOT / "pagedkv_core" / "data" / "azure_conv_2023.csv"


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_json_reports_the_papers_waste_breakdown(capsys, allocator):
    s = simulate_json(capsys, "--workload", "explainer40", "--allocator", allocator)
    w = s["waste_breakdown"]
    assert set(w) == {"token", "reservation", "internal", "external", "free"}
    assert sum(w.values()) == pytest.approx(1.0)
    assert s["token_share"] == pytest.approx(w["token"] / (1 - w["free"]))
    if allocator == "paged":
        assert s["token_share"] > 0.9 and w["external"] == 0
    else:
        assert s["token_share"] < 0.5 and w["internal"] > w["token"]


def test_csv_request_log_with_row_window_and_policies_orders_like_the_paper(capsys):
    share = {}
    for policy in ("max", "pow2", "oracle"):
        s = simulate_json(capsys, "--workload-file", str(AZURE_CSV), "--log-count", "120", "--length-scale", "0.125",
                          "--pool-slots", "4096", "--allocator", "contiguous", "--contiguous-policy", policy)
        assert s["requests"] == 120 and s["allocator"] == f"contiguous{'' if policy == 'max' else '-' + policy}"
        share[policy] = s["token_share"]
    s = simulate_json(capsys, "--workload-file", str(AZURE_CSV), "--log-count", "120", "--length-scale", "0.125",
                      "--pool-slots", "4096")
    assert share["max"] < share["pow2"] < share["oracle"] < s["token_share"]


def test_request_log_flags_without_a_log_are_one_line_errors(capsys):
    assert main(["simulate", "--workload", "explainer40", "--rate", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --rate applies only to --workload-file *.csv or *.jsonl"


def test_renamed_request_log_flags_keep_their_former_spellings(capsys):
    """--request-log, --log-start and --log-count are the documented names; --trace-file,
    --trace-start and --trace-count still parse to the same values, and stay out of --help and
    out of error messages."""
    from pagedkv_core.cli import build_parser

    parser = build_parser()
    new = parser.parse_args(["generate", "--request-log", "r.csv", "--log-start", "3", "--log-count", "4"])
    old = parser.parse_args(["generate", "--trace-file", "r.csv", "--trace-start", "3", "--trace-count", "4"])
    assert (new.request_log, new.log_start, new.log_count) == (old.request_log, old.log_start, old.log_count) == ("r.csv", 3, 4)
    window = ("--workload-file", str(AZURE_CSV), "--length-scale", "1/8")
    old_run = simulate_json(capsys, *window, "--trace-start", "10", "--trace-count", "5")
    new_run = simulate_json(capsys, *window, "--log-start", "10", "--log-count", "5")
    counts = [k for k, v in new_run.items() if not k.endswith("_s")]  # not the timings
    assert old_run["requests"] == 5 and {k: old_run[k] for k in counts} == {k: new_run[k] for k in counts}
    for command, shown in (("simulate", ("--log-start ROW", "--log-count N")),
                           ("generate", ("--request-log CSV", "--log-start ROW", "--log-count N"))):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert all(s in text for s in shown) and "--trace-start" not in text and "--trace-count" not in text
        assert "--trace-file" not in text and "--trace-out PATH" in text  # --trace-out: a recorded run, unchanged
    assert main(["simulate", *window, "--trace-count", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: python -m pagedkv_core simulate: argument --log-count: invalid int value: 'x'")
    assert main(["generate", "--prompt", "hi", "--trace-file", "r.csv"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: python -m pagedkv_core generate: argument --request-log: not allowed with argument --prompt")


def test_the_progress_line_is_redrawn_at_most_twice_a_second_and_cleared():
    import io

    from pagedkv_core.cli.progress import ProgressLine
    from pagedkv_core.config import EngineConfig
    from pagedkv_core.engine import Engine
    from pagedkv_core.sources.scripted import ScriptedSource
    from pagedkv_core.workloads.scenarios import build_workload

    now = [0.0]
    out = io.StringIO()
    line = ProgressLine(out, every_s=0.5, clock=lambda: now[0])
    engine = Engine(EngineConfig(pool_slots=2048), ScriptedSource(), snapshots=False)
    build_workload("explainer40", 0).submit(engine)
    for _ in range(30):
        engine.step(snapshot=False, outputs=False)
        now[0] += 0.25
        line(engine)
    draws = out.getvalue().split("\r\033[K")[1:]
    assert len(draws) == 15  # at the first step, then every 0.5 s: every second step
    assert draws[-1] == (f"step 29: {engine.num_finished:,} of the 40 requests submitted so far have ended, "
                         f"{len(engine.scheduler.running)} "
                         f"running, {len(engine.scheduler.waiting)} waiting (7 s)")
    line.clear()
    assert out.getvalue().endswith("\r\033[K") and not line.drawn


def test_simulate_shows_its_progress_on_a_terminal_and_clears_it():
    import os
    import select

    master, slave = os.openpty()
    with subprocess.Popen([sys.executable, "-m", "pagedkv_core", "simulate", "--workload", "burst", "--pool-slots", "512",
                           "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=slave) as run:
        os.close(slave)
        seen = b""
        while True:  # read the terminal while the run writes to it (a full terminal buffer would stop the run)
            if select.select([master], [], [], 0.5)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the run has ended and closed its side
                    chunk = b""
                seen += chunk
                if chunk:
                    continue
            if run.poll() is not None:
                break
        while select.select([master], [], [], 0)[0]:  # what it wrote as it ended
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        out = run.stdout.read()
    os.close(master)
    assert run.returncode == 0
    text = seen.decode()
    assert "requests submitted so far have ended" in text and text.endswith("\r\033[K")  # drawn, then cleared
    assert json.loads(out)["steps"] > 0  # stdout stays the one JSON object
