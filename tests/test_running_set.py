"""The running list's columns (pagedkv_core/running.py): from ``Scheduler.columns_from`` running
sequences on, a step's plain decodes are taken by whole columns, so the per-sequence calls a step
makes follow the sequences that cross a block boundary, not the sequences that run. Exact counts
of the allocator's calls, and the invariant check that catches a column gone wrong. (Here the
engines take every step by columns, ``columns_from = 0``, unless a test says otherwise.)"""
from __future__ import annotations

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.running import LAST, NUM_BLOCKS, SLOT, RunningSet
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource


def decoding_engine(n: int) -> Engine:
    """``n`` requests of 3 prompt tokens and 100 answer tokens, block size 16, after their prefill step."""
    engine = Engine(EngineConfig(pool_slots=16 * 1024, block_size=16), ScriptedSource(), snapshots=False)
    engine.scheduler.columns_from = 0
    for i in range(n):
        engine.add_request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=200), output_len=100)
    engine.step(snapshot=False)  # the prefills: each sequence now holds 4 tokens, 3 computed
    return engine


def count_calls(obj, name: str, sizes: bool = False) -> list:
    """Replace ``obj.name`` by a wrapper that notes each call (its first argument's length with ``sizes``)."""
    calls = []
    real = getattr(obj, name)

    def spy(*args, **kwargs):
        calls.append(len(args[0]) if sizes else 1)
        return real(*args, **kwargs)

    setattr(obj, name, spy)
    return calls


def test_only_sequences_at_a_block_boundary_are_asked_about_one_at_a_time():
    engine = decoding_engine(8)
    calls = count_calls(engine.allocator, "decode_slot")
    appends = count_calls(engine.allocator, "try_append")
    for _ in range(60):  # positions 3 .. 62 of each sequence
        engine.step(snapshot=False, outputs=False)
    # Each sequence: its first decode (position 3) is found alone; then per block boundary the
    # token that fills a block (15, 31, 47: one look, then a SeqWork) and the first of the next
    # block (16, 32, 48: one look, a new block, one look again). The other 50 decodes: none.
    assert sum(calls) == 8 * (1 + 3 * 1 + 3 * 2)
    assert sum(appends) == 8 * 3 * 2
    assert all(len(s.token_ids) == 3 + 61 for s in engine.scheduler.running)
    engine.check_invariants()


def test_a_step_without_a_boundary_reads_no_sequence_back():
    engine = decoding_engine(32)
    engine.step(snapshot=False, outputs=False)  # position 3: every sequence found alone, once
    sizes = count_calls(engine.allocator, "seq_layout", sizes=True)
    for _ in range(5):  # positions 4 .. 8: plain decodes, by whole columns
        engine.step(snapshot=False, outputs=False)
    assert sizes == []  # nothing read back: the sequences found alone at position 3 were read in their step
    engine.check_invariants()


@pytest.mark.parametrize("columns_from", [0, 12, 10**9])
def test_listed_state_equals_the_sequences_after_every_step_with_finishes_and_boundaries(columns_from):
    """By columns every step, from 12 running on (the run crosses it both ways), never."""
    for allocator in ("paged", "contiguous"):
        engine = Engine(EngineConfig(pool_slots=4096, block_size=16, allocator=allocator), ScriptedSource(),
                        snapshots=False)
        engine.scheduler.columns_from = columns_from
        for i in range(24):
            engine.add_request(f"r{i}", list(range(3, 3 + 1 + i % 7)), SamplingParams(max_tokens=64),
                               output_len=5 + (7 * i) % 40, arrival_step=i // 3)
        while engine.has_unfinished():
            engine.step(snapshot=False)
            engine.check_invariants()  # every column not marked stale matches its sequence and the allocator
            listed = engine.last_seqs  # read from the columns: what the sequences say, one at a time
            seqs = engine.scheduler.running + engine.scheduler.waiting + engine.scheduler.swapped
            assert listed["seq_id"].tolist() == [s.seq_id for s in seqs]
            assert listed["seq_num_tokens"].tolist() == [s.num_tokens for s in seqs]
            assert listed["seq_num_computed"].tolist() == [s.num_computed for s in seqs]
            assert listed["seq_num_blocks"].tolist() == list(engine.allocator.seq_layout(seqs)[0])


def test_the_invariant_check_catches_a_column_gone_wrong():
    engine = decoding_engine(4)
    for _ in range(3):
        engine.step(snapshot=False, outputs=False)
    engine.check_invariants()
    run = engine.scheduler._run
    for row, bad in ((SLOT, 1), (LAST, 7), (NUM_BLOCKS, 9)):
        good = int(run.cols[row, 2])
        run.cols[row, 2] = good + bad
        with pytest.raises(AssertionError):
            engine.check_invariants()
        run.cols[row, 2] = good
    engine.check_invariants()


def test_removing_a_sequence_keeps_the_others_columns():
    class Seq:
        def __init__(self, i):
            self.i = i

    run = RunningSet(capacity=2)
    seqs = [Seq(i) for i in range(5)]
    for s in seqs:
        run.append(s)  # grows past its capacity
    run.cols[LAST] = [10, 11, 12, 13, 14]
    run.remove(seqs[1])
    assert run.seqs == [seqs[0], seqs[2], seqs[3], seqs[4]] and run.cols[LAST].tolist() == [10, 12, 13, 14]
    assert run.pop() is seqs[4] and run.cols[LAST].tolist() == [10, 12, 13]
    run.append(Seq(9))
    assert run.slot.tolist()[-1] == -1  # a sequence that joins is not known to decode plainly
