"""Scheduler + engine: continuous batching, preemption, watermark, chunking, forks, stops."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import ADMIT, PREEMPT_RECOMPUTE, PREEMPT_SWAP
from pagedkv_core.sources.oracle import KVOracleSource
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource, scripted_token
from pagedkv_core.sequence import SequenceStatus

from .engine_helpers import add, expected_stream, make_engine, run_checked, streams


class Recorder(KVOracleSource):
    """The KV oracle, also keeping a copy of every batch and of bind's arguments."""

    def __init__(self, inner=None):
        super().__init__(inner)
        self.batches = []
        self.binds = []

    def bind(self, num_slots, num_host_slots):
        self.binds.append((num_slots, num_host_slots))
        super().bind(num_slots, num_host_slots)

    def execute(self, batch):
        self.batches.append(copy.deepcopy(batch))
        return super().execute(batch)


def recorded_engine(inner=None, **config):
    source = Recorder(inner)
    engine = Engine(EngineConfig(**config), source)
    source.attach(engine)
    return engine, source


def kinds(snaps, kind):
    return [(s.step, e) for s in snaps for e in s.events if e.kind == kind]


def test_bind_once_and_decode_work_covers_the_last_token():
    engine, src = recorded_engine(block_size=4, pool_slots=64)
    add(engine, "r", [5, 6, 7, 8, 9], output_len=3, max_tokens=8)
    run_checked(engine)
    assert src.binds == [(64, 64)]
    prefill, decode = src.batches[0].seqs[0], src.batches[1].seqs[0]
    assert prefill.token_ids == [5, 6, 7, 8, 9] and prefill.start_pos == 0 and prefill.num_samples == 1
    assert prefill.is_prefill and prefill.output_len == 3
    first = scripted_token("r", 0, 0)
    assert decode.token_ids == [first] and decode.start_pos == 5 and decode.context_len == 6
    assert decode.num_output_tokens == 1 and not decode.is_prefill
    assert decode.slots == [decode.block_table[1] * 4 + 1]
    assert engine.get_request("r").output_token_ids == [[scripted_token("r", 0, p) for p in range(3)]]


def test_continuous_batching_admits_arrivals_while_others_decode():
    engine = make_engine(block_size=4, pool_slots=256)
    add(engine, "early", range(3, 11), output_len=10)
    add(engine, "late", range(20, 26), output_len=3, arrival_step=4)
    snaps = []
    while engine.has_unfinished():
        _, snap = engine.step()
        snaps.append(snap)
    assert "late" not in [e.request_id for s in snaps[:4] for e in s.events]  # invisible until step 4
    assert snaps[4].metrics.num_running == 2  # joins the running batch at once
    assert engine.get_request("late").finish_reason == "stop"
    assert engine.get_request("early").finish_reason == "stop"


def test_preemption_takes_the_most_recently_admitted_and_recompute_reprefills():
    engine, src = recorded_engine(block_size=4, pool_slots=40, watermark=0.0)  # 10 blocks
    for i in range(3):
        add(engine, f"r{i}", range(10 * i + 3, 10 * i + 11), output_len=20, max_tokens=20)  # 8 tokens: 2 blocks
    snaps = run_checked(engine)
    pre = kinds(snaps, "preempt_recompute")
    assert pre, "the pool is too small for three growing sequences"
    assert pre[0][1].request_id == "r2"  # the youngest goes first
    readmits = [(s, e) for s, e in kinds(snaps, "admit") if e.detail["recompute"]]
    assert {e.request_id for _, e in readmits} == {e.request_id for _, e in pre}
    for step, event in readmits:
        # Re-prefilled with prompt + every output so far (minus what the prefix cache holds).
        (work,) = [w for w in src.batches[step].seqs if w.seq_id == event.seq_id]
        seq = engine.sequence(event.seq_id)
        assert work.start_pos == event.detail["cached_tokens"]
        assert work.num_output_tokens > 0 and work.num_samples == 1
        assert work.context_len == 8 + work.num_output_tokens
        assert work.token_ids == seq.token_ids[work.start_pos : work.context_len]
    assert engine.summary().recomputes == len(pre)
    assert streams(engine) == {f"r{i}": expected_stream(f"r{i}", 1, 20, 20) for i in range(3)}


def test_recompute_hits_its_own_cached_blocks():
    engine = make_engine(block_size=4, pool_slots=40, watermark=0.0)
    for i in range(3):
        add(engine, f"r{i}", range(10 * i + 3, 10 * i + 11), output_len=20, max_tokens=20)
    snaps = run_checked(engine)
    readmit_steps = {s for s, e in kinds(snaps, "admit") if e.detail["recompute"]}
    hits = [e for s, e in kinds(snaps, "cache_hit") if s in readmit_steps]
    s = engine.summary()
    # vLLM's counting: a re-admission's lookups are counted apart, so a victim hitting its own
    # blocks does not raise the hit rate (the three prompts share nothing).
    assert hits and s.prefix_cache_preempted_hit_tokens == sum(e.detail["tokens"] for e in hits)
    assert s.prefix_cache_hit_rate == 0 and s.prefix_cache_hit_tokens == 0
    assert s.prefix_cache_queried_tokens == 3 * 8 and s.prefix_cache_preempted_queried_tokens > 0


