"""The decode lane and the recording-only step: the same run, whichever way it is taken.

A step's plain decodes go in one :class:`~pagedkv_core.batch.DecodeLane` (the scripted source
draws their tokens with numpy, the allocator writes them in one call, the pool view folds them in
one entry), and a step without a snapshot hands the recording only the tables that changed.
Seeded random cases (every allocator, both preemption modes, prefix caching, forks, token
budgets) run twice: once through the lane with a recording-only step, once with one SeqWork a
sequence and a full snapshot every step. Every step record, event and output token must be the
same, and the lane run must keep every invariant.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig, PREEMPTION_MODES
from pagedkv_core.engine import Engine
from pagedkv_core.kv import changes as log
from pagedkv_core.kv.registry import ALLOCATORS
from pagedkv_core.record.recording import Recording
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import (ScriptedSource, scripted_token, scripted_tokens, splitmix64,
                                           splitmix64_array)

from .engine_helpers import add
from .test_fuzz import random_case


class OneWorkEach(ScriptedSource):
    """The scripted source, reading every sequence from ``batch.seqs`` (it overrides execute)."""

    def execute(self, batch):
        assert batch.lane is None
        return super().execute(batch)


def run(config: dict, requests: list[dict], lane: bool, columns_from: int | None = None) -> tuple[Engine, Recording, list]:
    """``columns_from``: the scheduler's (0: every step takes its plain decodes by whole columns)."""
    source = ScriptedSource() if lane else OneWorkEach()
    assert source.reads_lane is lane
    rec = Recording()
    engine = Engine(EngineConfig(**config), source, recording=rec)
    if columns_from is not None:
        engine.scheduler.columns_from = columns_from
    for r in requests:
        add(engine, **r)
    outputs = []
    while engine.has_unfinished():
        assert engine.step_index < 5000, "engine did not finish"
        outs, snap = engine.step(snapshot=not lane)
        assert (snap is None) is lane
        if lane:
            engine.check_invariants()
        outputs.append([(o.request_id, [(c.index, list(c.new_token_ids), c.finish_reason) for c in o.outputs],
                         o.finished) for o in outs])
    return engine, rec, outputs


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
@pytest.mark.parametrize("preemption", PREEMPTION_MODES)
@pytest.mark.parametrize("columns", [False, True], ids=["one-by-one", "by-columns"])
def test_the_lane_and_a_recording_only_step_change_nothing(allocator, preemption, columns):
    """``columns``: every step takes its plain decodes by whole columns (the scheduler does from
    ``columns_from`` running sequences on; these cases run fewer), else one at a time."""
    rng = np.random.default_rng([7, len(allocator), len(preemption)])
    lane_steps = decodes = 0  # what the cases ran, so that the test keeps testing what it claims
    for _ in range(12):
        config, requests = random_case(rng, allocator, preemption)
        engine, rec, outs = run(config, requests, lane=True, columns_from=0 if columns else None)
        ref_engine, ref, ref_outs = run(config, requests, lane=False)
        assert outs == ref_outs
        assert list(rec.records()) == list(ref.records())  # byte for byte: pool, rows, tables, events
        untimed = lambda r: [dataclasses.replace(r.metrics(s), execute_s=0.0) for s in range(r.num_steps)]  # noqa: E731
        assert untimed(rec) == untimed(ref)
        for step in range(0, rec.num_steps, max(1, rec.num_steps // 7)):  # a state rebuilt from the lean records
            got, want = rec.at(step), ref.at(step)
            assert got.seq_tables.tolist() == want.seq_tables.tolist()
            assert got.seq_table_offsets.tolist() == want.seq_table_offsets.tolist()
        untimed_summary = lambda e: {k: v for k, v in e.summary().to_json().items() if "execute" not in k}  # noqa: E731
        assert untimed_summary(engine) == untimed_summary(ref_engine)
        lane_steps += rec.num_steps
        decodes += engine.scheduler.totals.decode_tokens
    assert lane_steps > 100 and decodes > 100


def test_a_plain_decode_is_one_that_needs_nothing():
    """Paged: the next token's slot when it goes into a block the sequence holds alone without
    filling it; -1 when it fills its block, needs a new one, or shares it (after a fork)."""
    engine = Engine(EngineConfig(pool_slots=256, block_size=4, prefix_caching=False), ScriptedSource())
    add(engine, "a", [3, 4, 5], output_len=20)
    add(engine, "b", [3, 4, 5, 6, 7], output_len=20, n=2)
    alloc = engine.allocator
    engine.step()  # the prefills; b forks into two samples that share its two blocks
    a = engine.get_request("a").seqs[0]
    b0, b1 = engine.get_request("b").seqs
    assert alloc.decode_slot(a) == -1  # position 3: the last slot of its block
    assert alloc.decode_slot(b0) == alloc.decode_slot(b1) == -1  # position 5: a block both hold
    assert alloc.pool.blocks[alloc.tables[b0.seq_id][1]].ref_count == 2
    engine.step()
    assert alloc.decode_slot(a) == -1  # position 4: a block it does not hold yet
    for s in (b0, b1):  # each holds its own copy now
        block = alloc.tables[s.seq_id][1]
        assert alloc.decode_slot(s) == block * 4 + 2 and alloc.pool.blocks[block].ref_count == 1
    engine.step()
    assert alloc.decode_slot(a) == alloc.tables[a.seq_id][1] * 4 + 1


def test_a_lane_step_logs_one_entry_and_keeps_the_finish_order():
    """Four plain decodes are one DECODED entry, and the lane's finishes come out in the order the
    step took the sequences (the random cases above mix them with finishes outside the lane)."""
    engine = Engine(EngineConfig(pool_slots=1024, block_size=16), ScriptedSource())
    for i, n in enumerate([5, 3, 5, 3]):
        add(engine, f"r{i}", [3 + i] * 3, output_len=n)
    engine.step()
    entries = []
    fold = engine.view.fold
    engine.view.fold = lambda e: (entries.append(list(e)), fold(e))
    engine.step()
    assert [e[0] for e in entries[-1]] == [log.DECODED] and len(entries[-1][0][1]) == 4
    events = []
    while engine.has_unfinished():
        events += [e.request_id for e in engine.step()[1].events if e.kind == "finish"]
    assert events == ["r1", "r3", "r0", "r2"]


def test_lane_tokens_are_the_scripted_tokens():
    rng = np.random.default_rng(3)
    xs = [0, 1, (1 << 64) - 1, 1 << 63, 0x9E3779B97F4A7C15] + rng.integers(0, 1 << 63, 500, dtype=np.uint64).tolist()
    assert splitmix64_array(np.array(xs, dtype=np.uint64)).tolist() == [splitmix64(x) for x in xs]
    ids = [f"r{i}" for i in range(200)] + ["", "é" * 40, "\U0001f600"]
    samples = [i % 5 for i in range(len(ids))]
    positions = [(i * 7919) % 200_000 for i in range(len(ids))]
    assert scripted_tokens(ids, samples, positions) == [scripted_token(r, s, p) for r, s, p in
                                                        zip(ids, samples, positions)]


def test_request_keys_kept_are_bounded_and_a_full_cache_starts_again(monkeypatch):
    """The scripted source keeps at most MAX_KEPT_KEYS request keys; when full it starts again
    (the requests running now are kept), and every token stays the same."""
    from pagedkv_core.sources import scripted

    ids = [f"q{i}" for i in range(50)]
    positions = list(range(50))
    expected = scripted_tokens(ids, [0] * 50, positions)
    monkeypatch.setattr(scripted, "_request_keys", {})
    monkeypatch.setattr(scripted, "MAX_KEPT_KEYS", 8)
    for _ in range(3):
        assert scripted_tokens(ids, [0] * 50, positions) == expected
        assert [scripted_token(r, 0, p) for r, p in zip(ids, positions)] == expected
        assert 0 < len(scripted._request_keys) <= 8
    assert ids[-1] in scripted._request_keys  # the last one asked for is kept


def test_a_source_that_overrides_execute_sees_every_sequence():
    seen = []

    class Peek(ScriptedSource):
        def execute(self, batch):
            seen.append((batch.lane, len(batch.seqs)))
            return super().execute(batch)

    engine = Engine(EngineConfig(pool_slots=512, block_size=16), Peek())
    for i in range(3):
        engine.add_request(f"r{i}", [3, 4, 5], SamplingParams(max_tokens=8), output_len=6)
    engine.run()
    assert seen and all(lane is None and n == 3 for lane, n in seen)


def test_a_source_that_writes_no_kv_gets_no_slots_and_one_that_may_gets_them():
    """The scripted source writes no K/V (``reads_slots`` False): its SeqWorks come without slots
    or block tables, and the step is the same; a subclass that overrides execute gets them all."""

    class Peek(ScriptedSource):
        def execute(self, batch):
            return super().execute(batch)

    seen = {}
    for source in (ScriptedSource(), Peek()):
        works = seen[type(source).__name__] = []
        execute = source.execute
        source.execute = lambda batch, execute=execute, works=works: (works.extend(batch.seqs), execute(batch))[1]
        engine = Engine(EngineConfig(pool_slots=512, block_size=4), source)
        for i in range(3):
            engine.add_request(f"r{i}", list(range(3 + 5 * i)), SamplingParams(max_tokens=8), output_len=6)
        engine.run()
        assert engine.num_finished == 3
    assert not ScriptedSource().reads_slots and Peek().reads_slots
    plain, peek = seen["ScriptedSource"], seen["Peek"]
    assert plain and all(w.slots == [] and w.block_table == [] for w in plain)  # prefills (decodes: the lane)
    assert len(peek) > len(plain)  # every sequence, decodes included
    for w in peek:
        want = [w.block_table[p // 4] * 4 + p % 4 for p in range(w.start_pos, w.context_len)]
        assert list(w.slots) == want and len(w.block_table) == -(-w.context_len // 4)
    key = lambda w: (w.seq_id, w.start_pos, tuple(w.token_ids), w.num_samples)  # noqa: E731
    assert {key(w) for w in plain} <= {key(w) for w in peek}  # the same work, its places aside
    assert {key(w) for w in peek if len(w.token_ids) > 1} <= {key(w) for w in plain}  # every prefill


def test_a_lane_source_answers_in_the_lane_and_a_short_answer_is_refused():
    """A source that reads the lane answers its plain decodes in ``lane.tokens``, one each in
    the lane's order; an answer of the wrong length stops the step with a clear error."""
    seen = []

    class Short(ScriptedSource):
        reads_lane = True  # reads the lane although it overrides execute

        def execute(self, batch):
            out = super().execute(batch)
            if batch.lane:
                seen.append((len(batch.lane), list(batch.lane.tokens)))
                if len(seen) == 2:
                    batch.lane.tokens = batch.lane.tokens[:-1]
            return out

    engine = Engine(EngineConfig(pool_slots=512, block_size=16), Short())
    for i in range(3):
        engine.add_request(f"r{i}", [3, 4, 5], SamplingParams(max_tokens=8), output_len=6)
    engine.step()  # the prefills
    engine.step()  # three plain decodes, answered in the lane
    assert seen[0][0] == 3 and seen[0][1] == [engine.get_request(f"r{i}").seqs[0].token_ids[-1] for i in range(3)]
    with pytest.raises(RuntimeError, match="answered .* for a lane of 3 plain decodes"):
        engine.step()
