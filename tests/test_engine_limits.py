"""Request-level limits: a request the engine cannot run is rejected with its reason while the
others run; nothing overflows an array dtype, nothing hangs."""
from __future__ import annotations

import json

import pytest

from pagedkv_core.config import MAX_ARRIVAL_STEP, ConfigError, EngineConfig
from pagedkv_core.sampling import MAX_SAMPLES, SamplingParams

from .engine_helpers import add, make_engine, run_checked


def rejected(engine) -> dict:
    return {r["id"]: r["reason"] for r in engine.summary().rejected}


def test_token_ids_past_int32_are_rejected_not_overflowed():
    engine = make_engine(pool_slots=256, block_size=4)
    add(engine, "huge", [5, 2**31], output_len=3)
    add(engine, "vast", [5, 10**30], output_len=3)
    add(engine, "ok", [5, 6, 7], output_len=3)
    run_checked(engine)
    reasons = rejected(engine)
    assert set(reasons) == {"huge", "vast"}
    assert "outside the vocabulary" in reasons["huge"]
    assert engine.get_request("ok").finish_reason == "stop"


def test_arrival_past_the_horizon_is_rejected_at_once():
    engine = make_engine(pool_slots=256, block_size=4)
    add(engine, "far", [1, 2, 3], output_len=2, arrival_step=10**12)
    add(engine, "near", [1, 2, 3], output_len=2, arrival_step=3)
    snaps = run_checked(engine, max_steps=50)
    assert len(snaps) < 10
    assert f"horizon of {MAX_ARRIVAL_STEP:,} steps" in rejected(engine)["far"]


def test_lone_surrogate_id_is_rejected_and_printable():
    engine = make_engine(pool_slots=256, block_size=4)
    add(engine, "\ud800", [1, 2, 3], output_len=2)
    add(engine, "fine", [1, 2, 3], output_len=2)
    run_checked(engine)
    (rid, reason), = rejected(engine).items()
    assert reason == "request id is not valid UTF-8"
    json.dumps(engine.summary().to_json(), ensure_ascii=False).encode("utf-8")  # no UnicodeEncodeError
    assert engine.get_request("fine").finish_reason == "stop"


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(temperature=1000.0), "temperature must be in [0, 100]"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(n=MAX_SAMPLES + 1), f"n must be >= 1 and <= {MAX_SAMPLES}"),
    (dict(n=32768), "n must be >= 1 and <= 256"),
    (dict(max_tokens=0), "max_tokens must be >= 1"),
    (dict(seed=-1), "seed must be a whole number >= 0"),
])
def test_sampling_params_bounds(kw, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kw)


def test_many_samples_share_one_block_without_overflow():
    engine = make_engine(pool_slots=4096, block_size=16)
    add(engine, "fan", range(8), output_len=2, max_tokens=4, n=MAX_SAMPLES)
    snaps = run_checked(engine)
    assert max(int(s.block_ref.max()) for s in snaps) == MAX_SAMPLES


@pytest.mark.parametrize("kw, message", [
    (dict(pool_slots=10**9), "pool_slots must be <= 1,048,576"),
    (dict(swap_slots=10**12), "swap_slots must be <= 1,048,576"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(block_size=32768), "block_size must be <= 1,024"),
    (dict(watermark=float("nan")), "watermark must be a number"),
])
def test_config_bounds_fail_fast(kw, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**kw)


def test_add_rejected_ends_as_rejected_while_others_run():
    engine = make_engine(pool_slots=256, block_size=4)
    engine.add_rejected("bad", "n must be >= 1 and <= 256, got 32,768", arrival_step=2)
    add(engine, "good", [1, 2, 3], output_len=4)
    run_checked(engine)
    assert rejected(engine) == {"bad": "n must be >= 1 and <= 256, got 32,768"}
    assert engine.get_request("good").finish_reason == "stop"