def test_swap_mode_swaps_out_and_back_in():
    engine, src = recorded_engine(block_size=4, pool_slots=40, watermark=0.0, preemption="swap", swap_slots=40)
    for i in range(3):
        add(engine, f"r{i}", range(10 * i + 3, 10 * i + 11), output_len=20, max_tokens=20)
    snaps = run_checked(engine)
    outs, ins = kinds(snaps, "preempt_swap"), kinds(snaps, "swap_in")
    assert outs and len(outs) == len(ins) and not kinds(snaps, "preempt_recompute")
    assert any(b.swap_out for b in src.batches) and any(b.swap_in for b in src.batches)
    s = engine.summary()
    assert s.swaps_out == s.swaps_in == s.preemptions == len(outs)
    assert streams(engine) == {f"r{i}": expected_stream(f"r{i}", 1, 20, 20) for i in range(3)}


def test_full_host_pool_falls_back_to_recompute_and_says_so():
    engine = make_engine(block_size=4, pool_slots=40, watermark=0.0, preemption="swap", swap_slots=0)
    for i in range(3):
        add(engine, f"r{i}", range(10 * i + 3, 10 * i + 11), output_len=20, max_tokens=20)
    snaps = run_checked(engine)
    pre = kinds(snaps, "preempt_recompute")
    assert pre and all(e.detail["reason"] == "host pool full" for _, e in pre)
    assert engine.summary().swaps_out == 0


def test_watermark_holds_back_admissions():
    # 10 blocks, watermark 0.5 -> 5 held back. Each prompt takes 3 blocks.
    engine = make_engine(block_size=4, pool_slots=40, watermark=0.5)
    add(engine, "a", range(3, 13), output_len=2)
    add(engine, "b", range(20, 30), output_len=2)
    _, snap = engine.step()
    assert snap.metrics.num_running == 1 and len(snap.waiting) == 1  # 10 - 3 - 3 < 5
    run_checked(engine)
    assert engine.get_request("b").finish_reason == "stop"


def test_watermark_is_waived_when_nothing_runs():
    engine = make_engine(block_size=4, pool_slots=40, watermark=0.9)
    add(engine, "a", range(3, 30), output_len=2)  # 7 of 10 blocks > 10 - 9
    run_checked(engine)
    assert engine.get_request("a").finish_reason == "stop"


def test_token_budget_chunks_a_long_prefill():
    engine, src = recorded_engine(block_size=4, pool_slots=256, max_batch_tokens=16)
    add(engine, "long", range(3, 53), output_len=3)  # 50 prompt tokens
    add(engine, "short", range(60, 64), output_len=3, arrival_step=1)
    run_checked(engine)
    assert all(b.num_tokens <= 16 for b in src.batches)
    chunks = [w for b in src.batches for w in b.seqs if w.request_id == "long" and w.num_samples == 0]
    assert len(chunks) >= 3 and [c.start_pos for c in chunks][:2] == [0, 16]
    assert engine.get_request("long").output_token_ids == [[scripted_token("long", 0, p) for p in range(3)]]


def test_never_fitting_request_is_rejected_and_the_others_go_on():
    engine = make_engine(block_size=4, pool_slots=32)
    add(engine, "ok", range(3, 10), output_len=4)
    add(engine, "too_long", range(3, 35), output_len=4)  # 32 + 1 > 32 slots
    outputs, snap = engine.step()
    rejected = [o for o in outputs if o.request_id == "too_long"][0]
    assert rejected.finished and rejected.finish_reason == "rejected" and "32 tokens" in rejected.reject_reason
    assert [e.request_id for e in snap.events if e.kind == "reject"] == ["too_long"]
    run_checked(engine)
    s = engine.summary()
    assert s.finished == 1 and s.rejected == [{"id": "too_long", "reason": rejected.reject_reason}]


@pytest.mark.parametrize(
    "prompt, kw, fragment",
    [
        ([], {}, "empty prompt"),
        ([3, -1], {}, "non-negative"),
        ([3, 4.5], {}, "non-negative"),
        ([3, 4], {"output_len": 0}, "output_len"),
    ],
)
def test_invalid_requests_end_rejected_not_raised(prompt, kw, fragment):
    engine = make_engine()
    engine.add_request("bad", prompt, SamplingParams(), **kw)
    outputs, _ = engine.step()
    assert outputs[0].finish_reason == "rejected" and fragment in outputs[0].reject_reason
    assert engine.get_request("bad").status == SequenceStatus.REJECTED
    assert not engine.has_unfinished()


