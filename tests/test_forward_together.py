"""Engines stepped in lockstep (``pagedkv_core.lockstep``), their forwards as one
(``ModelRunner.execute_together``): each engine's step is its own, its tokens the same as when it
steps alone, token for token, and every allocator's invariants hold after every step.

The scripted-source tests need no model; the others run the live pair (a contiguous baseline and
paged, the chat prompts) on SmolLM2."""
import copy
from types import SimpleNamespace

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.lockstep import step_together
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource
from ui.live_stepper import GuardedRecording, LiveStepper
from ui.runs.live import LIVE_BATCH_TOKENS, LiveRun


def scripted_engine(allocator: str, recording=None) -> Engine:
    engine = Engine(EngineConfig(allocator=allocator, pool_slots=512, max_batch_tokens=48), ScriptedSource(),
                    recording=recording)
    for i in range(10):
        engine.add_request(f"r{i}", [50 * i + j for j in range(1, 20)], SamplingParams(max_tokens=40),
                           output_len=5 + 3 * i)
    return engine


def streams(engine: Engine) -> dict:
    return {rid: [list(s.token_ids) for s in r.seqs] for rid, r in engine.requests.items()}


def separately(sources: list, batches: list) -> list:
    return [source.execute(batch) for source, batch in zip(sources, batches)]


def run_apart_and_together(apart: list[Engine], together: list[Engine], execute_together) -> int:
    """Step ``apart`` one engine at a time and ``together`` in lockstep until all end, checking the
    invariants after every step; asserts the same token streams. Returns the steps taken."""
    steps = 0
    while any(e.has_unfinished() for e in apart + together):
        for e in apart:
            if e.has_unfinished():
                e.step(snapshot=False)
        step_together([e for e in together if e.has_unfinished()], execute_together)
        for e in together:
            e.check_invariants()
        steps += 1
    assert [streams(e) for e in apart] == [streams(e) for e in together]
    return steps


def steps_like_the_page(apart: list[Engine], together: list[Engine], steps: int) -> None:
    """``steps`` steps of ``apart`` one engine at a time and of ``together`` as the live stepper
    takes them (``ui.models.step_together``); asserts the same token streams."""
    from ui.models import step_together as ui_step_together

    for _ in range(steps):
        for e in apart:
            e.step(snapshot=False)
        ui_step_together(together)
    assert [e.step_index for e in together] == [steps] * len(together)
    assert [streams(e) for e in apart] == [streams(e) for e in together]


def test_a_step_in_its_two_halves_is_the_same_step():
    whole, halves = scripted_engine("paged"), scripted_engine("paged")
    while whole.has_unfinished():
        outputs, snap = whole.step()
        started = halves.start_step()
        results = halves.source.execute(started.batch) if started.executes else {}
        outputs2, snap2 = halves.finish_step(started, results)
        assert [(o.request_id, o.outputs[0].token_ids) for o in outputs] == \
            [(o.request_id, o.outputs[0].token_ids) for o in outputs2]
        assert snap.step == snap2.step and snap.events == snap2.events and snap.metrics.num_running == snap2.metrics.num_running
        assert (snap.slot_owner == snap2.slot_owner).all() and (snap.block_ref == snap2.block_ref).all()
        halves.check_invariants()
    assert not halves.has_unfinished() and streams(whole) == streams(halves)


def test_a_step_is_finished_once_and_in_order():
    engine = scripted_engine("contiguous")
    started = engine.start_step()
    engine.finish_step(started, engine.source.execute(started.batch))
    with pytest.raises(RuntimeError, match="finish_step for step 0, but the engine is at step 1"):
        engine.finish_step(started, {})


def test_lockstep_runs_every_busy_engine_in_one_call_and_each_steps_as_alone():
    apart = [scripted_engine("contiguous"), scripted_engine("paged")]
    together = [scripted_engine("contiguous"), scripted_engine("paged")]
    calls = []

    def one_call(sources, batches):
        calls.append(len(batches))
        return separately(sources, batches)

    steps = run_apart_and_together(apart, together, one_call)
    assert len(calls) == steps and max(calls) == 2  # one call a step, with both engines' batches


