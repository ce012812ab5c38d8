"""Recording: delta-encoded steps, keyframes every K, ``at(step)`` equal to the engine's full
snapshots, for random workloads on every allocator and both preemption modes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv_core.kv.registry import ALLOCATORS
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import (
    MAX_KEYFRAME_EVERY,
    MIN_KEYFRAME_EVERY,
    Recording,
    StepDelta,
    default_keyframe_every,
    delta_from_ranges,
    range_indices,
)
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.record.snapshot import BLOCK_ARRAYS, SEQ_ARRAYS, TABLE_ARRAYS
from pagedkv_core.record.step_codec import STEP_FIELDS, unpack
from pagedkv_core.workloads.scenarios import build_workload

from .engine_helpers import add
from .test_properties import SETTINGS, engine_configs, requests


def run(config: dict, reqs: list[dict], recording=None) -> list:
    engine = Engine(EngineConfig(**config), ScriptedSource(), recording=recording)
    for r in reqs:
        add(engine, r["rid"], r["prompt"], r["output_len"], r["max_tokens"], r["n"], r["arrival_step"])
    snaps = []
    while engine.has_unfinished():
        assert len(snaps) < 5000
        snaps.append(engine.step()[1])
    return snaps


def workload_run(name: str, allocator: str = "paged", recording=None, **config) -> list:
    workload = build_workload(name, 0)
    engine = Engine(EngineConfig(allocator=allocator, pool_slots=workload.pool_slots, **config), ScriptedSource(), recording=recording)
    workload.submit(engine)
    snaps = []
    while engine.has_unfinished():
        snaps.append(engine.step()[1])
    return snaps


@st.composite
def recorded_runs(draw):
    allocator = draw(st.sampled_from(sorted(ALLOCATORS)))
    config = draw(engine_configs(allocator=allocator))
    return config, draw(requests(max_len=40))


@settings(max_examples=40, **SETTINGS)
@given(recorded_runs(), st.integers(1, 6), st.randoms(use_true_random=False))
def test_every_step_rebuilds_equal_to_the_engines_snapshot(run_spec, keyframe_every, rnd):
    config, reqs = run_spec
    engine_rec = Recording(keyframe_every=keyframe_every)
    snaps = run(config, reqs, recording=engine_rec)  # the engine records its own deltas
    appended = Recording(keyframe_every=keyframe_every)
    for snap in snaps:
        appended.append(snap)  # full snapshots, diffed
    for rec in (engine_rec, appended):
        assert rec.num_steps == len(snaps) and list(rec.steps) == [s.step for s in snaps]
        order = list(range(len(snaps)))
        rnd.shuffle(order)
        for i in order + order[:3]:  # random access, then a few repeats
            assert rec.at(i) == snaps[i], f"step {i} of {len(snaps)}, K={keyframe_every}"
        assert rec.last() == snaps[-1]


@pytest.mark.parametrize("allocator, preemption", [("paged", "recompute"), ("paged", "swap"), ("contiguous", "recompute")])
def test_burst_with_preemption_rebuilds_in_order_and_backwards(allocator, preemption):
    rec = Recording()
    snaps = workload_run("burst", allocator, recording=rec, preemption=preemption)
    if allocator == "paged":
        assert snaps[-1].metrics.num_preemptions > 0
        assert (snaps[-1].metrics.num_swaps_out > 0) == (preemption == "swap")
    assert [rec.at(i) == snaps[i] for i in range(len(snaps))] == [True] * len(snaps)
    back = range(len(snaps) - 1, -1, -9)  # backwards: a keyframe and up to K - 1 records each
    assert [rec.at(i) == snaps[i] for i in back] == [True] * len(back)


def test_at_returns_copies_that_the_caller_may_change():
    rec = Recording(keyframe_every=4)
    snaps = workload_run("explainer40", recording=rec)
    got = rec.at(10)
    got.slot_token[:] = 7
    got.seq_num_tokens[:] = 7
    assert rec.at(10) == snaps[10] and rec.at(11) == snaps[11]


def test_keyframe_interval_follows_the_pool_size():
    assert default_keyframe_every(2048, 128) == MIN_KEYFRAME_EVERY
    assert default_keyframe_every(262_144, 16_384) == 256
    assert default_keyframe_every(1 << 20, 1 << 16) == MAX_KEYFRAME_EVERY
    rec = Recording()
    snaps = workload_run("explainer40", recording=rec)
    assert rec.keyframe_every == 32 and rec.num_keyframes == -(-len(snaps) // 32)


def test_recording_holds_far_less_than_full_snapshots():
    rec = Recording()
    snaps = workload_run("explainer40", recording=rec)
    full = sum(sum(getattr(s, n).nbytes for n in ("slot_state", "slot_owner", "slot_token")) for s in snaps)
    assert rec.nbytes < full / 5
    assert rec.nbytes > sum(len(r) for r in rec.records())


def test_range_indices_merge_overlaps_and_drop_empty_ranges():
    assert range_indices([]).tolist() == []
    assert range_indices([(5, 8), (0, 2), (6, 10), (3, 3), (9, 11)]).tolist() == [0, 1, 5, 6, 7, 8, 9, 10]
    assert range_indices([(4, 6), (4, 6)]).dtype == np.int32


@pytest.mark.parametrize("width", [1, 16, 3000], ids=["slots", "blocks", "reservations"])
def test_range_indices_are_each_index_once_sorted_whether_few_or_many(width):
    """A step's spans, overlapping, repeated, empty and out of order: the indices of their union,
    whether few enough to be sorted one by one or so many that the spans are merged first."""
    rng = np.random.default_rng(width)
    for _ in range(50):
        lo = rng.integers(0, 200_000, size=int(rng.integers(1, 40)))
        hi = lo + rng.integers(-2, width + 1, size=len(lo))
        spans = [int(v) for pair in zip(lo, hi) for v in pair]
        spans += spans[: 2 * int(rng.integers(0, 4))]  # some spans twice
        want = sorted({i for a, b in zip(spans[0::2], spans[1::2]) for i in range(a, b)})
        got = range_indices(spans)
        assert got.dtype == np.int32 and got.tolist() == want


def small_parts(snap) -> dict:
    out = {name: getattr(snap, name) for name in (*SEQ_ARRAYS, *TABLE_ARRAYS, "waiting", "running", "swapped")}
    return {**out, "events": snap.events, "metrics": snap.metrics}


def test_over_reported_entries_are_dropped_and_only_changes_stored():
    snaps = workload_run("explainer40")
    rec = Recording(keyframe_every=8)
    rec.start({n: getattr(snaps[0], n) for n in ("allocator", "block_size", "num_slots", "num_blocks", "num_host_blocks")})
    everything = [(0, snaps[0].num_slots)]
    blocks = [(0, snaps[0].num_blocks)]
    prev = None
    for snap in snaps[:30]:
        arrays = {name: getattr(snap, name) for name in ("slot_state", "slot_owner", "slot_token", "block_state", "block_ref", "block_fill", "block_hash")}
        rec.append_delta(delta_from_ranges(snap.step, arrays, everything, blocks, small_parts(snap)))
        stored = unpack(STEP_FIELDS, list(rec.records())[-1])
        if prev is not None:
            changed = (prev.slot_state != snap.slot_state) | (prev.slot_owner != snap.slot_owner) | (prev.slot_token != snap.slot_token)
            assert stored["slot_idx"].tolist() == np.flatnonzero(changed).tolist()
            assert (stored["slot_state"] == snap.slot_state[stored["slot_idx"]]).all()
        prev = snap
    assert all(rec.at(i) == snaps[i] for i in range(30))


def test_metric_series_events_and_bad_steps():
    rec = Recording()
    snaps = workload_run("shared_preamble", recording=rec)
    assert rec.metrics_series("kv_usage").tolist() == [s.metrics.kv_usage for s in snaps]
    assert rec.metrics_series("tokens_generated").dtype == np.int64
    assert rec.metrics(5) == snaps[5].metrics and rec.events(3) == snaps[3].events
    assert any(rec.events(i) for i in range(len(snaps)))
    with pytest.raises(KeyError, match="no metric"):
        rec.metrics_series("nope")
    with pytest.raises(IndexError, match=f"steps 0..{len(snaps) - 1}"):
        rec.at(len(snaps))
    with pytest.raises(IndexError):
        rec.at(-1)
    with pytest.raises(IndexError, match="no steps"):
        Recording().last()


def test_steps_must_follow_one_another():
    snaps = workload_run("burst")
    rec = Recording()
    rec.append(snaps[0])
    with pytest.raises(ValueError, match="does not follow"):
        rec.append(snaps[2])
    with pytest.raises(ValueError, match="keyframe_every"):
        Recording(keyframe_every=0)


def test_a_delta_may_start_from_an_allocators_own_arrays():
    """``start`` takes the pool before the first step; a delta then names only what changed."""
    rec = Recording(keyframe_every=2)
    n = 64
    rec.start({"allocator": "contiguous", "block_size": 1, "num_slots": n, "num_blocks": 0, "num_host_blocks": 0})
    empty = np.zeros(0, dtype=np.int32)
    seqs = {name: np.zeros(0, dtype=dt) for name, dt in {**SEQ_ARRAYS, **TABLE_ARRAYS}.items()}
    seqs["seq_table_offsets"] = np.zeros(1, dtype=np.int32)
    for step in range(5):
        idx = np.array([step, step + 10], dtype=np.int32)
        rec.append_delta(StepDelta(step, idx, np.full(2, SlotState.FILLED, np.int8), np.full(2, step, np.int32),
                                   np.full(2, 100 + step, np.int32), empty,
                                   *(np.zeros(0, dt) for dt in BLOCK_ARRAYS.values()), seqs))
    snap = rec.at(4)
    assert np.flatnonzero(snap.slot_state).tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    assert snap.slot_token[[0, 4, 14]].tolist() == [100, 104, 104] and snap.slot_owner[5] == -1
    assert rec.at(1).slot_token[:3].tolist() == [100, 101, -1]


@st.composite
def table_histories(draw):
    """Steps of live sequences in a random order, each with a table that keeps some prefix of
    its previous one and grows a new tail, and queues that may or may not follow the order."""
    steps, tables = [], {}
    for _ in range(draw(st.integers(1, 12))):
        live = draw(st.lists(st.integers(0, 12), unique=True, max_size=8))
        for sid in live:
            old = tables.get(sid, [])
            keep = draw(st.integers(0, len(old)))
            tables[sid] = old[:keep] + draw(st.lists(st.integers(0, 40), max_size=4))
        split = sorted(draw(st.lists(st.integers(0, len(live)), min_size=2, max_size=2)))
        queues = [live[: split[0]], live[split[0] : split[1]], live[split[1] :]]
        if draw(st.booleans()):
            queues = [list(reversed(q)) for q in queues]
        rows = draw(st.lists(st.integers(0, 3), min_size=len(live), max_size=len(live)))
        steps.append((live, {sid: list(tables[sid]) for sid in live}, queues, rows))
    return steps


def history_snapshot(step: int, live, tables, queues, rows):
    from pagedkv_core.record.snapshot import StepSnapshot

    n = len(live)
    lengths = [len(tables[s]) for s in live]
    return StepSnapshot(
        step=step, allocator="paged", block_size=2, num_slots=8, num_blocks=4, num_host_blocks=0,
        slot_state=np.zeros(8, np.int8), slot_owner=np.full(8, -1, np.int32), slot_token=np.full(8, -1, np.int32),
        **{name: np.zeros(4, dt) for name, dt in BLOCK_ARRAYS.items()},
        seq_id=np.array(live, np.int32), seq_request=np.array(live, np.int32) * 10, seq_sample=np.zeros(n, np.int32),
        seq_status=np.array(rows, np.int8), seq_num_tokens=np.array(lengths, np.int32) * 2 + step,
        seq_num_computed=np.array(rows, np.int32), seq_num_blocks=np.array(lengths, np.int32),
        seq_reserved_start=np.full(n, -1, np.int32),
        seq_table_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        seq_tables=np.array([b for s in live for b in tables[s]], np.int32),
        running=tuple(queues[0]), waiting=tuple(queues[1]), swapped=tuple(queues[2]),
    )


@settings(max_examples=80, **SETTINGS)
@given(table_histories(), st.integers(1, 4), st.booleans())
def test_tables_rows_and_queues_survive_any_reordering(history, keyframe_every, hinted):
    snaps = [history_snapshot(i, *h) for i, h in enumerate(history)]
    rec = Recording(keyframe_every=keyframe_every)
    prev = {}
    for snap, (live, tables, _, _) in zip(snaps, history):
        if not hinted:
            rec.append(snap)
            continue
        if rec.scalars is None:
            rec.start({n: getattr(snap, n) for n in ("allocator", "block_size", "num_slots", "num_blocks", "num_host_blocks")})
        changed = [s for s in live if prev.get(s) != tables[s]]  # what an allocator would report
        prev = tables
        arrays = {n: getattr(snap, n) for n in ("slot_state", "slot_owner", "slot_token", "block_state", "block_ref", "block_fill", "block_hash")}
        rec.append_delta(delta_from_ranges(snap.step, arrays, [], [], small_parts(snap), table_ids=changed))
    for i in [*range(len(snaps)), *reversed(range(len(snaps)))]:
        assert rec.at(i) == snaps[i]


def test_at_without_copy_gives_read_only_views_that_follow_the_cursor():
    rec = Recording(keyframe_every=4)
    snaps = workload_run("explainer40", recording=rec)
    view = rec.at(20, copy=False)
    assert view == snaps[20] and not view.slot_state.flags.writeable
    with pytest.raises(ValueError):
        view.slot_token[0] = 1
    assert rec.at(21, copy=False) == snaps[21] and rec.at(3) == snaps[3]


# ---------------------------------------------------------------------------- idle runs
def _gapped_run(skip_idle: bool, keyframe_every: int | None = None):
    """Requests with long gaps between them (steps 3-49 and 55-199 have nothing to do): the
    engine's snapshots of every step and its recording."""
    engine = Engine(EngineConfig(pool_slots=512, block_size=4), ScriptedSource(),
                    recording=Recording(keyframe_every), skip_idle=skip_idle)
    add(engine, "a", [5, 6, 7, 8], 3, arrival_step=0)
    add(engine, "b", [9, 10, 11], 2, arrival_step=50)
    add(engine, "c", [12, 13], 4, arrival_step=51)
    add(engine, "d", [14, 15, 16], 2, arrival_step=200)
    snaps = {}
    while engine.has_unfinished():
        before = engine.step_index
        snap = engine.step()[1]
        snaps[before] = snap
    return engine.recording, snaps


