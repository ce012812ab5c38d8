"""Decode runs (``Engine(coalesce=True)``): stretches of steps that are nothing but plain decodes
pass in one ``step()`` call, and the run is the same run, step for step.

Checked against the same engine without coalescing: the summary (but for the token source's
time), every sequence's tokens, the waste split (sums and step by step), and the invariants after
every call; on one request by hand, the exact steps each call takes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedkv_core.cli.parsing import length_scale
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import DecodeRun, Engine
from pagedkv_core.record.waste import Released, WasteAccumulator, final_written
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource, scripted_token, scripted_token_runs
from pagedkv_core.workloads.scenarios import stream_workload_file

DATA = Path(__file__).resolve().parents[1] / "pagedkv_core" / "data"
MOONCAKE = DATA / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE = DATA / "azure_conv_2023.csv"


def test_token_runs_are_the_scripted_tokens():
    ids, samples, first = ["a", "req-7", "a"], [0, 0, 2], [0, 5, 3]
    runs = scripted_token_runs(ids, samples, first, 6)
    assert runs.shape == (3, 6) and runs.dtype == np.int64
    for i in range(3):
        assert runs[i].tolist() == [scripted_token(ids[i], samples[i], first[i] + j) for j in range(6)]


def _calls(engine: Engine) -> list[tuple[int, DecodeRun | None]]:
    out = []
    while engine.has_unfinished():
        before = engine.step_index
        engine.step(snapshot=False, outputs=False)
        engine.check_invariants()
        out.append((before, engine.decode_run))
    return out


def test_one_request_by_hand():
    """Prompt 5 tokens, answer 40, block size 16. Step 0 prefills (5 computed, 6 tokens); the
    decodes at positions 5..14 are plain (10 steps: 1..10); position 15 fills block 0 (step 11),
    16 takes block 1 (step 12); 17..30 plain (14 steps: 13..26); 31 fills (27), 32 takes block 2
    (28); 33..42 plain, but the answer's 40th token comes with position 43's step (39): 10 steps, 29..38."""
    config = EngineConfig(pool_slots=256, block_size=16)

    def engine(coalesce: bool) -> Engine:
        e = Engine(config, ScriptedSource(), snapshots=False, coalesce=coalesce)
        e.add_request("r", list(range(10, 15)), SamplingParams(max_tokens=100), output_len=40)
        return e

    runs = engine(True)
    calls = _calls(runs)
    assert calls == [(0, DecodeRun(1, 10, 1)), (11, None), (12, DecodeRun(13, 14, 1)), (27, None),
                     (28, DecodeRun(29, 10, 1)), (39, None)]
    assert runs.coalesced_steps == 34 and runs.step_index == 40
    plain = engine(False)
    assert len(_calls(plain)) == 40
    a, b = runs.summary().to_json(), plain.summary().to_json()
    a.pop("mean_execute_s"), b.pop("mean_execute_s")
    assert a == b and a["steps"] == 40 and a["tokens_generated"] == 40
    assert runs.requests["r"].seqs[0].token_ids == plain.requests["r"].seqs[0].token_ids
    last = [{**e.stats.last.to_json(), "execute_s": 0.0} for e in (runs, plain)]
    assert last[0] == last[1] and last[0]["num_finished"] == 1


def _log_run(path: Path, count: int, config: EngineConfig, coalesce: bool, scale=None) -> dict:
    options = {"count": count, **({"length_scale": length_scale(scale)} if scale else {})}
    workload = stream_workload_file(path, 0, **options)
    engine = Engine(config, ScriptedSource(), snapshots=False, skip_idle=True, coalesce=coalesce)
    released, tokens = Released(), {}

    def forget(seq) -> None:
        released(seq)
        tokens[seq.seq_id] = list(seq.token_ids)

    engine.feed(workload.requests(), on_release=forget)
    sums, steps = WasteAccumulator(per_step=False), WasteAccumulator(per_step=True)
    calls = 0
    while engine.has_unfinished():
        before = engine.step_index
        engine.step(snapshot=False, outputs=False)
        engine.check_invariants()
        calls += 1
        if released:
            written = released.take()
            sums.release(written)
            steps.release(written)
        sums.add_engine(engine, steps=engine.step_index - before)
        steps.add_engine(engine, steps=engine.step_index - before)
    summary = engine.summary().to_json()
    summary.pop("mean_execute_s")
    ends = final_written(engine)
    return {"summary": summary, "tokens": tokens, "breakdown": sums.breakdown(ends),
            "series": {k: v.tolist() for k, v in steps.series(ends).items()}, "calls": calls,
            "coalesced": engine.coalesced_steps}


@pytest.mark.parametrize("allocator,pool,block,scale", [
    ("paged", 262_144, 32, "1/16"),  # the log as bench replay-speed plays it: mostly one sequence
    ("paged", 1_024, 16, "1/32"),  # a small pool: waiting, preemption by recompute, prefix hits, rejections
    ("contiguous", 16_384, 16, "1/64"),  # Orca (Max): a decode run ends at an arrival or a length
])
def test_a_log_coalesced_is_the_same_run(allocator, pool, block, scale):
    config = EngineConfig(pool_slots=pool, block_size=block, allocator=allocator)
    runs = _log_run(MOONCAKE, 150, config, True, scale)
    plain = _log_run(MOONCAKE, 150, config, False, scale)
    assert runs["coalesced"] > 0 and plain["coalesced"] == 0
    if pool == 1_024:  # what the case is there for
        s = runs["summary"]
        assert s["recomputes"] == 2 and s["prefix_cache_hit_tokens"] > 0 and len(s["rejected"]) == 13
    assert runs["calls"] + runs["coalesced"] == plain["calls"]
    assert runs["summary"] == plain["summary"]
    assert runs["tokens"] == plain["tokens"] and len(runs["tokens"]) == plain["summary"]["finished"]
    assert runs["breakdown"] == plain["breakdown"]
    assert runs["series"] == plain["series"]


def test_azure_rows_with_swap():
    config = EngineConfig(pool_slots=4_096, block_size=16, preemption="swap")
    runs = _log_run(AZURE, 60, config, True)
    plain = _log_run(AZURE, 60, config, False)
    assert runs["coalesced"] > 0 and runs["summary"]["swaps_out"] == 12
    assert runs["summary"] == plain["summary"] and runs["tokens"] == plain["tokens"]
    assert runs["breakdown"] == plain["breakdown"] and runs["series"] == plain["series"]


def test_a_stop_token_ends_the_run_before_its_step():
    """A stop token at output position 7: the run stops short of it, the step that samples it
    finishes the sequence, as one step at a time does."""
    stop = scripted_token("s", 0, 7)
    assert stop not in [scripted_token("s", 0, p) for p in range(7)]
    config = EngineConfig(pool_slots=512, block_size=32)

    def engine(coalesce: bool) -> Engine:
        e = Engine(config, ScriptedSource(), snapshots=False, coalesce=coalesce)
        e.add_request("s", list(range(20, 24)), SamplingParams(max_tokens=50, stop_token_ids=(stop,)), output_len=50)
        return e

    runs = engine(True)
    calls = _calls(runs)
    # step 0 samples position 0; positions 1..6 come in a run (steps 1..6); step 7 samples the stop token
    assert calls == [(0, DecodeRun(1, 6, 1)), (7, None)]
    plain = engine(False)
    _calls(plain)
    seq_a, seq_b = runs.requests["s"].seqs[0], plain.requests["s"].seqs[0]
    assert seq_a.token_ids == seq_b.token_ids and seq_a.token_ids[-1] == stop and seq_a.num_output_tokens == 8
    assert seq_a.finish_reason == seq_b.finish_reason == "stop"


def test_coalescing_needs_no_snapshots_and_a_source_that_answers_runs():
    config = EngineConfig(pool_slots=256)
    with pytest.raises(ValueError, match="snapshots=False"):
        Engine(config, ScriptedSource(), coalesce=True)

    class Own(ScriptedSource):
        def execute(self, batch):
            return super().execute(batch)

    with pytest.raises(ValueError, match="answers decode runs"):
        Engine(config, Own(), snapshots=False, coalesce=True)


def test_outputs_read_step_by_step():
    """A caller that reads outputs gets every step: nothing is coalesced."""
    e = Engine(EngineConfig(pool_slots=256, block_size=16), ScriptedSource(), snapshots=False, coalesce=True)
    e.add_request("r", [5, 6, 7], SamplingParams(max_tokens=20), output_len=20)
    calls = 0
    while e.has_unfinished():
        e.step(snapshot=False)
        calls += 1
        assert e.decode_run is None
    assert calls == 20 and e.coalesced_steps == 0


def test_many_running_by_columns():
    """64 sequences running at once: the steps take their plain decodes by whole columns
    (``Scheduler.columns_from``), which a decode run moves on (``RunningSet.advance_run``; the
    invariants check every column after every call)."""
    config = EngineConfig(pool_slots=16_384, block_size=16)
    rng = np.random.default_rng(5)
    # every prompt one token past a block: after the prefill each sequence has 14 plain decodes ahead
    prompts = [rng.integers(3, 49_152, size=16 * int(k) + 1).tolist() for k in rng.integers(0, 3, size=64)]
    outputs = rng.integers(40, 120, size=64).tolist()

    def run(coalesce: bool):
        e = Engine(config, ScriptedSource(), snapshots=False, coalesce=coalesce)
        for i, (p, n) in enumerate(zip(prompts, outputs)):
            e.add_request(f"c{i}", p, SamplingParams(max_tokens=200), arrival_step=0, output_len=n)
        calls = _calls(e)
        return e, calls

    runs, calls = run(True)
    plain, plain_calls = run(False)
    assert runs.scheduler.columns_from <= 64 and runs.stats.peak_running == 64
    assert any(r is not None and r.num_seqs >= runs.scheduler.columns_from for _, r in calls)
    assert len(calls) + runs.coalesced_steps == len(plain_calls)
    a, b = runs.summary().to_json(), plain.summary().to_json()
    a.pop("mean_execute_s"), b.pop("mean_execute_s")
    assert a == b
    for i in range(64):
        assert runs.requests[f"c{i}"].seqs[0].token_ids == plain.requests[f"c{i}"].seqs[0].token_ids


def test_the_side_by_side_benchmark(tmp_path):
    """benchmarks/bench_decode_runs.py on the first 120 Mooncake requests: runs taken, the same
    figures both ways, and a row in the benchmark table."""
    import json

    from benchmarks import bench_decode_runs, report

    out = tmp_path / "decode-runs.json"
    assert bench_decode_runs.main(["--log", "mooncake-conv", "--count", "120", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["same_figures"] and 0 < row["steps_in_runs"] < row["steps"]
    assert len(row["wall_s_without"]) == len(row["wall_s_with"]) == 1
    (table_row,) = report._rows("decode-runs", result)
    assert "`mooncake-conv`" in table_row[0] and table_row[1].startswith(f"{row['steps_in_runs']:,} of {row['steps']:,}")


def test_the_side_by_side_benchmark_with_a_trace(tmp_path):
    """The same with ``--trace``: each run writes its trace as ``simulate --trace-out`` does, and
    the runs' trace is the smaller (a decode run is one frame)."""
    import json

    from benchmarks import bench_decode_runs, report

    out = tmp_path / "decode-runs-traced.json"
    assert bench_decode_runs.main(["--log", "mooncake-conv", "--count", "60", "--repeats", "1", "--trace",
                                   "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["trace"] and row["same_figures"] and row["steps_in_runs"] > 0
    assert 0 < row["trace_bytes_with"] < row["trace_bytes_without"]
    (table_row,) = report._rows("decode-runs-traced", json.loads(out.read_text()))
    assert "`--trace-out`" in table_row[0] and "MB with" in table_row[1]
