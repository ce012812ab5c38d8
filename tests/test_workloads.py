"""Built-in workloads, workload files, and the explainer40 claim."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.scripted import ScriptedSource
from pagedkv_core.workloads import (
    EXPLAINER_MAX_TOKENS,
    WORKLOADS,
    build_workload,
    load_workload_file,
    parse_workload,
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
        ([{"id": "x", "prompt": [1], "output_len": -1, "max_tokens": 2}], "output_len must be >= 1, got -1"),
        ([{"id": "x", "prompt_len": -3, "output_len": 1, "max_tokens": 2}], "prompt_len must be >= 1, got -3"),
        ([{"id": "x", "prompt": [1], "output_len": 1}], "missing 'max_tokens'"),
        ([{"id": "x", "prompt": [1], "prompt_len": 1, "output_len": 1, "max_tokens": 1}], "exactly one"),
        ([{"id": "x", "prompt": [1, -2], "output_len": 1, "max_tokens": 1}], "-2"),
        ([{"id": "x", "prompt": [1], "output_len": 1, "max_tokens": 1, "colour": 1}], "'colour'"),
        ([{"id": "x", "prompt": [1], "output_len": "3", "max_tokens": 1}], "'3'"),
        ([{"id": "x", "prompt": [1], "output_len": 1, "max_tokens": 1, "n": 0}], "n must be >= 1"),
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