def test_numpy_token_ids_are_accepted():
    import numpy as np

    engine = make_engine()
    engine.add_request("np", np.array([5, 6, 7]), SamplingParams(max_tokens=2))
    engine.run()
    assert engine.get_request("np").finish_reason == "length"
    assert all(type(t) is int for t in engine.get_request("np").prompt_token_ids)


def test_duplicate_request_id_raises():
    engine = make_engine()
    engine.add_request("x", [3], SamplingParams())
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request("x", [3], SamplingParams())


def test_parallel_samples_prefill_once_fork_and_copy_on_write():
    engine, src = recorded_engine(block_size=4, pool_slots=128)
    add(engine, "r", range(3, 9), output_len=5, max_tokens=8, n=3)  # 6 tokens: tail block half full
    snaps = run_checked(engine)
    first = src.batches[0].seqs
    assert len(first) == 1 and first[0].num_samples == 3
    forks = kinds(snaps, "fork")
    assert len(forks) == 2 and all(s == 0 for s, _ in forks)
    assert snaps[0].metrics.num_running == 3 == len(snaps[0].running)  # the forks run from the end of step 0
    shared = snaps[0].block_ref[snaps[0].block_ref > 0]
    assert sorted(shared.tolist()) == [3, 3]  # both prompt blocks are shared by all samples
    cows = kinds(snaps, "cow")
    assert len(cows) == 2 and all(s == 1 for s, _ in cows)  # the last holder keeps the tail
    assert any(b.copies for b in src.batches)
    assert streams(engine)["r"] == expected_stream("r", 3, 5, 8)


class EosSource(ScriptedSource):
    """Emits token 2 (its eos) at output position 2."""

    eos_token_id = 2

    def execute(self, batch):
        out = super().execute(batch)
        for w in batch.seqs:
            if w.num_samples and w.num_output_tokens == 2:
                out[w.seq_id] = [2] * w.num_samples
        return out


def test_stop_conditions_eos_stop_tokens_ignore_eos_and_length():
    engine = Engine(EngineConfig(block_size=4, pool_slots=256, max_model_len=12), EosSource())
    engine.add_request("eos", [3, 4], SamplingParams(max_tokens=10))
    engine.add_request("ignore", [3, 4], SamplingParams(max_tokens=5, ignore_eos=True))
    stop_tok = scripted_token("stop", 0, 1)
    engine.add_request("stop", [3, 4], SamplingParams(max_tokens=10, stop_token_ids=(stop_tok,)))
    engine.add_request("model_len", [3] * 8, SamplingParams(max_tokens=10, ignore_eos=True))
    engine.run()
    r = engine.requests
    assert r["eos"].output_token_ids[0][-1] == 2 and r["eos"].finish_reason == "stop"
    assert len(r["ignore"].output_token_ids[0]) == 5 and r["ignore"].finish_reason == "length"
    assert r["stop"].output_token_ids[0] == [scripted_token("stop", 0, 0), stop_tok]
    assert r["stop"].finish_reason == "stop"
    assert len(r["model_len"].output_token_ids[0]) == 4 and r["model_len"].finish_reason == "length"


def test_output_len_and_max_tokens_whichever_comes_first():
    engine = make_engine()
    add(engine, "short", [3, 4], output_len=3, max_tokens=10)
    add(engine, "capped", [3, 4], output_len=30, max_tokens=4)
    run_checked(engine)
    assert streams(engine) == {
        "short": expected_stream("short", 1, 3, 10),
        "capped": expected_stream("capped", 1, 30, 4),
    }
    assert streams(engine)["short"][0] == "stop" and streams(engine)["capped"][0] == "length"


def test_a_sequence_that_outgrows_the_whole_pool_finishes_with_length():
    engine = make_engine(block_size=4, pool_slots=16)
    add(engine, "big", [3] * 10, output_len=100, max_tokens=100)
    snaps = run_checked(engine)
    req = engine.get_request("big")
    assert req.finish_reason == "length" and len(req.output_token_ids[0]) == 7  # 16 K/V slots + 1
    fin = kinds(snaps, "finish")[0][1]
    assert fin.detail["why"] == "kv pool exhausted"


