"""StepSnapshot: per-slot/per-block/per-sequence arrays, metrics, JSON-lines traces."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pagedkv_core.sequence import SequenceStatus
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.record.snapshot import StepSnapshot
from pagedkv_core.record.trace_file import TraceError, read_trace, write_trace

from .engine_helpers import add, make_engine, run_checked


def shared_run(allocator="paged"):
    engine = make_engine(allocator=allocator, block_size=4, pool_slots=96, swap_slots=16)
    add(engine, "a", range(3, 13), output_len=6, max_tokens=8, n=2)
    add(engine, "b", range(3, 13), output_len=3, max_tokens=8, arrival_step=3)  # shares a's prompt blocks
    return engine, run_checked(engine)


def test_snapshot_is_a_copy_not_a_view():
    engine = make_engine(block_size=4, pool_slots=64)
    add(engine, "r", range(3, 10), output_len=4)
    _, first = engine.step()
    before = first.slot_state.copy(), first.slot_token.copy(), first.block_ref.copy()
    engine.run()
    assert np.array_equal(first.slot_state, before[0]) and np.array_equal(first.slot_token, before[1])
    assert np.array_equal(first.block_ref, before[2])


def test_paged_snapshot_fields_and_state_codes():
    engine = make_engine(block_size=4, pool_slots=64)
    add(engine, "a", range(3, 13), output_len=6, max_tokens=8, n=2)  # 10 tokens: blocks 4+4+2
    _, s0 = engine.step()  # prefill + fork
    assert s0.allocator == "paged" and s0.block_size == 4 and s0.num_slots == 64 and s0.num_blocks == 16
    assert s0.slot_state.dtype == np.int8 and s0.slot_owner.dtype == np.int32 and s0.block_ref.dtype == np.int32
    assert len(s0.seq_id) == 2 and set(s0.seq_status.tolist()) == {SequenceStatus.RUNNING}
    t0 = s0.block_table(int(s0.seq_id[0]))
    assert t0 == s0.block_table(int(s0.seq_id[1])) and len(t0) == 3
    assert s0.block_owners(t0[0]) == sorted(s0.seq_id.tolist())
    assert s0.block_ref[t0].tolist() == [2, 2, 2] and s0.block_fill[t0].tolist() == [4, 4, 2]
    tail = t0[2] * 4
    assert s0.slot_state[tail : tail + 4].tolist() == [SlotState.SHARED] * 2 + [SlotState.EMPTY] * 2
    assert (s0.slot_owner[tail : tail + 4] == 0).all()  # request index 0
    assert s0.slot_token[t0[0] * 4 : t0[0] * 4 + 4].tolist() == [3, 4, 5, 6]
    assert s0.block_hash[t0[0]] != 0 and s0.block_hash[t0[2]] == 0
    assert (s0.slot_state[s0.block_ref.repeat(4) == 0] == SlotState.FREE).all()
    assert s0.block_owner[t0[0]] == 0
    engine.run()


def test_cached_free_blocks_show_their_tokens_without_an_owner():
    engine, snaps = shared_run()
    last = snaps[-1]
    cached = np.flatnonzero(last.block_state == SlotState.CACHED)
    assert len(cached) >= 2
    slots = (cached[:, None] * 4 + np.arange(4)).ravel()
    assert (last.slot_state[slots] == SlotState.CACHED).all()
    assert (last.slot_owner[slots] == -1).all() and (last.slot_token[slots] >= 0).all()
    assert last.metrics.kv_usage == 0.0 and last.metrics.token_utilization == 0.0


def test_metrics_count_hits_usage_and_utilization():
    engine, snaps = shared_run()
    hit = [s for s in snaps if any(e.kind == "cache_hit" for e in s.events)]
    assert hit and hit[0].step == 3
    m = hit[0].metrics
    assert m.prefix_hit_tokens == 8 and m.prefix_queried_tokens == 20
    assert m.prefix_cache_hit_rate == pytest.approx(8 / 20)
    for s in snaps:
        m = s.metrics
        assert m.kv_usage == pytest.approx((s.block_ref > 0).sum() / s.num_blocks)
        if m.allocated_slots:
            assert m.token_utilization == pytest.approx(m.filled_slots / m.allocated_slots)
    assert snaps[-1].metrics.num_finished == 2 and snaps[-1].metrics.tokens_generated == 6 * 2 + 3
    assert max(s.metrics.max_blocks_per_seq for s in snaps) == 4  # 10 + 6 tokens, 15 with K/V


def test_contiguous_snapshot_is_per_slot():
    engine = make_engine(allocator="contiguous", pool_slots=64)
    add(engine, "a", range(3, 13), output_len=3, max_tokens=20)
    _, s0 = engine.step()
    assert s0.allocator == "contiguous" and s0.block_size == 1 and s0.num_blocks == 0 and len(s0.block_ref) == 0
    assert s0.seq_reserved_start.tolist() == [0] and s0.seq_num_blocks.tolist() == [30]
    assert s0.block_table(int(s0.seq_id[0])) == list(range(30))
    assert (s0.slot_state[:10] == SlotState.FILLED).all() and (s0.slot_state[10:30] == SlotState.EMPTY).all()
    assert (s0.slot_state[30:] == SlotState.FREE).all()
    assert s0.metrics.kv_usage == 30 / 64 and s0.metrics.token_utilization == 10 / 30


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_trace_round_trips_to_equal_snapshots(tmp_path, allocator):
    engine, snaps = shared_run(allocator)
    header = engine.trace_header()
    path = write_trace(tmp_path / "t.jsonl", snaps, header)
    got_header, got = read_trace(path)
    assert got_header == json.loads(json.dumps(header))
    assert got_header["config"]["allocator"] == allocator and got_header["requests"][1]["id"] == "b"
    assert got == snaps
    assert all(a.slot_state.dtype == b.slot_state.dtype for a, b in zip(got, snaps))
    assert got[0] != got[1]


def test_snapshot_equality_notices_differences():
    _, snaps = shared_run()
    s = snaps[2]
    clone = StepSnapshot.from_json(json.loads(json.dumps(s.to_json())))
    assert clone == s
    clone.slot_token[0] += 1
    assert clone != s


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("", "empty"),
        ("not json\n", "not JSON"),
        ('{"hello": 1}\n', "header"),
        ('{"type":"header","format":"pagedkv-trace","version":99}\n', "version"),
        ('{"type":"header","format":"pagedkv-trace","version":1}\n{"type":"step"}\n', "missing"),
        ('{"type":"header","format":"pagedkv-trace","version":1}\n[1,2]\n', "step record"),
    ],
)
def test_malformed_traces_raise_trace_error(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=fragment) as info:
        read_trace(path)
    assert "\n" not in str(info.value)


def test_trace_with_wrong_array_lengths_is_rejected(tmp_path):
    _, snaps = shared_run()
    path = write_trace(tmp_path / "t.jsonl", snaps[:1], {}, version=1)  # a version-1 trace, edited by hand
    lines = path.read_text().splitlines()
    step = json.loads(lines[1])
    step["slot_state"] = step["slot_state"][:-1]
    path.write_text(lines[0] + "\n" + json.dumps(step) + "\n")
    with pytest.raises(TraceError, match="slot_state"):
        read_trace(path)


def test_missing_trace_file_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "nope.jsonl")
