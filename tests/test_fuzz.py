"""Engine fuzz: many small random workloads through every allocator and both preemption modes,
with the allocator invariants, the snapshot and the KV contents (the KV oracle) checked after
every step, and every request's end checked against its scripted stream.

Seeded, so a failure names its case (``case_seed``) and reproduces exactly. The default suite
runs at least :data:`MIN_STEPS` steps in total (about 40 s on two cores); ``PAGEDKV_FUZZ_STEPS``
sets that number (a soak run: ``PAGEDKV_FUZZ_STEPS=5000000``).
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

from pagedkv_core import events
from pagedkv_core.kv.registry import ALLOCATORS, allocator_kind
from pagedkv_core.config import PREEMPTION_MODES

from .engine_helpers import add, check_snapshot, expected_stream, make_engine

MIN_STEPS = int(os.environ.get("PAGEDKV_FUZZ_STEPS", "100000"))
COMBOS = [(a, m) for a in ALLOCATORS for m in PREEMPTION_MODES]
STEPS_PER_COMBO = -(-MIN_STEPS // len(COMBOS))
MAX_STEPS_PER_CASE = 5000  # a case that runs longer than this has stopped making progress


def random_case(rng: np.random.Generator, allocator: str, preemption: str) -> tuple[dict, list[dict]]:
    """A small engine and a few requests: shared prefixes over a tiny alphabet (so blocks hash
    alike and the prefix cache hits), n up to 4, staggered arrivals, and sizes from well inside
    the pool to more than it holds."""
    block_size = int(rng.choice([1, 2, 3, 4, 8, 16, 32]))
    # Few blocks: pressure (preemption, eviction, swap) is the point, and the per-step checks
    # cost in proportion to the blocks.
    pool_slots = block_size * int(rng.integers(2, 33)) + int(rng.integers(0, block_size))
    config = dict(
        allocator=allocator,
        preemption=preemption,
        block_size=block_size,
        pool_slots=pool_slots,
        watermark=float(rng.choice([0.0, 0.0, 0.01, 0.1, 0.3])),
        swap_slots=int(rng.choice([0, block_size, 4 * block_size, pool_slots])),
        prefix_caching=bool(rng.integers(0, 2)),
        max_batch_tokens=[None, None, 1, 5, 16, 64][int(rng.integers(0, 6))],
        seed=int(rng.integers(0, 2**31 - 1)),
    )
    vocab = int(rng.integers(4, 9))
    prefix = rng.integers(3, vocab, size=int(rng.integers(0, 40))).tolist()
    requests = []
    for i in range(int(rng.integers(1, 9))):
        own = rng.integers(3, vocab, size=int(rng.integers(0, 30))).tolist()
        prompt = (prefix if rng.integers(0, 3) else []) + own or [3]
        requests.append(dict(
            rid=f"r{i}",
            prompt=prompt,
            output_len=int(rng.integers(1, 40)),
            max_tokens=int(rng.integers(1, 48)),
            n=int(rng.choice([1, 1, 1, 2, 3, 4])),
            arrival_step=int(rng.integers(0, 12)),
        ))
    return config, requests


def usable_slots(engine) -> int:
    """Slots a lone request can use: whole blocks for the paged pool, every slot otherwise."""
    cfg = engine.config
    if allocator_kind(cfg.allocator) == "paged":
        return cfg.num_blocks * cfg.block_size
    return cfg.pool_slots


def run_case(config: dict, requests: list[dict], seen: Counter) -> int:
    """Runs one case to the end with every check; returns its number of steps and counts the
    kinds of events it saw in ``seen`` (and "cut" for requests the pool could not hold)."""
    engine = make_engine(**config)
    for r in requests:
        add(engine, **r)
    steps = 0
    while engine.has_unfinished():
        assert steps < MAX_STEPS_PER_CASE, "engine did not finish"
        _outputs, snap = engine.step()
        engine.check_invariants()
        check_snapshot(engine, snap)
        seen.update(e.kind for e in snap.events)
        steps += 1
    room = usable_slots(engine)
    rejected = {r["id"]: r["reason"] for r in engine.summary().rejected}
    for r in requests:
        req = engine.get_request(r["rid"])
        assert req.finished, r["rid"]
        reason, full = expected_stream(r["rid"], r["n"], r["output_len"], r["max_tokens"])
        got = tuple(tuple(o) for o in req.output_token_ids)
        fits_alone = len(r["prompt"]) + r["max_tokens"] <= room
        if r["rid"] in rejected:
            assert not fits_alone, (r["rid"], rejected[r["rid"]])
            assert req.reject_reason == rejected[r["rid"]] and all(len(o) == 0 for o in got)
        elif fits_alone:  # it must produce exactly its scripted stream, however it was preempted
            assert (req.finish_reason, got) == (reason, full), r["rid"]
        else:  # admitted, then cut short when the pool could not hold it: a prefix of its stream
            seen["cut"] += got != full
            assert len(got) == r["n"]
            assert all(len(g) >= 1 and g == f[: len(g)] for g, f in zip(got, full)), r["rid"]
    if engine.summary().requests:
        alloc = engine.allocator
        assert alloc.allocated_slots == 0 and alloc.filled_slots == 0  # nothing leaked
    return steps


# What every combination must have exercised, so that the fuzz keeps testing what it claims.
# A contiguous reservation holds a request's whole future, so only the paged pool preempts,
# cuts a request short, shares blocks and copies on write.
MUST_SEE = {events.ADMIT, events.FINISH, events.REJECT}
MUST_SEE_PAGED = {events.PREEMPT_RECOMPUTE, "cut", events.CACHE_HIT, events.FORK, events.COW, events.APPEND}


@pytest.mark.parametrize("allocator, preemption", COMBOS)
def test_fuzz_engine(allocator, preemption):
    """Seeded random cases until this combination has run its share of the steps."""
    steps = cases = 0
    seen: Counter = Counter()
    while steps < STEPS_PER_COMBO:
        case_seed = [COMBOS.index((allocator, preemption)), cases]
        config, requests = random_case(np.random.default_rng(case_seed), allocator, preemption)
        try:
            steps += run_case(config, requests, seen)
        except AssertionError as exc:
            raise AssertionError(f"case_seed={case_seed} config={config} requests={requests}: {exc}") from None
        cases += 1
    assert steps >= STEPS_PER_COMBO and cases > 10
    paged = allocator_kind(allocator) == "paged"
    wanted = MUST_SEE | (MUST_SEE_PAGED if paged else set()) | ({events.PREEMPT_SWAP, events.SWAP_IN} if paged and preemption == "swap" else set())
    assert wanted <= set(seen), f"never exercised: {sorted(wanted - set(seen))}"
