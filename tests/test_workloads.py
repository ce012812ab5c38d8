"""Built-in workloads, workload files, and the explainer40 claim."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import (
    EXPLAINER_MAX_TOKENS,
    MAX_BUILT_LOG_REQUESTS,
    MAX_LOG_REQUESTS,
    WORKLOADS,
    LogOptions,
    build_workload,
    load_workload_file,
    parse_workload,
    read_log_rows,
    request_log_workload,
    workload_from_bytes,
)


def run(workload, **config):
    engine = Engine(EngineConfig(pool_slots=workload.pool_slots, **config), ScriptedSource())
    workload.submit(engine)
    return engine.run()


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workloads_are_seeded(name):
    a, b, c = build_workload(name, 0), build_workload(name, 0), build_workload(name, 1)
    assert a == b and a != c
    assert len({r.id for r in a.requests}) == len(a.requests)
    assert all(r.prompt and r.output_len >= 1 and r.max_tokens >= 1 for r in a.requests)


def test_explainer40_shape():
    w = build_workload("explainer40")
    assert len(w.requests) == 40 and w.pool_slots == 2048
    assert all(r.arrival_step == 0 for r in w.requests)
    reservations = [len(r.prompt) + r.max_tokens for r in w.requests]
    assert 3 * max(reservations) <= 2048 < 4 * min(reservations)  # three fit, four never do
    lens = np.array([r.output_len for r in w.requests])
    assert np.median(lens) < lens.mean() < EXPLAINER_MAX_TOKENS / 2  # long-tailed
    assert lens.max() > 3 * np.median(lens)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_explainer40_reproduces_the_seed_claim(seed):
    w = build_workload("explainer40", seed)
    contiguous = run(w, allocator="contiguous")
    paged = run(w, allocator="paged", block_size=16)
    assert 0.20 <= contiguous.mean_token_utilization <= 0.40
    assert paged.mean_token_utilization >= 0.90
    assert contiguous.peak_running == 3
    assert 25 <= paged.peak_running <= 35
    assert contiguous.finished == paged.finished == 40
    assert paged.steps < contiguous.steps / 2


def test_shared_preamble_hits_the_prefix_cache():
    w = build_workload("shared_preamble")
    prompts = [r.prompt for r in w.requests]
    assert all(p[:600] == prompts[0][:600] for p in prompts) and len(w.requests) >= 16
    on = run(w)
    off = run(w, prefix_caching=False)
    assert on.prefix_cache_hit_rate > 0.8 and off.prefix_cache_hit_rate == 0.0
    assert on.peak_running > off.peak_running


def test_burst_forces_preemption_in_both_modes():
    w = build_workload("burst")
    assert {r.arrival_step for r in w.requests} == {0, 20}
    assert run(w, preemption="recompute").recomputes > 0
    swapped = run(w, preemption="swap")
    assert swapped.swaps_out > 0 and swapped.swaps_in == swapped.swaps_out


def test_trickle_arrivals_are_spread_out():
    w = build_workload("trickle")
    arrivals = [r.arrival_step for r in w.requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 100
    gaps = np.diff(arrivals)
    assert 2 < gaps.mean() < 8
    assert run(w).finished == len(w.requests)


def test_workload_file_round_trip(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(
        json.dumps(
            [
                {"id": "x", "prompt": [5, 6, 7], "output_len": 4, "max_tokens": 8},
                {"id": "y", "prompt_len": 20, "output_len": 2, "max_tokens": 2, "arrival_step": 3, "n": 2},
            ]
        )
    )
    w = load_workload_file(path, seed=0)
    assert [r.id for r in w.requests] == ["x", "y"]
    assert w.requests[0].prompt == (5, 6, 7) and w.requests[0].arrival_step == 0 and w.requests[0].n == 1
    assert len(w.requests[1].prompt) == 20 and w.requests[1].n == 2
    assert load_workload_file(path, seed=0) == w and load_workload_file(path, seed=1) != w
    summary = run(w)
    assert summary.finished == 2 and summary.tokens_generated == 4 + 2 * 2


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"id": "x"}, "JSON list"),
        ([], "no requests"),
        ([5], "must be an object"),
        ([{"id": "x", "prompt": [1], "output_len": 1}], "missing 'max_tokens'"),
        ([{"id": "x", "prompt": [1], "prompt_len": 1, "output_len": 1, "max_tokens": 1}], "exactly one"),
        ([{"id": "x", "prompt": [1], "output_len": 1, "max_tokens": 1, "colour": 1}], "'colour'"),
        ([{"id": "x", "prompt": [1], "output_len": "3", "max_tokens": 1}], "'3'"),
        ([{"id": 7, "prompt": [1], "output_len": 1, "max_tokens": 1}], "id must be"),
        ([{"id": "x", "prompt": [1], "output_len": 1, "max_tokens": 1}] * 2, "duplicate"),
    ],
)
def test_bad_workloads_raise_one_line_config_errors(data, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")) as info:
        parse_workload(data, "w.json")
    assert "\n" not in str(info.value)


def test_unreadable_or_malformed_workload_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_workload_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_workload_file(bad)


def test_unknown_workload_name():
    with pytest.raises(ConfigError, match="unknown workload 'nope'"):
        build_workload("nope")


# ---------------------------------------------------------------------------- request logs (CSV)
TRACE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
2023-11-16 18:15:53.0000000,1900,300
"""


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_csv_request_log_is_a_workload(tmp_path):
    w = load_workload_file(write(tmp_path, TRACE), seed=0, max_tokens="answer")
    assert [r.id for r in w.requests] == ["r1", "r2", "r3", "r4", "r5"]
    assert [len(r.prompt) for r in w.requests] == [374, 396, 879, 91, 1900]
    assert [r.output_len for r in w.requests] == [44, 109, 55, 16, 300]
    assert [r.max_tokens for r in w.requests] == [44, 109, 55, 16, 300]
    # 50 ms a step: 0, 4.31 s, 4.54 s, 4.71 s, 6.32 s after the first request.
    assert [r.arrival_step for r in w.requests] == [0, 86, 90, 94, 126]
    assert load_workload_file(tmp_path / "trace.csv", seed=0, max_tokens="answer") == w
    assert load_workload_file(tmp_path / "trace.csv", seed=1, max_tokens="answer") != w
    summary = run(w, allocator="paged")
    assert summary.finished == 5 and summary.tokens_generated == 44 + 109 + 55 + 16 + 300


