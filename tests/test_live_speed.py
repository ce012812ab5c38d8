"""The live real-model pair's speed mechanics, checked by behaviour rather than by timings: the
per-step token budget that spreads the prefills, the stepping thread that keeps the runs ahead of
the page, Step advancing a live run by exactly one step, each engine's share of the cores, and
the bf16 setting reaching the engine. The timings themselves are ``bench live`` (a real browser).

The scripted-source tests need no model; the ``slow`` ones open the page on SmolLM2."""
import threading
import time

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.scripted import ScriptedSource
from ui.live_stepper import GuardedRecording, LiveStepper
from ui.models import CoreShare, CoreSharingSource
from ui.runs.live import LIVE_BATCH_TOKENS, LiveRun, live_configs, live_workload_note

PROMPTS = 16
PROMPT_LEN = 38  # about the chat prompts' length


def scripted_run(allocator: str, budget: int | None = LIVE_BATCH_TOKENS, output_len: int = 12) -> LiveRun:
    """A live-style run (guarded recording, engine kept) on the scripted source."""
    recording = GuardedRecording()
    engine = Engine(EngineConfig(allocator=allocator, max_batch_tokens=budget), ScriptedSource(), recording=recording)
    for i in range(PROMPTS):
        prompt = [100 * i + j for j in range(1, PROMPT_LEN + 1)]  # no two alike: no prefix-cache hits
        engine.add_request(f"r{i:02d}", prompt, SamplingParams(max_tokens=64),
                           output_len=output_len)
    return LiveRun(allocator, engine.config, request_ids=list(engine.requests), engine=engine, recording=recording)


def finish_ended(runs) -> None:
    for run in runs:
        if run.engine is not None and not run.engine.has_unfinished():
            run.done = True
            run.engine = None


