"""Decode runs recorded as runs: a recording or trace of ``Engine(coalesce=True)`` gets each decode
run in one call, a trace (version 5) keeps it as one frame, and what loads is the same run.

Checked against the same engine stepping one step at a time into a version-4 trace: every step's
snapshot (pool, sequences, tables, queues, events and metrics but the token source's time) equal,
the metric rows a reader takes without decoding records equal, and the frames what they should be;
a run the step before cannot take fails in one line.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from pagedkv_core.cli import main as cli_main
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.metrics import StepMetrics
from pagedkv_core.record import trace_file
from pagedkv_core.record.decode_run import DecodeWrites, pack_run, unpack_run
from pagedkv_core.record.recording import Recording
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.record.trace_file import TraceError, TraceWriter, load_recording, metric_rows, trace_records
from pagedkv_core.record.trace_frames import KIND_RUN, join_frames, split_frames
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import stream_workload_file

DATA = Path(__file__).resolve().parents[1] / "pagedkv_core" / "data"
MOONCAKE = DATA / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE = DATA / "azure_conv_2023.csv"
EXECUTE = [f.name for f in fields(StepMetrics)].index("execute_s")

CASES = {  # (log, requests, length scale, config)
    "mooncake-paged": (MOONCAKE, 80, 1 / 16, EngineConfig(pool_slots=32_768, block_size=32)),
    "mooncake-small-pool": (MOONCAKE, 80, 1 / 32, EngineConfig(pool_slots=1_024, block_size=16)),  # recompute, hits
    "mooncake-contiguous": (MOONCAKE, 80, 1 / 64, EngineConfig(pool_slots=16_384, block_size=16, allocator="contiguous")),
    "azure-swap": (AZURE, 50, None, EngineConfig(pool_slots=4_096, block_size=16, preemption="swap")),
}


def _record(case: str, recording, coalesce: bool) -> Engine:
    path, count, scale, config = CASES[case]
    workload = stream_workload_file(path, 0, count=count, **({"length_scale": scale} if scale else {}))
    engine = Engine(config, ScriptedSource(), recording=recording, snapshots=False, skip_idle=True, coalesce=coalesce)
    engine.feed(workload.requests())
    while engine.has_unfinished():
        engine.step(snapshot=False, outputs=False)
        engine.check_invariants()
    if isinstance(recording, TraceWriter):
        recording.close()
    return engine


def _assert_same_steps(a: Recording, b: Recording) -> None:
    assert a.steps == b.steps
    for step in a.steps:
        x, y = a.at(step, copy=False), b.at(step, copy=False)
        for name in x.__dataclass_fields__:
            u, v = getattr(x, name), getattr(y, name)
            if name == "metrics":
                u, v = {**u.to_json(), "execute_s": 0.0}, {**v.to_json(), "execute_s": 0.0}
            if isinstance(u, np.ndarray):
                assert np.array_equal(u, v), (step, name)
            else:
                assert u == v, (step, name)


def _rows(path: Path) -> list:
    return [(steps, values[:EXECUTE] + values[EXECUTE + 1:]) for _, steps, values in metric_rows(path)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_trace_with_runs_loads_as_the_run_step_by_step(tmp_path, case):
    runs, steps = tmp_path / "runs.trace", tmp_path / "steps.trace"
    engine = _record(case, TraceWriter(runs), coalesce=True)
    _record(case, TraceWriter(steps, version=4), coalesce=False)
    kinds = Counter(r["type"] for r in trace_records(runs))
    assert trace_records(runs)[0]["version"] == trace_file.TRACE_VERSION == 5
    assert kinds["run"] > 0 and engine.coalesced_steps > kinds["run"]
    assert kinds["delta"] + kinds["run"] < Counter(r["type"] for r in trace_records(steps))["delta"]
    header, loaded = load_recording(runs)
    assert not header.get("truncated") and loaded.num_steps == engine.step_index
    _assert_same_steps(loaded, load_recording(steps)[1])
    assert _rows(runs) == _rows(steps)


def test_an_in_memory_recording_takes_runs_step_by_step():
    a, b = Recording(), Recording()
    engine = _record("mooncake-paged", a, coalesce=True)
    _record("mooncake-paged", b, coalesce=False)
    assert engine.coalesced_steps > 0 and a.num_records == b.num_records  # a run's steps kept one by one
    _assert_same_steps(a, b)


def test_version_4_writes_a_runs_steps_one_by_one(tmp_path):
    v4 = tmp_path / "v4.trace"
    engine = _record("mooncake-contiguous", TraceWriter(v4, version=4), coalesce=True)
    assert engine.coalesced_steps > 0 and "run" not in {r["type"] for r in trace_records(v4)}
    assert load_recording(v4)[1].num_steps == engine.step_index


def _by_hand(tmp_path: Path) -> Path:
    """One request, block size 16: step 0 prefills 5 tokens, steps 1..10 are one run."""
    path = tmp_path / "hand.trace"
    writer = TraceWriter(path)
    engine = Engine(EngineConfig(pool_slots=256, block_size=16), ScriptedSource(), recording=writer, snapshots=False,
                    coalesce=True)
    engine.add_request("r", list(range(10, 15)), SamplingParams(max_tokens=100), output_len=40)
    while engine.has_unfinished():
        engine.step(snapshot=False, outputs=False)
    writer.close()
    return path


def test_a_run_frame_by_hand(tmp_path):
    path = _by_hand(tmp_path)
    records = trace_records(path)
    assert [r["step"] for r in records if r["type"] == "run"] == [1, 13, 29]  # as test_decode_runs' by hand
    _, loaded = load_recording(path)
    assert loaded.num_steps == 40
    snap = loaded.at(10)  # the run's last step: positions 5..14 written, 16 tokens
    (slots,) = np.nonzero(snap.slot_state == SlotState.FILLED)
    assert slots.tolist() == list(range(15)) and snap.block_fill[snap.seq_tables[0]] == 15
    assert snap.seq_num_tokens.tolist() == [16] and snap.seq_num_computed.tolist() == [15]
    assert snap.metrics.step_decode_tokens == 1 and snap.metrics.tokens_generated == 11


def test_pack_run_round_trips_and_refuses_bad_lengths():
    writes = DecodeWrites(np.array([4, 9], dtype=np.int32), np.array([70, 33], dtype=np.int64),
                          np.arange(6, dtype=np.int64).reshape(2, 3))
    back = unpack_run(pack_run(writes))
    assert [a.tolist() for a in back] == [a.tolist() for a in writes] and back.steps == 3
    assert len(pack_run(writes)) == 12 + 2 * 12 + 6 * 2  # a vocabulary's ids: 2 bytes a token
    wide = writes._replace(tokens=writes.tokens + 70_000)
    assert unpack_run(pack_run(wide)).tokens.tolist() == wide.tokens.tolist() and len(pack_run(wide)) == 12 + 24 + 24
    with pytest.raises(ValueError, match="not"):
        unpack_run(pack_run(writes)[:-1])
    with pytest.raises(ValueError, match="2 or 4 bytes"):
        unpack_run(pack_run(writes)[:8] + (3).to_bytes(4, "little") + pack_run(writes)[12:])


def test_a_run_the_step_before_cannot_take_is_one_line(tmp_path):
    rec = Recording()
    engine = Engine(EngineConfig(pool_slots=256, block_size=16), ScriptedSource(), recording=rec, snapshots=False)
    engine.add_request("r", list(range(10, 15)), SamplingParams(max_tokens=100), output_len=40)
    engine.step(snapshot=False, outputs=False)  # step 0: the prefill; the next slot is 5
    ok = DecodeWrites(np.array([0], dtype=np.int32), np.array([5]), np.zeros((1, 3), dtype=np.int64))
    bad = {
        "wrong sequences": (ok._replace(seq_ids=np.array([1], dtype=np.int32)), "must list that step's 1 sequences"),
        "fills a block": (ok._replace(tokens=np.zeros((1, 11), dtype=np.int64)), "fills a block"),  # offsets 5..15
        "outside the pool": (ok._replace(first_slots=np.array([254])), "outside the pool"),
        "negative token": (ok._replace(tokens=np.full((1, 3), -1)), "non-negative"),
    }
    for writes, message in bad.values():
        with pytest.raises(ValueError, match=message):
            rec.record_decode_run(1, writes)
    with pytest.raises(ValueError, match="does not follow"):
        rec.record_decode_run(2, ok)
    rec.record_decode_run(1, ok)
    assert rec.num_steps == 4 and rec.at(3).seq_num_computed.tolist() == [8]


def test_a_bad_run_frame_in_a_file_is_one_line(tmp_path):
    path = _by_hand(tmp_path)
    data = path.read_bytes()
    older = tmp_path / "older.trace"  # run frames under a version-4 header
    older.write_bytes(data.replace(b'"version":5', b'"version":4', 1))
    with pytest.raises(TraceError, match="a decode run frame in a version-4 trace") as err:
        load_recording(older)
    assert "\n" not in str(err.value)
    head, frames = split_frames(data)
    first_run = next(i for i, (kind, _) in enumerate(frames) if kind == KIND_RUN)
    cut = tmp_path / "cut.trace"  # cut inside the first run frame: loads up to the step before it
    cut.write_bytes(join_frames(head, frames[:first_run]) + data[len(join_frames(head, frames[:first_run])):][:9])
    header, loaded = load_recording(cut)
    assert header["truncated"] and loaded.last_step == 0


def test_simulate_trace_out_keeps_runs(tmp_path, capsys):
    out = tmp_path / "sim.trace"
    assert cli_main(["simulate", "--workload-file", str(MOONCAKE), "--log-count", "40", "--length-scale", "1/16",
                     "--block-size", "32", "--pool-slots", "65536", "--trace-out", str(out), "--json"]) == 0
    capsys.readouterr()
    kinds = Counter(r["type"] for r in trace_records(out))
    assert kinds["run"] > 0
    header, loaded = load_recording(out)
    assert not header.get("truncated") and len(header["requests"]) == 40