def test_log_options_rows_time_scale_and_max_tokens(tmp_path):
    path = write(tmp_path, TRACE)
    w = load_workload_file(path, start=1, count=2, seconds_per_step=0.5, max_tokens=100)
    assert [r.id for r in w.requests] == ["r2", "r3"]
    assert [r.arrival_step for r in w.requests] == [0, 0]  # 0.23 s apart, 0.5 s a step
    assert [(r.output_len, r.max_tokens) for r in w.requests] == [(100, 100), (55, 100)]  # the cap cuts r2
    faster = load_workload_file(path, seconds_per_step=0.5, rate=4.0, max_tokens="answer")
    assert [r.arrival_step for r in faster.requests] == [0, 34, 36, 37, 50]
    # The model's context: prompt + max_tokens = 2,048; the 1,900 + 300 row is served as a server with
    # that context serves it: its answer is cut at the context (148 tokens, not 300).
    ctx = load_workload_file(path)
    assert [r.id for r in ctx.requests] == ["r1", "r2", "r3", "r4", "r5"]
    assert all(len(r.prompt) + r.max_tokens == 2048 for r in ctx.requests)
    assert (ctx.requests[4].output_len, ctx.requests[4].max_tokens) == (300, 148) and ctx.left_out is None
    assert "1 longer than the 2,048-token context (cut at it" in ctx.description
    fit = load_workload_file(path, overlong="leave-out")  # or left out, and counted
    assert [r.id for r in fit.requests] == ["r1", "r2", "r3", "r4"]
    assert "1 left out" in fit.description and "2,048-token context" in fit.description
    assert ctx.pool_slots == 65536
    wide = load_workload_file(path, max_context=4096, pool_slots=8192)
    assert len(wide.requests) == 5 and wide.requests[4].max_tokens == 4096 - 1900 and wide.pool_slots == 8192
    small = load_workload_file(path, length_scale=1 / 8)
    assert [(len(r.prompt), r.output_len, r.max_tokens) for r in small.requests[:2]] == [(47, 6, 256 - 47), (50, 14, 256 - 50)]
    assert small.requests[3].output_len == 2  # 16 / 8