@pytest.mark.parametrize("keyframe_every", [None, 8])
def test_an_idle_stretch_is_one_record_and_every_step_in_it_rebuilds(keyframe_every):
    rec, snaps = _gapped_run(True, keyframe_every)
    plain, every = _gapped_run(False, keyframe_every)
    assert rec.num_steps == plain.num_steps == 202
    runs = rec.idle_runs()
    assert [n for _, n in runs] == [46, 144] and [s for s, _ in runs] == [4, 56]  # after the steps that say idle_skipped
    assert rec.num_records == 202 - 45 - 143
    assert rec.metrics(3).idle_skipped == 46 and rec.metrics(10).idle_skipped == 0
    for s in rec.steps:  # every step, inside a run too, equals the engine's own
        want = plain.at(s)
        got = rec.at(s)
        assert got.step == s and got.events == want.events
        assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in ("slot_state", "slot_owner", "slot_token",
                                                                               "block_state", "block_ref", "seq_id"))
    for s in (200, 57, 150, 4, 0, 201, 100, 49, 8, 16):  # backwards, across runs and keyframes
        assert rec.at(s) == snaps.get(s, rec.at(s)) and rec.at(s).slot_token.tolist() == plain.at(s).slot_token.tolist()
    for s, snap in snaps.items():  # the steps the engine took (it skipped the rest)
        assert rec.at(s) == snap
    series = rec.metrics_series("idle_skipped")
    assert len(series) == 202 and series[3] == 46 and series.sum() == 46 + 144
    assert [rec.events(s) for s in rec.steps] == [plain.events(s) for s in plain.steps]


def test_an_idle_run_replays_into_another_recording_as_one_run():
    rec, _ = _gapped_run(True)
    copy = rec.replay_into(Recording())
    assert copy.idle_runs() == rec.idle_runs() and copy.num_records == rec.num_records
    assert all(copy.at(s) == rec.at(s) for s in rec.steps)
    with pytest.raises(ValueError, match="first step"):
        _fresh_started().append_idle(3, rec.metrics(5))
    with pytest.raises(ValueError, match="covers"):
        copy.append_idle(0, rec.metrics(5))


def _fresh_started() -> Recording:
    out = Recording()
    out.start({"allocator": "paged", "block_size": 4, "num_slots": 16, "num_blocks": 4, "num_host_blocks": 0})
    return out
