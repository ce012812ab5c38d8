"""Shared helpers for the engine-core tests."""
from __future__ import annotations

import numpy as np

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.oracle import KVOracleSource
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource, scripted_token
from pagedkv_core.sequence import Request, Sequence
from pagedkv_core.record.slot_state import SlotState


def make_engine(checked: bool = True, **config) -> Engine:
    """An engine over the scripted source; ``checked`` wraps it in the KV oracle."""
    cfg = EngineConfig(**config)
    if checked:
        source = KVOracleSource()
        engine = Engine(cfg, source)
        source.attach(engine)
    else:
        engine = Engine(cfg, ScriptedSource())
    return engine


def add(engine: Engine, rid: str, prompt, output_len: int, max_tokens: int = 64, n: int = 1, arrival_step=None, **kw):
    engine.add_request(
        rid, list(prompt), SamplingParams(max_tokens=max_tokens, n=n, **kw), arrival_step=arrival_step, output_len=output_len
    )


def run_checked(engine: Engine, max_steps: int = 100_000, on_step=None) -> list:
    """Step to the end, checking the allocator invariants and the snapshot after every step."""
    snaps = []
    while engine.has_unfinished():
        assert len(snaps) < max_steps, "engine did not finish"
        outputs, snap = engine.step()
        engine.check_invariants()
        check_snapshot(engine, snap)
        if on_step is not None:
            on_step(outputs, snap)
        snaps.append(snap)
    return snaps


def check_snapshot(engine: Engine, snap) -> None:
    """The snapshot's arrays agree with the engine's counters."""
    written = np.isin(snap.slot_state, (SlotState.FILLED, SlotState.SHARED)).sum()
    assert written == snap.metrics.filled_slots == engine.allocator.filled_slots
    if snap.allocator == "paged":
        in_use = int((snap.block_ref > 0).sum())
        assert in_use * snap.block_size == snap.metrics.allocated_slots
        assert (snap.block_fill[snap.block_ref > 0]).sum() == snap.metrics.filled_slots
    else:
        reserved = np.isin(snap.slot_state, (SlotState.FILLED, SlotState.EMPTY)).sum()
        assert reserved == snap.metrics.allocated_slots
    assert set(snap.running) | set(snap.waiting) | set(snap.swapped) == set(snap.seq_id.tolist())


def expected_stream(rid: str, n: int, output_len: int, max_tokens: int) -> tuple:
    length = min(output_len, max_tokens)
    reason = "stop" if output_len < max_tokens else "length"
    return reason, tuple(tuple(scripted_token(rid, i, p) for p in range(length)) for i in range(n))


def streams(engine: Engine) -> dict:
    return {
        r.request_id: (r.finish_reason, tuple(tuple(o) for o in r.output_token_ids)) for r in engine.requests.values()
    }


def lone_sequence(tokens, rid: str = "r", index: int = 0, seq_id: int = 0, max_tokens: int = 16, extra_keys=()) -> Sequence:
    """A Sequence outside any engine, for allocator unit tests."""
    request = Request(rid, index, list(tokens), SamplingParams(max_tokens=max_tokens), 0, None, tuple(extra_keys))
    seq = Sequence(seq_id, request, 0, list(tokens))
    request.seqs.append(seq)
    return seq
