"""The allocator contract: the registry, stated capabilities, and every registered allocator
running real workloads with its invariants checked after every step."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.kv.registry import ALLOCATORS, CONTIGUOUS_POLICIES, allocator_kind, build_allocator
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.kv.contiguous_best_fit import BestFitContiguousAllocator
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import build_workload

from .engine_helpers import add, lone_sequence, make_engine, run_checked, streams

CAPABILITIES = ("swap", "fork", "fragmentation")


@pytest.mark.parametrize("name", list(ALLOCATORS))
def test_registry_entry_states_its_contract(name):
    cls = ALLOCATORS[name]
    assert cls.name == name and cls.kind in ("paged", "contiguous")
    for flag in CAPABILITIES:
        assert isinstance(getattr(cls.capabilities, flag), bool), f"{name}.capabilities.{flag} must be stated"
    alloc = build_allocator(EngineConfig(allocator=name, pool_slots=256, block_size=4), 200)
    assert alloc.max_model_len == 200  # passed in, never set from outside
    assert alloc.changes.take() == []  # nothing logged: no change log was given


def test_unknown_allocator_is_a_one_line_error():
    with pytest.raises(ConfigError, match="allocator must be one of paged, contiguous"):
        EngineConfig(allocator="buddy")


@pytest.mark.parametrize("name", list(ALLOCATORS))
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_every_allocator_runs_checked_with_the_same_tokens(name, preemption):
    engine = make_engine(allocator=name, pool_slots=160, block_size=4, preemption=preemption, swap_slots=64)
    rng = np.random.default_rng(7)
    for i in range(24):
        add(engine, f"r{i}", rng.integers(0, 500, int(rng.integers(3, 30))), output_len=int(rng.integers(1, 40)),
            max_tokens=48, arrival_step=int(rng.integers(0, 30)), n=1 + (i % 5 == 0))
    snaps = run_checked(engine)
    assert all(s.allocator == name and s.kind == allocator_kind(name) for s in snaps)
    reference = make_engine(allocator="paged", pool_slots=4096, block_size=4)
    rng = np.random.default_rng(7)
    for i in range(24):
        add(reference, f"r{i}", rng.integers(0, 500, int(rng.integers(3, 30))), output_len=int(rng.integers(1, 40)),
            max_tokens=48, arrival_step=int(rng.integers(0, 30)), n=1 + (i % 5 == 0))
    run_checked(reference)
    assert streams(engine) == streams(reference)


def test_orca_reservations_max_pow2_oracle():
    sizes = {}
    for policy, name in CONTIGUOUS_POLICIES.items():
        alloc = build_allocator(EngineConfig(allocator=name, pool_slots=1000), 1 << 20)
        seq = lone_sequence(range(10), max_tokens=200)
        seq.request.output_len = 37
        sizes[policy] = alloc.reservation_size(seq)
    assert sizes == {"max": 10 + 200, "pow2": 10 + 64, "oracle": 10 + 37}


def test_pow2_never_reserves_more_than_max_tokens():
    alloc = build_allocator(EngineConfig(allocator="contiguous-pow2", pool_slots=1000), 1 << 20)
    seq = lone_sequence(range(10), max_tokens=40)
    seq.request.output_len = 33  # rounds up to 64, but the answer can never pass 40
    assert alloc.reservation_size(seq) == 50


def test_best_fit_takes_the_smallest_hole_that_fits():
    bf = BestFitContiguousAllocator(EngineConfig(allocator="contiguous-best-fit", pool_slots=100, block_size=1))
    seqs = [lone_sequence(range(5), rid=f"s{i}", index=i, seq_id=i, max_tokens=n - 5)
            for i, n in enumerate((30, 10, 20, 15, 25))]  # fills 0..100 exactly
    for s in seqs:
        assert bf.try_admit(s).cached_tokens == 0
    bf.free(seqs[0])  # hole of 30 at 0
    bf.free(seqs[2])  # hole of 20 at 40
    new = lone_sequence(range(5), rid="n", index=9, seq_id=9, max_tokens=13)  # needs 18
    assert bf.try_admit(new).cached_tokens == 0
    assert bf.reservations[9] == (40, 18)  # first fit would have taken slot 0
    bf.check_invariants([seqs[1], seqs[3], seqs[4], new])


def test_on_explainer40_utilization_orders_max_pow2_oracle_paged():
    util = {}
    for name in ("contiguous", "contiguous-pow2", "contiguous-oracle", "paged"):
        engine = Engine(EngineConfig(allocator=name), ScriptedSource())
        build_workload("explainer40").submit(engine)
        util[name] = engine.run().mean_token_utilization
    assert util["contiguous"] < util["contiguous-pow2"] < util["contiguous-oracle"] < util["paged"]