def test_step_outputs_carry_new_and_cumulative_tokens():
    engine = make_engine()
    add(engine, "r", [3, 4, 5], output_len=3)
    seen = []
    while engine.has_unfinished():
        outputs, _ = engine.step()
        (out,) = outputs
        seen.append(out.outputs[0].new_token_ids[0])
        assert out.outputs[0].token_ids == seen
    assert out.finished and out.finish_reason == "stop" and out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_victim_is_the_most_recently_admitted_not_the_latest_submitted(preemption):
    """Submission order (request index) and admission order differ: "late" is submitted first
    but arrives at step 2, so it is admitted after "early". The engine preempts the most
    recently admitted running sequence, as vLLM v1 does (the tail of its running list)."""
    engine = make_engine(block_size=4, pool_slots=32, watermark=0.0, preemption=preemption, swap_slots=64)
    add(engine, "late", range(4), output_len=20, max_tokens=24, arrival_step=2)
    add(engine, "early", range(10, 14), output_len=20, max_tokens=24, arrival_step=0)
    snaps = run_checked(engine)
    admitted = [e.request_id for s in snaps for e in s.events if e.kind == ADMIT]
    assert admitted[:2] == ["early", "late"]
    victims = [e.request_id for s in snaps for e in s.events if e.kind in (PREEMPT_SWAP, PREEMPT_RECOMPUTE)]
    assert victims and victims[0] == "late"


def test_the_stop_checks_skipped_are_those_that_could_not_stop():
    """A sequence's ``stop_at`` and ``stop_ids`` (Scheduler._stop_bounds) let the step skip the full
    stop check: over random limits (eos or none, ignore_eos, stop ids, answer length, max_tokens and
    the model's context), at every token the full check finds no reason wherever it is skipped."""
    import random

    from pagedkv_core.kv.registry import build_allocator
    from pagedkv_core.scheduler import Scheduler
    from pagedkv_core.sequence import Request

    rng = random.Random(7)
    checked = skipped = 0
    for case in range(300):
        eos = rng.choice([None, 2, 5])
        max_model_len = rng.randint(4, 60)
        config = EngineConfig(pool_slots=256, block_size=4)
        scheduler = Scheduler(config, build_allocator(config, max_model_len), eos, max_model_len)
        sampling = SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=rng.random() < 0.3,
                                  stop_token_ids=tuple(rng.sample(range(2, 9), rng.randint(0, 2))))
        prompt = [9] * rng.randint(1, 20)
        request = Request(f"r{case}", case, prompt, sampling, 0, output_len=rng.choice([None, rng.randint(1, 50)]))
        seq = scheduler.new_sequence(request, 0, list(prompt))
        for _ in range(70):
            token = rng.randint(2, 10)
            seq.token_ids.append(token)
            reason = scheduler._stop_reason(seq, token)
            if token in seq.stop_ids or len(seq.token_ids) >= seq.stop_at:
                checked += 1
            else:
                skipped += 1
                assert reason is None, (case, len(seq.token_ids), token, reason)
            if reason is not None:
                break
    assert checked >= 300 and skipped > 1000, (checked, skipped)  # every case ends at a full check


@pytest.mark.parametrize("stopped", [5, 64])
def test_stop_tokens_end_the_same_sequences_by_columns_and_one_by_one(stopped):
    """64 running sequences, the first ``stopped`` each stopped by a token it is going to sample
    (found by a first run without stops), the others by their length: taken by whole columns (the
    stop check compares the lane's tokens with the stop set at once: ``Scheduler.stop_hits``) and
    one at a time, the same tokens and finish reasons; each ends at its stop token's first
    occurrence. Up to 8 stop tokens in all ``stop_hits`` compares them one by one; with 64, it
    uses ``np.isin``: the same answer either way."""
    prompts = [[5 + i, 6, 7] for i in range(64)]

    def run(stops, columns_from):
        engine = Engine(EngineConfig(pool_slots=64 * 1024, block_size=16), ScriptedSource(), snapshots=False)
        engine.scheduler.columns_from = columns_from
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=40, stop_token_ids=stops[i], ignore_eos=True))
        while engine.has_unfinished():
            engine.step(snapshot=False)
            engine.check_invariants()
        seqs = [engine.requests[f"r{i}"].seqs[0] for i in range(64)]
        return [(s.token_ids[3:], s.finish_reason) for s in seqs], engine

    free, _ = run([[]] * 64, 0)
    stops = [[out[(7 * i) % 40]] if i < stopped else [] for i, (out, _) in enumerate(free)]
    by_columns, engine = run(stops, 0)
    assert by_columns == run(stops, 10**9)[0]
    for (out, reason), (free_out, free_reason), stop in zip(by_columns, free, stops):
        if stop:
            assert out == free_out[: free_out.index(stop[0]) + 1] and reason == "stop"
        else:
            assert (out, reason) == (free_out, free_reason) and len(out) == 40
    union = engine.scheduler.stop_tokens
    assert len(union) == stopped
    tokens = np.random.default_rng(0).choice(np.concatenate([union, np.arange(3, 300)]), size=(64, 5))
    assert np.array_equal(engine.scheduler.stop_hits(tokens), np.isin(tokens, union))
