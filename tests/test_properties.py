"""Property tests: random workloads, pools, block sizes (1-128), watermarks, both preemption
modes and both allocators, with the allocator invariants and the KV oracle checked after
every step."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv_core.record.slot_state import SlotState

from .engine_helpers import add, expected_stream, make_engine, run_checked, streams

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def requests(draw, max_len: int, fit_slots: int | None = None):
    """A few requests with shared prefixes (so that the prefix cache hits) and n <= 3."""
    vocab = draw(st.integers(3, 6))  # a tiny alphabet: identical blocks happen often
    prefix = draw(st.lists(st.integers(3, vocab), max_size=max_len))
    out = []
    for i in range(draw(st.integers(1, 7))):
        own = draw(st.lists(st.integers(3, vocab), max_size=max_len // 3))
        prompt = (prefix if draw(st.integers(0, 3)) else []) + own
        if not prompt:
            prompt = [3]
        max_tokens = draw(st.integers(1, 24))
        if fit_slots is not None:  # the request fits the pool alone: its stream never gets cut
            prompt = prompt[: max(1, fit_slots - 24)]
        out.append(
            dict(
                rid=f"r{i}",
                prompt=prompt,
                output_len=draw(st.integers(1, 24)),
                max_tokens=max_tokens,
                n=draw(st.sampled_from([1, 1, 2, 3])),
                arrival_step=draw(st.integers(0, 6)),
            )
        )
    return out


@st.composite
def engine_configs(draw, pool_slots: int | None = None, allocator: str | None = None):
    block_size = draw(st.one_of(st.integers(1, 8), st.sampled_from([16, 32, 64, 128])))
    if pool_slots is None:
        pool_slots = block_size * draw(st.integers(1, max(1, 160 // block_size))) + draw(st.integers(0, block_size - 1))
    return dict(
        block_size=block_size,
        pool_slots=max(pool_slots, block_size),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.1, 0.3, 0.6])),
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        swap_slots=draw(st.sampled_from([0, block_size, 4 * block_size, None])),
        prefix_caching=draw(st.booleans()),
        max_batch_tokens=draw(st.sampled_from([None, None, 1, 7, 32])),
        allocator=allocator or draw(st.sampled_from(["paged", "paged", "contiguous"])),
    )


def _check_end_state(engine, snap) -> None:
    alloc = engine.allocator
    assert alloc.allocated_slots == 0 and alloc.filled_slots == 0
    if snap.allocator == "paged":
        assert (snap.block_ref == 0).all()
        assert np.isin(snap.block_state, (SlotState.FREE, SlotState.CACHED)).all()
        assert np.isin(snap.slot_state, (SlotState.FREE, SlotState.CACHED)).all()
        assert alloc.pool.num_free_blocks == alloc.num_blocks
        assert alloc.host.num_used_blocks == 0
    else:
        assert (snap.slot_state == SlotState.FREE).all()
        assert alloc.free_lens == [alloc.num_slots]
    assert (snap.slot_owner == -1).all()


@settings(max_examples=200, **SETTINGS)
@given(config=engine_configs(), reqs=requests(max_len=48))
def test_invariants_hold_after_every_step(config, reqs):
    engine = make_engine(**config)
    for r in reqs:
        add(engine, **r)
    snaps = run_checked(engine, max_steps=5000)
    s = engine.summary()
    assert s.finished + len(s.rejected) == s.requests == len(reqs)
    for r in engine.requests.values():
        assert r.finished
        if r.reject_reason is None:
            assert all(len(o) >= 1 for o in r.output_token_ids)
    if snaps:
        _check_end_state(engine, snaps[-1])


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_token_streams_do_not_depend_on_the_configuration(data):
    """Whatever the allocator, block size, watermark, preemption mode or budget, each request
    (fitting the pool alone) produces exactly its scripted stream."""
    pool_slots = data.draw(st.integers(64, 200), label="pool_slots")
    reqs = data.draw(requests(max_len=40, fit_slots=pool_slots // 2), label="requests")
    configs = [
        dict(block_size=16, pool_slots=pool_slots, watermark=0.0, preemption="recompute"),
        data.draw(engine_configs(pool_slots=pool_slots, allocator="paged"), label="paged"),
        data.draw(engine_configs(pool_slots=pool_slots, allocator="paged"), label="paged2"),
        data.draw(engine_configs(pool_slots=pool_slots, allocator="contiguous"), label="contiguous"),
    ]
    expected = {r["rid"]: expected_stream(r["rid"], r["n"], r["output_len"], r["max_tokens"]) for r in reqs}
    for config in configs:
        # Every request must fit the pool alone (in whole blocks), else its stream is cut.
        usable = (config["pool_slots"] // config["block_size"]) * config["block_size"]
        if any(len(r["prompt"]) + r["max_tokens"] > usable for r in reqs):
            continue
        engine = make_engine(**config)
        for r in reqs:
            add(engine, **r)
        run_checked(engine, max_steps=5000)
        assert streams(engine) == expected, config


@settings(max_examples=40, **SETTINGS)
@given(
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    mode=st.sampled_from(["recompute", "swap"]),
    watermark=st.sampled_from([0.0, 0.05, 0.2]),
    seed=st.integers(0, 1000),
)
def test_pressure_preempts_and_recovers(block_size, mode, watermark, seed):
    """A pool far too small for the load: preemptions happen, every request still finishes
    with its full stream."""
    rng = np.random.default_rng(seed)
    engine = make_engine(
        block_size=block_size, pool_slots=12 * block_size if block_size > 4 else 48, watermark=watermark,
        preemption=mode, swap_slots=6 * block_size,
    )
    usable = engine.allocator.num_slots
    expected = {}
    for i in range(6):
        prompt = rng.integers(3, 9, size=int(rng.integers(1, usable // 3))).tolist()
        max_tokens = int(rng.integers(1, usable - len(prompt) + 1))
        output_len = int(rng.integers(1, 40))
        add(engine, f"p{i}", prompt, output_len, max_tokens=max_tokens, arrival_step=int(rng.integers(0, 3)))
        expected[f"p{i}"] = expected_stream(f"p{i}", 1, output_len, max_tokens)
    snaps = run_checked(engine, max_steps=5000)
    assert streams(engine) == expected
    _check_end_state(engine, snaps[-1])