def test_gzipped_logs_and_uploads(tmp_path):
    plain = load_workload_file(write(tmp_path, TRACE), max_tokens="answer")
    gz = tmp_path / "trace.csv.gz"
    gz.write_bytes(gzip.compress(TRACE.encode()))
    assert load_workload_file(gz, max_tokens="answer").requests == plain.requests
    assert workload_from_bytes(gz.read_bytes(), "up.csv.gz", max_tokens="answer").requests == plain.requests
    assert workload_from_bytes(TRACE.encode("utf-8-sig"), "up.csv", max_tokens="answer").requests == plain.requests
    window = workload_from_bytes(TRACE.encode(), "up.csv", start=2, count=2)
    assert [r.id for r in window.requests] == ["r3", "r4"] and window.name == "up.csv"
    with pytest.raises(ConfigError, match="up.csv row 3: GeneratedTokens"):
        workload_from_bytes(TRACE.replace("879,55", "879,?").encode(), "up.csv")
    with pytest.raises(ConfigError, match="cannot read up.json: not UTF-8"):
        workload_from_bytes(b"\xff[", "up.json")
    js = workload_from_bytes(json.dumps([{"id": "x", "prompt": [5], "output_len": 1, "max_tokens": 1}]).encode(), "w.json")
    assert [r.id for r in js.requests] == ["x"]


def test_columns_in_any_order_extra_columns_and_blank_lines(tmp_path):
    text = "GeneratedTokens,note,ContextTokens,TIMESTAMP\n\n7,hi,30,10.0\n\n9,,12,12.5\n"
    w = load_workload_file(write(tmp_path, text), max_tokens="answer", seconds_per_step=1.0)
    assert [(r.id, len(r.prompt), r.output_len, r.arrival_step) for r in w.requests] == [("r1", 30, 7, 0), ("r2", 12, 9, 2)]


@pytest.mark.parametrize(
    "text, message",
    [
        (TRACE.replace("879,55", "879,x"), "trace.csv row 3: GeneratedTokens must be a whole number >= 1, got 'x'"),
        (TRACE.replace("879,55", "879,0"), "trace.csv row 3: GeneratedTokens must be a whole number >= 1, got '0'"),
        (TRACE.replace("91,16", "-91,16"), "trace.csv row 4: ContextTokens must be a whole number >= 1, got '-91'"),
        (TRACE.replace("374,44", "37.5,44"), "trace.csv row 1: ContextTokens must be a whole number >= 1, got '37.5'"),
        (TRACE.replace("2023-11-16 18:15:51.39", "yesterday"), "trace.csv row 4: TIMESTAMP must be a date-time"),
        (TRACE.replace("1900,300", "1900"), "trace.csv row 5: no value for GeneratedTokens"),
        (TRACE.replace("GeneratedTokens", "Generated"), "missing column(s) GeneratedTokens"),
        ("", "the request log is empty"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests after row 0"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n1e9,5,5\n", "row 2: arrives at step 20,000,000,000"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\nnan,5,5\n", "row 2: TIMESTAMP must be a finite number"),
    ],
)
def test_bad_log_rows_name_the_row_and_column(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_workload_file(write(tmp_path, text))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_row_after_the_window_is_never_read(tmp_path):
    path = write(tmp_path, TRACE.replace("1900,300", "1900,oops"))
    assert len(load_workload_file(path, count=4).requests) == 4
    with pytest.raises(ConfigError, match="row 5: GeneratedTokens"):
        load_workload_file(path)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"start": -1}, "start must be >= 0"),
        ({"count": 0}, "count must be in [1, 1,000,000]"),
        ({"count": MAX_LOG_REQUESTS + 1}, "count must be in [1, 1,000,000]"),
        ({"seconds_per_step": 0}, "seconds_per_step must be a number > 0"),
        ({"rate": float("inf")}, "rate must be a number > 0"),
        ({"length_scale": 2}, "length_scale must be at most 1"),
        ({"max_tokens": "lots"}, "max_tokens must be 'context', 'answer' or a whole number >= 1, got 'lots'"),
        ({"max_tokens": 0}, "got 0"),
        ({"max_context": 1}, "max_context must be in [2,"),
        ({"pool_slots": 0}, "pool_slots must be >= 1"),
        ({"colour": "red"}, "unknown request-log option(s) colour"),
    ],
)
def test_bad_log_options(tmp_path, options, message):
    with pytest.raises(ConfigError) as info:
        load_workload_file(write(tmp_path, TRACE), **options)
    assert message in str(info.value)