def test_runners_of_different_models_are_not_run_as_one():
    from pagedkv_core.sources.model.runner import ModelRunner

    with pytest.raises(ValueError, match="share one model"):
        ModelRunner.execute_together([(SimpleNamespace(model=1), None), (SimpleNamespace(model=2), None)])


def test_engines_without_a_shared_model_step_in_turn():
    apart, together = [scripted_engine("paged"), scripted_engine("contiguous")], \
        [scripted_engine("paged"), scripted_engine("contiguous")]
    steps_like_the_page(apart, together, 5)


def test_the_stepper_hands_its_engines_to_together_in_one_call():
    runs = []
    for allocator in ("contiguous", "paged"):
        recording = GuardedRecording()
        engine = scripted_engine(allocator, recording)
        runs.append(LiveRun(allocator, engine.config, request_ids=list(engine.requests), engine=engine,
                            recording=recording))
    seen = []

    def together(engines):
        seen.append([id(e) for e in engines])
        for e in engines:
            e.step(snapshot=False)

    stepper = LiveStepper(runs, lambda runs: None, together=together)
    assert stepper.advance(3)
    assert runs[0].engine.step_index >= 4 and runs[1].engine.step_index >= 4
    assert seen and all(ids == [id(runs[0].engine), id(runs[1].engine)] for ids in seen)


# ---------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def runner():
    import torch

    from pagedkv_core.sources.model.loader import open_model
    from pagedkv_core.sources.model.runner import ModelRunner

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ModelRunner(open_model(None, progress=lambda f, m: None), device="cpu")
    torch.set_num_threads(before)


def live_pair(runner, prompts: list[list[int]], share=None) -> list[Engine]:
    """The live pages' pair on one model: Orca (Max) and paged, each with its own pools (and, given
    a CoreShare ``share``, its runner wrapped as the pages wrap it)."""
    from ui.models import CoreSharingSource

    engines = []
    for allocator in ("contiguous", "paged"):
        source = copy.copy(runner) if share is None else CoreSharingSource(copy.copy(runner), share)
        engine = Engine(EngineConfig(allocator=allocator, pool_slots=512, max_batch_tokens=LIVE_BATCH_TOKENS), source)
        for i, ids in enumerate(prompts):
            engine.add_request(f"chat{i}", ids, SamplingParams(max_tokens=24))
        engines.append(engine)
    return engines


def test_the_live_pair_writes_the_same_tokens_with_its_forwards_as_one(runner):
    from pagedkv_core.sources.model.runner import ModelRunner
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS
    from ui.models import chat_prompt

    prompts = [chat_prompt(runner.tokenizer, text) for text in CHAT_PROMPTS[:6]]
    apart, together = live_pair(runner, prompts), live_pair(runner, prompts)
    assert together[0].source.model is together[1].source.model  # one copy of the weights
    shapes = []

    def as_one(sources, batches):
        shapes.append([(b.num_seqs, b.num_tokens) for b in batches])
        return ModelRunner.execute_together(list(zip(sources, batches)))

    run_apart_and_together(apart, together, as_one)
    assert all(len(streams(e)) == 6 for e in together)
    # the forwards that ran as one mixed both engines' prefill chunks and decodes
    both = [s for s in shapes if len(s) == 2]
    assert both and any(tokens > seqs for s in both for seqs, tokens in s) and any(s[0][1] == s[0][0] for s in both)


def test_the_pages_pair_steps_as_one_forward_on_one_engines_share_of_the_cores(runner):
    """ui.models.step_together, as the live stepper calls it: the pair's sources (CoreSharingSource
    over runners of one model) run one forward, on one engine's share of two cores (one thread)."""
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS
    from ui.models import CoreShare, chat_prompt

    prompts = [chat_prompt(runner.tokenizer, text) for text in CHAT_PROMPTS[6:9]]
    apart = live_pair(runner, prompts)
    together = live_pair(runner, prompts, share=CoreShare(cores=2))
    steps_like_the_page(apart, together, 12)
    assert [e.source.threads_used for e in together] == [1, 1]