def wait_idle(stepper: LiveStepper, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while stepper.stepping:
        assert time.monotonic() < deadline, "the stepping thread did not stop"
        time.sleep(0.01)


# ---------------------------------------------------------------------------- the token budget
def test_the_first_step_computes_the_token_budget_and_the_prefills_spread_over_the_next():
    runs = [scripted_run("contiguous", output_len=200), scripted_run("paged", output_len=200)]
    stepper = LiveStepper(runs, finish_ended)
    assert stepper.advance(0)
    for run in runs:
        assert run.num_steps == 1
        assert run.at(0).metrics.step_tokens == LIVE_BATCH_TOKENS  # 16 x 38 prompt tokens wait: the budget is full
    assert stepper.advance(14)
    for run in runs:
        # 608 prompt tokens and the decodes of those already admitted, 64 a step: ten full steps, then
        # the last 49, then one decode for each of the 16
        assert run.metric("step_tokens") == [64] * 10 + [49] + [16] * 4
        assert run.metric("num_running") == [2, 4, 5, 7, 9, 10, 11, 13, 14] + [16] * 6


def test_the_live_configs_carry_the_budget():
    from ui import settings

    configs = live_configs("contiguous", **{k: settings.BY_KEY[k].default for k in settings.ENGINE_KEYS})
    assert [c.allocator for c in configs] == ["contiguous", "paged"]
    assert [c.max_batch_tokens for c in configs] == [LIVE_BATCH_TOKENS, LIVE_BATCH_TOKENS]
    assert LIVE_BATCH_TOKENS >= PROMPTS  # a full batch of decodes always fits one step


def test_the_pages_say_what_the_real_model_runs_in_place_of_the_workload():
    # issue 21: the workload silently became 16 chat prompts while the sidebar still showed the old one
    assert live_workload_note("trickle").startswith("SmolLM2 runs 16 chat prompts (answers of up to 256 tokens), "
                                                    "not the trickle workload")
    said = live_workload_note("azure-conv")
    assert said.startswith("SmolLM2 replays the first 16 requests of Azure's conversation log") and "1/8" in said


# ---------------------------------------------------------------------------- the stepping thread
def test_the_stepper_runs_ahead_to_the_target_then_stops():
    runs = [scripted_run("contiguous", output_len=200), scripted_run("paged", output_len=200)]
    stepper = LiveStepper(runs, finish_ended)
    assert stepper.advance(3, ahead=4)
    assert all(r.num_steps >= 4 for r in runs)  # returns once step 3 is recorded
    wait_idle(stepper)
    assert [r.num_steps for r in runs] == [8, 8]  # steps 0..7, and no further
    assert stepper.advance(2)  # already recorded: no waiting and no stepping
    wait_idle(stepper)
    assert [r.num_steps for r in runs] == [8, 8]
    assert stepper.advance(8)  # Step: exactly one more
    wait_idle(stepper)
    assert [r.num_steps for r in runs] == [9, 9]
    for run in runs:  # what was recorded while the thread wrote is whole, step by step
        assert [run.at(i).step for i in range(run.num_steps)] == list(range(9))
        run.engine.check_invariants()


def test_the_stepper_ends_with_the_runs_and_a_lower_target_stops_it():
    runs = [scripted_run("contiguous", output_len=3), scripted_run("paged", output_len=3)]
    stepper = LiveStepper(runs, finish_ended)
    assert stepper.advance(10_000)  # returns when every run has ended
    assert all(r.done and r.engine is None for r in runs)
    wait_idle(stepper)
    assert not stepper.stepping

    slow = [scripted_run("paged", output_len=500)]
    stepper = LiveStepper(slow, finish_ended)
    stepper.advance(0, ahead=10_000)
    stepper.cancel()
    wait_idle(stepper)
    assert slow[0].num_steps < 10_000 and not slow[0].done


def test_an_error_in_a_step_reaches_the_page():
    run = scripted_run("paged")

    class Broken(Exception):
        pass

    def broken_step(snapshot=True):
        raise Broken("the forward failed")

    run.engine.step = broken_step
    stepper = LiveStepper([run], finish_ended)
    with pytest.raises(Broken, match="the forward failed"):
        stepper.advance(0)
    assert not stepper.stepping


def test_a_live_run_reads_its_recording_under_the_lock_it_is_written_under():
    run = scripted_run("paged")
    assert run._lock is run.recording.lock
    assert isinstance(LiveRun("x", EngineConfig())._lock, type(threading.RLock()))


# ---------------------------------------------------------------------------- cores
def test_engines_stepping_at_once_share_the_cores():
    now = [0.0]
    share = CoreShare(window_s=2.0, clock=lambda: now[0], cores=2)
    a, b, c = object(), object(), object()
    assert share.threads_for(a) == 2  # alone: both cores
    assert share.threads_for(b) == 1  # a live pair: one core each
    assert share.threads_for(a) == 1
    now[0] = 1.0
    assert share.threads_for(c) == 1 and share.active() == 3  # three engines on two cores: one thread each, not 2 x 3
    now[0] = 3.5  # a and b have not stepped for 2.5 s
    assert share.threads_for(c) == 2 and share.active() == 1


def test_a_core_sharing_source_sets_the_thread_count_in_the_stepping_thread():
    import torch

    class Runner:
        dtype = "float32"

        def execute(self, batch):
            return {"threads": torch.get_num_threads()}

    share = CoreShare(cores=2)
    sources = [CoreSharingSource(Runner(), share) for _ in range(2)]
    assert sources[0].dtype == "float32"  # the runner's attributes read through
    seen = {}

    def step(i):
        seen[i] = sources[i].execute(None)["threads"]

    before = torch.get_num_threads()
    try:
        step(0)
        worker = threading.Thread(target=step, args=(1,))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == {0: 2, 1: 1} and [s.threads_used for s in sources] == [2, 1]


# ---------------------------------------------------------------------------- the page, on the model
@pytest.mark.slow
def test_the_live_page_starts_within_the_budget_and_step_advances_by_one():
    from tests.apptest import open_page

    at = open_page("pages/reserve_or_page.py", source="model")
    # the page and the sidebar say which requests the real model runs in place of the workload
    for where in (at.main, at.sidebar):
        said = [c.value for c in where.caption]
        assert sum("SmolLM2 runs 16 chat prompts" in c and "not the explainer40 workload" in c for c in said) == 1, said
    runs = at.session_state["_live_stepper"].runs
    assert [r.allocator for r in runs] == ["contiguous", "paged"]
    for run in runs:
        assert run.config.max_batch_tokens == LIVE_BATCH_TOKENS
        assert run.num_steps == 1 and run.at(0).metrics.step_tokens <= LIVE_BATCH_TOKENS
    for expected in (1, 2):
        at.button(key="rop_fwd").click().run()
        assert not at.exception, at.exception
        assert at.session_state["rop_step"] == expected
        assert [r.num_steps for r in runs] == [expected + 1] * 2
    time.sleep(0.5)  # paused: nothing steps ahead
    assert [r.num_steps for r in runs] == [3, 3]
    assert all(r.engine.source.threads_used >= 1 for r in runs)


@pytest.mark.slow
def test_the_bf16_setting_reaches_the_engine():
    import torch

    from tests.apptest import open_page
    from ui.models import bf16_offered

    if not bf16_offered():
        pytest.skip("this CPU does not compute bf16 natively: the sidebar does not offer it")
    at = open_page("pages/reserve_or_page.py", source="model", dtype="bfloat16")
    runs = at.session_state["_live_stepper"].runs
    assert [r.engine.source.dtype for r in runs] == [torch.bfloat16] * 2
    assert runs[0].engine.source.bytes_per_slot == 23_040  # SmolLM2's 46,080 B a token in fp32, halved
    assert at.radio(key="dtype").value == "bfloat16"


def test_the_answers_table_is_read_once_a_second_while_playing(monkeypatch):
    """*Reserve or page* with the real model: while playing, the answers table's rows are read again
    at most once every ``ANSWERS_EVERY_S`` (the same rows, as the curves are held) though the runs
    step on; paused, or for other runs, they are read at once."""
    from types import SimpleNamespace

    from ui.lessons import reserve_or_page as rop

    clock = [50.0]
    monkeypatch.setattr(rop, "st", SimpleNamespace(session_state={}))
    monkeypatch.setattr(rop, "time", SimpleNamespace(monotonic=lambda: clock[0]))  # this module's clock only
    monkeypatch.setattr(rop, "tokenizer", lambda: SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids))))
    runs = [scripted_run("contiguous"), scripted_run("paged")]
    for _ in range(3):
        [r.engine.step(snapshot=False) for r in runs]
    first = rop.answers(runs, held_s=rop.ANSWERS_EVERY_S)
    assert [row["request"] for row in first] == [f"r{i:02d}" for i in range(PROMPTS)]
    assert first[0]["paged"] and first[0]["paged"] == first[0]["contiguous"]  # the same scripted tokens
    [r.engine.step(snapshot=False) for r in runs]
    clock[0] += rop.ANSWERS_EVERY_S * 0.9
    assert rop.answers(runs, held_s=rop.ANSWERS_EVERY_S) is first  # held: the runs stepped, the rows did not
    now = rop.answers(runs, held_s=None)  # paused: read at once
    assert now is not first and len(now[0]["paged"]) > len(first[0]["paged"])
    clock[0] += rop.ANSWERS_EVERY_S * 0.5
    assert rop.answers([runs[1]], held_s=rop.ANSWERS_EVERY_S) is not now  # other runs: their own rows
    clock[0] += rop.ANSWERS_EVERY_S
    later = rop.answers([runs[1]], held_s=rop.ANSWERS_EVERY_S)
    assert later is not now and later == rop.answers([runs[1]], held_s=None)