def test_log_size_and_row_bounds(tmp_path, monkeypatch):
    from pagedkv_core.workloads import scenarios as workloads

    rows = "".join(f"{i},10,5\n" for i in range(MAX_BUILT_LOG_REQUESTS + 1))
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    with pytest.raises(ConfigError, match="more than 5,000 requests after row 0: give a count"):
        load_workload_file(path, seconds_per_step=10.0)  # built whole; streamed, it may have 1,000,000
    assert len(load_workload_file(path, count=3, start=MAX_BUILT_LOG_REQUESTS - 1, seconds_per_step=10.0).requests) == 2
    assert len(read_log_rows(path, count=10)) == 10
    monkeypatch.setattr(workloads, "MAX_WORKLOAD_FILE_BYTES", 100)
    with pytest.raises(ConfigError, match="bytes, more than the 100 allowed"):
        load_workload_file(path, count=3)
    with pytest.raises(ConfigError, match="more than the 100 a workload file may have"):
        workload_from_bytes(path.read_bytes(), "up.csv")


def test_json_files_take_no_log_options(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([{"id": "x", "prompt": [5], "output_len": 1, "max_tokens": 1}]))
    assert len(load_workload_file(path, rate=None).requests) == 1  # None = not given
    with pytest.raises(ConfigError, match=r"w.json: rate apply only to request logs \(.csv, .csv.gz, .jsonl, .jsonl.gz\)"):
        load_workload_file(path, rate=2.0)


def test_log_options_defaults_are_stated():
    opt = LogOptions()
    assert (opt.start, opt.count, opt.seconds_per_step, opt.rate, opt.max_tokens, opt.max_context, opt.length_scale,
            opt.pool_slots) == (0, None, 0.05, 1.0, "context", 2048, 1.0, 65536)
    assert LogOptions.of(max_tokens="512", rate=None).max_tokens == 512


def test_corrupt_gzip_is_a_config_error(tmp_path):
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ConfigError, match="t.csv.gz: cannot read the request log"):
        request_log_workload(gz)


def test_a_log_row_whose_prompt_fills_the_context_is_rejected_with_its_reason(tmp_path):
    """Every row of a request log is submitted: one whose prompt alone fills the context is a
    rejection, with its reason, beside the others (and, left out, it is counted instead)."""
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n0,4000,10\n1,100,10\n")
    w = load_workload_file(path)
    assert [(r.id, r.reject_reason) for r in w.requests] == [
        ("r1", "prompt of 4,000 tokens leaves no room for an answer in the 2,048-token context"), ("r2", None)]
    engine = Engine(EngineConfig(pool_slots=4096), ScriptedSource())
    w.submit(engine)
    s = engine.run()
    assert s.finished == 1 and s.rejected == [
        {"id": "r1", "reason": "prompt of 4,000 tokens leaves no room for an answer in the 2,048-token context"}]
    with pytest.raises(ConfigError, match="1 left out: longer than the 2,048-token context"):
        load_workload_file(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n0,4000,10\n"), overlong="leave-out")
    with pytest.raises(ConfigError, match="overlong must be one of serve, leave-out"):
        load_workload_file(path, overlong="drop")
