"""Whole request logs, streamed (Engine.feed), and idle stretches passed in one step (skip_idle)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from pagedkv_core.cli import main
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.record.trace_file import load_recording, trace_records
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import (
    MAX_LOG_REQUESTS,
    LogStream,
    load_workload_file,
    stream_workload_file,
)

from tests.engine_helpers import add


def _csv(path, rows: int, every_s: float = 0.01, prompt: int = 4, answer: int = 2):
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{i * every_s:.2f},{prompt + i % 3},{answer + i % 2}\n" for i in range(rows)))
    return path


# ---------------------------------------------------------------------------- streaming
def test_a_50000_row_log_streams_with_a_bounded_number_of_live_requests(tmp_path):
    # 50,000 rows: over 80 times the 600 that may be alive at once (a bound of the run, not of the file)
    path = _csv(tmp_path / "big.csv", 50_000)
    stream = stream_workload_file(path, seconds_per_step=1.0, max_tokens="answer", pool_slots=8192)
    assert isinstance(stream, LogStream) and stream.num_requests == 50_000
    engine = Engine(EngineConfig(pool_slots=8192, block_size=16), ScriptedSource(), snapshots=False, skip_idle=True)
    engine.feed(stream.requests())
    most_requests = most_seqs = finished = steps = 0
    while engine.has_unfinished():
        outputs, _ = engine.step(snapshot=False)
        finished += sum(o.finished for o in outputs)
        most_requests = max(most_requests, len(engine.requests))
        most_seqs = max(most_seqs, len(engine.scheduler.seqs))
        steps += 1
        assert steps <= 10_000
    # 100 requests arrive a step and each lives 3 or 4 steps: a few hundred alive, never the log.
    assert most_requests <= 600 and most_seqs <= 600
    assert finished == 50_000
    summary = engine.summary()
    assert summary.requests == summary.finished == 50_000 and not summary.rejected
    assert not engine.requests and not engine.scheduler.seqs


def test_a_forgotten_request_is_freed_at_once_not_by_the_cyclic_collector(tmp_path):
    """A request and its sequences referred to each other, so a forgotten one stayed in memory
    until Python's cyclic collector ran (`simulate` of a 20,000-request log peaked at 91 MB, not 50). With
    the collector off, only the requests alive are left after a 5,000-row streamed log."""
    import gc

    from pagedkv_core.sequence import Request, Sequence

    path = _csv(tmp_path / "log.csv", 5000, every_s=0.05, prompt=20, answer=10)
    engine = Engine(EngineConfig(pool_slots=4096, block_size=16), ScriptedSource(), snapshots=False, skip_idle=True)
    told = []
    engine.feed(stream_workload_file(path, max_tokens="answer").requests(),
                on_release=lambda seq: told.append((seq.seq_id, seq.request.request_id)))

    def held() -> int:
        return sum(type(o) in (Request, Sequence) for o in gc.get_objects())  # type(): no __class__ of a proxy read

    was_on = gc.isenabled()
    gc.collect()
    before = held()  # other tests' in this process
    gc.disable()
    try:
        while engine.has_unfinished():
            engine.step(snapshot=False, outputs=False)
        kept = held() - before
    finally:
        if was_on:
            gc.enable()
    assert engine.num_finished == 5000 and len(told) == 5000
    assert len({rid for _, rid in told}) == 5000  # the callback still sees the request
    assert kept <= 2, kept  # the last request's, at most (10,000 before: each request and its sequence)


def test_a_streamed_log_feeds_the_requests_the_built_one_adds(tmp_path):
    path = _csv(tmp_path / "log.csv", 300, every_s=0.3)
    built = load_workload_file(path, count=300, max_tokens="answer")
    streamed = stream_workload_file(path, max_tokens="answer")
    assert list(streamed.requests()) == list(built.requests)
    assert streamed.description == built.description

    def run(feed: bool) -> tuple:
        engine = Engine(EngineConfig(pool_slots=2048), ScriptedSource(), recording=Recording())
        if feed:
            engine.feed(streamed.requests())
        else:
            built.submit(engine)
        tokens = {}
        while engine.has_unfinished():
            for out in engine.step(snapshot=False)[0]:
                tokens.setdefault(out.request_id, []).extend(out.outputs[0].new_token_ids)
            engine.check_invariants()
        rec = engine.recording
        summary = {k: v for k, v in engine.summary().to_json().items() if "execute" not in k}
        return tokens, [dataclasses.replace(rec.metrics(s), execute_s=0.0) for s in rec.steps], summary

    assert run(True) == run(False)


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_a_streamed_runs_waste_split_is_the_built_runs(tmp_path, allocator):
    """A streamed engine forgets finished sequences; what they wrote reaches the waste split
    through feed(on_release=...), so their empty reserved slots stay reservation, not internal."""
    from pagedkv_core.record.waste import Released, WasteAccumulator, final_written

    path = _csv(tmp_path / "log.csv", 200, every_s=0.3, prompt=40, answer=30)
    built = load_workload_file(path, count=200, max_tokens="answer")
    streamed = stream_workload_file(path, max_tokens="answer")

    def split(feed: bool) -> dict:
        engine = Engine(EngineConfig(pool_slots=2048, allocator=allocator), ScriptedSource())
        released = Released()
        if feed:
            engine.feed(streamed.requests(), on_release=released)
        else:
            built.submit(engine)
        waste = WasteAccumulator()
        while engine.has_unfinished():
            engine.step(snapshot=False)
            waste.add_engine(engine)
        if feed:
            assert not engine.scheduler.seqs and len(released) == 200
        return waste.breakdown(final_written(engine, released))

    built_split = split(False)
    assert built_split["reservation"] > 0
    assert split(True) == built_split


def test_the_cap_stays_with_its_message(tmp_path, monkeypatch):
    from pagedkv_core.workloads import scenarios

    monkeypatch.setattr(scenarios, "MAX_LOG_REQUESTS", 10)
    path = _csv(tmp_path / "log.csv", 11)
    with pytest.raises(ConfigError, match="more than 10 requests after row 0: give a count of at most 10"):
        stream_workload_file(path)
    assert stream_workload_file(path, count=10).num_requests == 10
    assert MAX_LOG_REQUESTS == 1_000_000


def test_a_log_out_of_time_order_is_built_whole(tmp_path):
    path = tmp_path / "shuffled.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,3\n1,10,3\n3,10,3\n")
    workload = stream_workload_file(path)
    assert not isinstance(workload, LogStream)
    assert [r.arrival_step for r in workload.requests] == [80, 0, 40]


def test_feed_refuses_belady_and_out_of_order_feeds():
    engine = Engine(EngineConfig(eviction="belady"), ScriptedSource())
    with pytest.raises(ValueError, match="Belady"):
        engine.feed([])

    @dataclasses.dataclass
    class Item:
        arrival_step: int

        def submit(self, engine):
            engine.add_request(f"r{self.arrival_step}", [5, 6, 7], arrival_step=self.arrival_step, output_len=1)

    engine = Engine(EngineConfig(), ScriptedSource())
    engine.feed([Item(0), Item(3), Item(1)])
    with pytest.raises(ValueError, match="out of arrival order"):
        while engine.has_unfinished():
            engine.step(snapshot=False)


def test_a_streamed_runs_trace_lists_its_requests_in_their_steps_and_replays(tmp_path, capsys):
    path = _csv(tmp_path / "log.csv", 40, every_s=0.5)
    trace = tmp_path / "run.jsonl"
    assert main(["simulate", "--workload-file", str(path), "--pool-slots", "4096", "--trace-out", str(trace),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == summary["finished"] == 40
    header, rec = load_recording(trace)
    ids = [r["id"] for r in header["requests"]]
    assert ids == [f"r{i}" for i in range(1, 41)]
    lines = trace_records(trace)
    assert "requests" not in lines[0] or lines[0]["requests"] == []
    # version 4: a step's requests are a JSON frame just before the step's own frame
    listed = {r["id"]: lines[i + 1]["step"] for i, line in enumerate(lines) if line["type"] == "requests"
              for r in line["requests"]}
    assert all(listed[r["id"]] == r["arrival_step"] for r in header["requests"])
    assert rec.num_steps == summary["steps"]
    assert main(["replay", str(trace), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["step"] == rec.last_step


# ---------------------------------------------------------------------------- idle stretches
def _gapped(skip: bool) -> tuple[Engine, int]:
    engine = Engine(EngineConfig(pool_slots=512, block_size=4), ScriptedSource(), recording=Recording(), skip_idle=skip)
    add(engine, "a", [5, 6, 7, 8], output_len=3, arrival_step=0)
    add(engine, "b", [9, 10, 11], output_len=2, arrival_step=50)
    add(engine, "c", [12, 13], output_len=4, arrival_step=51)
    add(engine, "d", [14, 15, 16], output_len=2, arrival_step=200)
    calls = 0
    while engine.has_unfinished():
        engine.step(snapshot=False)
        engine.check_invariants()
        calls += 1
    return engine, calls


def test_idle_stretches_pass_in_one_step_and_the_recording_says_so():
    plain, plain_calls = _gapped(False)
    skipping, calls = _gapped(True)
    # a: steps 0-2 (prefill + 2 decodes), idle 3-49; b and c: 50-54, idle 55-199; d: 200-201.
    assert plain_calls == plain.step_index == skipping.step_index == 202
    assert calls == 202 - 46 - 144 == 12
    a, b = plain.recording, skipping.recording
    assert list(a.steps) == list(b.steps) == list(range(202))
    skipped = {s: b.metrics(s).idle_skipped for s in b.steps if b.metrics(s).idle_skipped}
    assert skipped == {3: 46, 55: 144}
    for s in a.steps:
        ma, mb = (dataclasses.replace(r.metrics(s), execute_s=0.0) for r in (a, b))
        assert dataclasses.replace(mb, idle_skipped=0) == ma
        if s not in skipped:
            assert mb == ma
        assert b.at(s).events == a.at(s).events
    timeless = [{k: v for k, v in e.summary().to_json().items() if "execute" not in k} for e in (plain, skipping)]
    assert timeless[0] == timeless[1]


def test_without_a_recording_an_idle_stretch_costs_one_step():
    engine = Engine(EngineConfig(pool_slots=512, block_size=4), ScriptedSource(), snapshots=False, skip_idle=True)
    add(engine, "a", [5, 6], output_len=1, arrival_step=0)
    add(engine, "b", [7, 8], output_len=1, arrival_step=900_000)
    calls = 0
    while engine.has_unfinished():
        engine.step(snapshot=False)
        calls += 1
    assert calls == 3 and engine.step_index == 900_001
    assert engine.summary().steps == 900_001


def test_a_step_without_outputs_is_the_same_step():
    """step(outputs=False) (a replay that reads no outputs): the same recording, counts and
    summary, and a fed run still forgets its finished requests."""
    class Fed:  # what feed() takes: an arrival step and a submit
        def __init__(self, rid: str, prompt: list[int], answer: int, arrival_step: int):
            self.rid, self.prompt, self.answer, self.arrival_step = rid, prompt, answer, arrival_step

        def submit(self, engine: Engine) -> None:
            add(engine, self.rid, self.prompt, output_len=self.answer, arrival_step=self.arrival_step)

    feed = [Fed(f"r{i}", list(range(3, 7 + i % 5)), 1 + i % 4, i * 3) for i in range(60)]
    feed.insert(2, Fed("bad", [], 1, 5))  # rejected: an empty prompt

    def run(outputs: bool) -> tuple:
        engine = Engine(EngineConfig(pool_slots=256, block_size=4), ScriptedSource(), recording=Recording(), skip_idle=True)
        engine.feed(sorted(feed, key=lambda f: f.arrival_step))  # finished requests are forgotten
        returned = 0
        while engine.has_unfinished():
            returned += len(engine.step(snapshot=False, outputs=outputs)[0])
            engine.check_invariants()
        rec = engine.recording
        summary = {k: v for k, v in engine.summary().to_json().items() if "execute" not in k}
        metrics = [dataclasses.replace(rec.metrics(s), execute_s=0.0) for s in rec.steps]
        return returned, summary, metrics, engine.num_finished, len(engine.requests), len(engine.scheduler.seqs)

    full, bare = run(True), run(False)
    assert full[0] > 0 and bare[0] == 0
    assert full[1:] == bare[1:]
    assert bare[3] == 60 and bare[4] == bare[5] == 0


def test_run_without_a_callback_builds_no_outputs_and_runs_the_same():
    """Engine.run() with no on_step: nobody reads the outputs, so no step builds them
    (step(outputs=False)); the summary and every step's metrics equal a run whose callback sees them."""
    def run(with_callback: bool) -> tuple:
        engine = Engine(EngineConfig(pool_slots=512, block_size=4, preemption="swap"), ScriptedSource(), recording=Recording())
        for i in range(40):
            add(engine, f"r{i}", list(range(3, 9 + i % 7)), output_len=2 + i % 9, arrival_step=i // 3)
        seen = []
        built = Engine._outputs

        def spy(self, build=True):
            seen.append(build)
            return built(self, build)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(Engine, "_outputs", spy)
            summary = engine.run(on_step=(lambda outputs, snap: None) if with_callback else None, snapshot=False)
        rec = engine.recording
        metrics = [dataclasses.replace(rec.metrics(s), execute_s=0.0) for s in rec.steps]
        return set(seen), {k: v for k, v in summary.to_json().items() if "execute" not in k}, metrics

    with_cb, without = run(True), run(False)
    assert with_cb[0] == {True} and without[0] == {False}
    assert with_cb[1:] == without[1:] and without[1]["finished"] == 40
