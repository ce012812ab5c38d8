"""Real-model lessons record through the engine (issue 22, item 4): a TimedRun's engine writes each
step into the run's recording as a delta, and no full snapshot is diffed into it. The steps it
records are the very snapshots the old path (a full snapshot per step, ``Recording.append``)
recorded, step for step: on the lesson scenarios driven by the scripted token source, and on a
small run of the real SmolLM2 with preemption."""
from __future__ import annotations

import copy
import os

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource
from tests.test_teaching_pages import CharTokenizer
from ui.timed_runs import new_timed_run, run_interleaved

DIFF_SNAPSHOT = Recording.append  # the old path, kept for the check below (the fixture refuses it in lesson runs)


class TappedEngine(Engine):
    """An engine that also takes the full snapshot of every step (what the old path appended)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.snapshots = []

    def step(self, snapshot: bool = True):
        outputs, snap = super().step(snapshot=True)
        self.snapshots.append(snap)
        return outputs, snap if snapshot else None


def tapped_factory(make_source):
    """``make_engine(config, recording=...)`` for the scenarios, and the engines it made."""
    made = []

    def make(config, recording=None):
        engine = TappedEngine(config, make_source(), recording=recording)
        made.append(engine)
        return engine

    return make, made


def assert_same_steps(rec, snapshots) -> None:
    """``rec.at(step)`` equals the engine's full snapshot at every step, and so does a recording
    fed those snapshots the old way (diffed)."""
    old = Recording()
    for snap in snapshots:
        DIFF_SNAPSHOT(old, snap)
    assert rec.num_steps == len(snapshots) == old.num_steps > 0
    for i, snap in enumerate(snapshots):
        got = rec.at(i)
        assert got == snap, f"step {i} of {len(snapshots)}"
        assert old.at(i) == got, f"step {i} of {len(snapshots)}"


@pytest.fixture
def no_snapshot_diffing(monkeypatch):
    """Recording.append (a full snapshot, diffed) must not be called while a lesson runs."""
    def refuse(self, snapshot):
        raise AssertionError("a lesson run diffed a full snapshot into its recording")

    monkeypatch.setattr(Recording, "append", refuse)


def test_lesson_scenarios_record_deltas_through_the_engine(no_snapshot_diffing):
    from ui.lessons import live_engine, prefix_sharing, under_pressure

    make, made = tapped_factory(ScriptedSource)
    tok = CharTokenizer()
    cfg = {m: EngineConfig(block_size=16, pool_slots=384, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    recs = list(under_pressure.pressure_pair(make, tok, cfg["swap"], cfg["recompute"]).values())
    recs.append(prefix_sharing.prefix_sharing_run(make, tok, EngineConfig(block_size=16, pool_slots=16384)))
    recs.append(live_engine.guide_run(make, tok, live_engine.GUIDE_CONFIG))
    assert len(made) == len(recs)
    assert all(r.preemptions() for r in recs[:2])  # the pressure runs preempt: swap and recompute are covered
    for rec, engine in zip(recs, made):
        assert engine.recording is rec.recording  # the engine writes the run's own recording
        assert len(rec.wall_s) == len(rec.lengths) == rec.num_steps
        assert_same_steps(rec, engine.snapshots)


# ---------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def runner():
    import torch

    from pagedkv_core.sources.model.loader import open_model
    from pagedkv_core.sources.model.runner import ModelRunner

    before = torch.get_num_threads()  # one thread: see tests/test_llm.py
    torch.set_num_threads(int(os.environ.get("PAGEDKV_TEST_THREADS", "1")))
    loaded = open_model(None, progress=lambda f, m: None)
    yield ModelRunner(loaded, device="cpu"), loaded.tokenizer
    torch.set_num_threads(before)


@pytest.mark.slow
def test_real_model_lesson_run_records_the_same_steps(runner, no_snapshot_diffing):
    """Three chat prompts on SmolLM2 (about 35 tokens each) in a pool of six blocks: two run, and
    when they outgrow their third block one is swapped out (and back in). Driven the way the
    lessons drive it (new_timed_run, TimedRun.step); the scripted test above covers recompute."""
    from ui.models import chat_prompt

    model, tokenizer = runner
    make, made = tapped_factory(lambda: copy.copy(model))
    config = EngineConfig(block_size=16, pool_slots=96, watermark=0.0, preemption="swap", swap_slots=96)
    rec = new_timed_run("swap", config, make)
    for i, q in enumerate(["Why is the sky blue?", "Name a fruit.", "What is two plus two?"]):
        rec.add(f"r{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=14, ignore_eos=True), arrival_step=i // 2)
    run_interleaved([rec], max_steps=100)
    assert rec.done and rec.preemptions() and rec.swap_bytes()[1] > 0, rec.num_steps
    assert_same_steps(rec, made[0].snapshots)
    assert all(len(ids[0]) > 0 for ids in (rec.output_ids(f"r{i}") for i in range(3)))
