"""Trace format versions 4 (today's: version 3 in binary frames), 3 (a compact record stream, idle
runs) and 2 (streamed keyframes and deltas), version-1 compatibility, one-line errors for every malformed input, and
the ``replay`` command."""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import zlib

import numpy as np
import pytest

from pagedkv_core.cli import replay
from pagedkv_core.record import trace_file as trace
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.metrics import StepMetrics
from pagedkv_core.record.recording import Recording
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.slot_state import SLOT_STATE_NAMES, SlotState
from pagedkv_core.record.step_codec import KEYFRAME_FIELDS, STEP_FIELDS, pack, unpack
from pagedkv_core.record.trace_file import TraceError, TraceWriter, load_recording, read_trace, write_recording, write_trace
from pagedkv_core.record.trace_frames import join_frames, split_frames
from pagedkv_core.workloads.scenarios import build_workload


def engine_for(name: str, recording=None, **config) -> Engine:
    workload = build_workload(name, 0)
    config.setdefault("pool_slots", workload.pool_slots)
    engine = Engine(EngineConfig(**config), ScriptedSource(), recording=recording)
    workload.submit(engine)
    return engine


@pytest.fixture(scope="module")
def burst():
    """A paged run with swap preemption: its snapshots and its trace header."""
    engine = engine_for("burst", preemption="swap")
    snaps = []
    while engine.has_unfinished():
        snaps.append(engine.step()[1])
    return snaps, engine.trace_header()


def lines_of(path) -> list[dict]:
    return trace.trace_records(path)


def write_lines(path, objs) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


def record_bytes(obj: dict) -> bytes:
    return zlib.decompress(base64.b64decode(obj["data"]))


def with_record(obj: dict, data: bytes) -> dict:
    return {**obj, "data": base64.b64encode(zlib.compress(data)).decode()}


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_round_trip_gives_equal_snapshots_and_header(tmp_path, allocator, version):
    engine = engine_for("shared_preamble", allocator=allocator)
    snaps = []
    while engine.has_unfinished():
        snaps.append(engine.step()[1])
    header = {**engine.trace_header(), "workload": "shared_preamble"}
    path = write_trace(tmp_path / "t.jsonl", snaps, header, version=version)
    got_header, got = read_trace(path)
    assert got_header == json.loads(json.dumps(header))
    assert got == snaps
    lines = lines_of(path)
    assert lines[0]["version"] == version and lines[0]["pool"]["num_slots"] == snaps[0].num_slots
    assert [o["type"] for o in lines[1:3]] == ["delta", "keyframe"] and lines[-1] == {"type": "end", "steps": len(snaps)}
    k = lines[0]["keyframe_every"]
    assert [o["step"] for o in lines if o["type"] == "keyframe"] == list(range(0, len(snaps), k))


def test_engine_streams_into_a_trace_writer(tmp_path, burst):
    _, header = burst
    path = tmp_path / "live.jsonl"
    writer = TraceWriter(path, keyframe_every=16)
    engine = engine_for("burst", recording=writer, preemption="swap")
    writer.set_header(engine.trace_header())
    snaps = []
    while engine.has_unfinished():
        snaps.append(engine.step()[1])
        if engine.step_index == 40:
            writer.flush()
            assert sum(1 for o in lines_of(path) if o["type"] == "delta") == 40  # on disk as it goes
    writer.close({"summary": engine.summary().to_json()})
    got_header, rec = load_recording(path)
    assert got_header["requests"] == header["requests"] and got_header["summary"]["steps"] == len(snaps)
    assert rec.num_steps == len(snaps)
    assert all(rec.at(i) == snaps[i] for i in range(0, len(snaps), 7)) and rec.last() == snaps[-1]
    with pytest.raises(ValueError, match="already written"):
        writer.set_header({"late": 1})


def test_a_recording_writes_out_and_loads_back(tmp_path, burst):
    snaps, header = burst
    rec = Recording()
    for snap in snaps:
        rec.append(snap)
    path = write_recording(tmp_path / "r.jsonl", rec, header)
    _, back = load_recording(path)
    assert back.num_steps == rec.num_steps
    assert [back.at(i) == snaps[i] for i in range(len(snaps))] == [True] * len(snaps)


def test_v1_trace_still_replays(tmp_path, burst):
    snaps, header = burst
    path = tmp_path / "v1.jsonl"
    v1 = [{"type": "header", "format": "pagedkv-trace", "version": 1, **header}]
    v1 += [{"type": "step", **s.to_json()} for s in snaps[:60]]
    write_lines(path, v1)
    got_header, got = read_trace(path)
    assert got_header == json.loads(json.dumps(header)) and got == snaps[:60]
    report = run_replay(path, "--step", "30", "--json")
    assert report["step"] == 30 and report["num_steps"] == 60
    assert report["slot_counts"] == counts(snaps[30].slot_state)


def test_a_trace_cut_short_loads_up_to_its_last_whole_line(tmp_path, burst):
    snaps, header = burst
    path = write_trace(tmp_path / "t.jsonl", snaps, header, version=2)
    text = path.read_text()
    cut = text[: text.index('"type":"delta","step":50') - 40]  # in the middle of step 49's line
    path.write_text(cut)
    got_header, rec = load_recording(path)
    assert got_header["truncated"] is True and rec.num_steps == 49 and rec.last() == snaps[48]


# ---------------------------------------------------------------------------- malformed input
def valid_lines(snaps, header, tmp_path) -> list[dict]:
    """A version-2 trace's lines (each record deflated on its own, so one can be rewritten)."""
    return lines_of(write_trace(tmp_path / "ok.jsonl", snaps[:40], header, version=2))


def corrupt_record(lines, kind, index, change) -> list[dict]:
    """Lines with the ``index``-th record of ``kind`` rewritten by ``change(fields dict)``."""
    out, seen = [], 0
    fields = STEP_FIELDS if kind == "delta" else KEYFRAME_FIELDS
    for o in lines:
        if o.get("type") == kind:
            if seen == index:
                rec = {k: v.copy() for k, v in unpack(fields, record_bytes(o)).items()}
                change(rec)
                o = with_record(o, pack(fields, rec))
            seen += 1
        out.append(o)
    return out


def header_change(lines, **changes):
    return [{**lines[0], **changes}, *lines[1:]]


def pool_change(lines, **changes):
    return header_change(lines, pool={**lines[0]["pool"], **changes})


CASES = {
    "bad base64": (lambda ls: [*ls[:1], {**ls[1], "data": "@@not base64@@"}, *ls[2:]], "not base64"),
    "not zlib": (lambda ls: [*ls[:1], {**ls[1], "data": base64.b64encode(b"plain").decode()}, *ls[2:]], "not zlib"),
    "short record": (lambda ls: [*ls[:3], with_record(ls[3], record_bytes(ls[3])[:-4]), *ls[4:]], "add up to"),
    "unknown version": (lambda ls: header_change(ls, version=6), "version 6"),
    "version true": (lambda ls: header_change(ls, version=True), "version True"),
    "block_size 0": (lambda ls: pool_change(ls, block_size=0), "block_size"),
    "huge pool": (lambda ls: pool_change(ls, num_slots=1 << 40), "num_slots"),
    "unknown allocator": (lambda ls: pool_change(ls, allocator="buddy"), "allocator"),
    "requests 5": (lambda ls: header_change(ls, requests=5), "requests"),
    "config list": (lambda ls: header_change(ls, config=[1]), "config"),
    "other layout": (lambda ls: header_change(ls, record_fields={"step": {"slot_idx": "<i8"}}), "layout"),
    "unknown metric": (lambda ls: header_change(ls, metric_fields=["kv_usage", "bogus"]), "bogus"),
    "metrics 1e400": (lambda ls: [*ls[:3], {**ls[3], "metrics": "1e400"}, *ls[4:]], None),
    "metric string": (lambda ls: [*ls[:3], {**ls[3], "metrics": ["x"] * len(ls[3]["metrics"])}, *ls[4:]], "number"),
    "first keyframe missing": (lambda ls: [ls[0], ls[1], *ls[3:]], "keyframe"),
    "step missing": (lambda ls: [*ls[:4], *ls[5:]], "does not follow"),
    "step not int": (lambda ls: [*ls[:3], {**ls[3], "step": "3"}, *ls[4:]], "integer"),
    "unknown record": (lambda ls: [*ls[:3], {"type": "gossip"}, *ls[3:]], "unknown record type"),
    "end count": (lambda ls: [*ls[:-1], {"type": "end", "steps": 3}], "counts 3"),
    "after end": (lambda ls: [*ls, ls[3]], "after the end"),
    "slot out of range": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r.update(
        slot_idx=np.array([10**6], np.int32), slot_state=np.array([1], np.int8),
        slot_owner=np.array([0], np.int32), slot_token=np.array([5], np.int32))), "out of range"),
    "negative slot": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r.update(
        slot_idx=np.array([-1], np.int32), slot_state=np.array([1], np.int8),
        slot_owner=np.array([0], np.int32), slot_token=np.array([5], np.int32))), "out of range"),
    "values without index": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r.update(
        slot_state=np.array([1, 1, 1], np.int8))), "values for"),
    "bad state code": (lambda ls: corrupt_record(ls, "keyframe", 0, lambda r: r["slot_state"].__setitem__(0, 9)), "codes"),
    "keyframe disagrees": (lambda ls: corrupt_record(ls, "keyframe", 1, lambda r: r["slot_token"].__setitem__(3, 7777)), "disagrees"),
    "table keeps too much": (lambda ls: corrupt_record(ls, "delta", 6, lambda r: r.update(
        tab_pos=np.array([0], np.int32), tab_keep=np.array([10**6], np.int32), tab_len=np.array([0], np.int32),
        tab_tail=np.zeros(0, np.int32))), "keeps more"),
    "events not json": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r.update(events=np.frombuffer(b"{{", np.uint8))), "events"),
    "deep events": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r.update(
        events=np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8))), "deep"),
    "queue lengths": (lambda ls: corrupt_record(ls, "delta", 5, lambda r: r["head"].__setitem__(2, 999)), "queue"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_v2_traces_raise_one_line_trace_errors(tmp_path, burst, case):
    snaps, header = burst
    assert_one_line_error(tmp_path / "bad.jsonl", valid_lines(snaps, header, tmp_path), *CASES[case])


def assert_one_line_error(path, lines, make, fragment) -> None:
    """The trace written from ``make(lines)`` fails to load with a one-line TraceError naming ``fragment``."""
    write_lines(path, make(lines))
    with pytest.raises(TraceError, match=fragment) as info:
        load_recording(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ('{"type":"header","format":"pagedkv-trace","version":1,"x":1e400}\n', "out of range"),
        ('{"type":"header","format":"pagedkv-trace","version":1,"x":NaN}\n', "NaN"),
        ('{"type":"header","format":"pagedkv-trace","version":1,"requests":5}\n', "requests"),
        (b'{"type":"header"}\xff\n', "UTF-8"),
    ],
)
def test_malformed_headers_raise_one_line_trace_errors(tmp_path, text, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TraceError, match=fragment) as info:
        load_recording(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda s: s.update(waiting=5), "waiting|iterable"),
        (lambda s: s.update(block_size=0), "block_size"),
        (lambda s: s.update(slot_state=[9] * len(s["slot_state"])), "codes"),
        (lambda s: s.update(step=7), "does not follow"),
        (lambda s: s.update(events=[{"kind": "x"}]), "events"),
    ],
)
def test_malformed_v1_steps_raise_one_line_trace_errors(tmp_path, burst, change, fragment):
    snaps, header = burst
    steps = [{"type": "step", **s.to_json()} for s in snaps[:3]]
    change(steps[1])
    path = tmp_path / "v1.jsonl"
    write_lines(path, [{"type": "header", "format": "pagedkv-trace", "version": 1, **header}, *steps])
    with pytest.raises(TraceError, match=fragment) as info:
        load_recording(path)
    assert "\n" not in str(info.value)


def test_size_limits_are_checked_before_reading(tmp_path, burst, monkeypatch):
    snaps, header = burst
    path = write_trace(tmp_path / "t.jsonl", snaps[:20], header)
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TraceError, match="more than the 1,000 allowed"):
        load_recording(path)
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 1 << 30)
    monkeypatch.setattr(trace, "MAX_LINE_BYTES", 1000)
    with pytest.raises(TraceError, match="longer than 1,000"):
        load_recording(path)
    monkeypatch.setattr(trace, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(trace, "MAX_RECORD_BYTES", 100)
    with pytest.raises(TraceError, match="larger than 100"):
        load_recording(path)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_recording(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="empty"):
        load_recording(tmp_path / "e.jsonl")


# ---------------------------------------------------------------------------- replay
def counts(slot_state) -> dict:
    return {name: int((slot_state == code).sum()) for code, name in SLOT_STATE_NAMES.items()}


def run_replay(path, *argv):
    """``replay`` through its own parser: the JSON object with --json, else the text."""
    parser = argparse.ArgumentParser()
    replay.register(parser.add_subparsers())
    args = parser.parse_args(["replay", str(path), *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.func(args) == 0
    text = out.getvalue()
    return json.loads(text) if "--json" in argv else text


def test_replay_prints_the_last_step_or_the_one_asked_for(tmp_path, burst):
    snaps, header = burst
    path = write_trace(tmp_path / "t.jsonl", snaps, {**header, "workload": "burst"})
    text = run_replay(path)
    assert f"step                   {len(snaps) - 1}" in text and "paged, 2,048 slots, block size 16" in text
    mid = run_replay(path, "--step", "25", "--json")
    want = snaps[25]
    assert mid["step"] == 25 and mid["allocator"] == "paged" and mid["num_slots"] == 2048
    assert mid["num_steps"] == len(snaps) and mid["workload"] == "burst"
    assert mid["slot_counts"] == counts(want.slot_state) and list(mid["slot_counts"]) == [s.name.lower() for s in SlotState]
    assert mid["metrics"] == want.metrics.to_json() and set(mid["metrics"]) == set(StepMetrics().to_json())
    assert mid["queues"] == {"running": len(want.running), "waiting": len(want.waiting), "swapped": len(want.swapped)}
    assert mid["events"] == [e.to_json() for e in want.events]


def test_replay_refuses_bad_traces_and_steps_with_one_line(tmp_path, burst):
    snaps, header = burst
    path = write_trace(tmp_path / "t.jsonl", snaps[:10], header)
    for argv, fragment in ((["--step", "10"], "steps 0..9"), (["--step", "-1"], "not in")):
        with pytest.raises(ConfigError, match=fragment):
            run_replay(path, *argv)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nonsense\n")
    with pytest.raises(ConfigError, match="not JSON"):
        run_replay(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"type": "header", "format": "pagedkv-trace", "version": 1}) + "\n")
    with pytest.raises(ConfigError, match="no steps"):
        run_replay(empty)


def test_replay_json_answers_mid_run_at_262144_slots(tmp_path):
    """A production-sized pool: the engine streams deltas to the trace, replay rebuilds one
    step in the middle, and its counts match the engine's own snapshot of that step."""
    path = tmp_path / "big.jsonl"
    writer = TraceWriter(path)
    engine = engine_for("trickle", recording=writer, pool_slots=262_144)
    writer.set_header(engine.trace_header())
    want = None
    for step in range(50):
        _, snap = engine.step(snapshot=step == 30)
        want = snap or want
    writer.close()
    assert path.stat().st_size < 2_000_000  # 50 steps of 262,144 slots; full snapshots would be 120 MB
    report = run_replay(path, "--step", "30", "--json")
    assert report["num_slots"] == 262_144 and report["num_steps"] == 50 and report["step"] == 30
    assert report["slot_counts"] == counts(want.slot_state)
    assert report["slot_counts"]["filled"] == want.metrics.filled_slots > 0
    assert report["metrics"] == want.metrics.to_json()


def test_replay_through_the_command_line(tmp_path, burst, capsys):
    from pagedkv_core import cli

    if "replay" not in cli.build_parser()._subparsers._group_actions[0].choices:
        pytest.skip("replay is not registered in pagedkv_core.cli yet")
    snaps, header = burst
    path = write_trace(tmp_path / "t.jsonl", snaps, header)
    assert cli.main(["replay", str(path), "--step", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 3
    assert cli.main(["replay", str(path), "--step", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


# ---------------------------------------------------------------------------- version 3
def gapped_recording() -> Recording:
    """A run with two idle stretches (steps 4-49 and 56-199 repeat the step before them)."""
    engine = Engine(EngineConfig(pool_slots=512, block_size=4), ScriptedSource(), recording=Recording(), skip_idle=True)
    for rid, prompt, out, arrive in (("a", [5, 6, 7, 8], 3, 0), ("b", [9, 10, 11], 2, 50), ("c", [12, 13], 4, 51),
                                     ("d", [14, 15, 16], 2, 200)):
        engine.add_request(rid, prompt, arrival_step=arrive, output_len=out)
    while engine.has_unfinished():
        engine.step(snapshot=False)
    return engine.recording


def test_v3_writes_an_idle_stretch_as_one_line_and_loads_every_step_back(tmp_path):
    rec = gapped_recording()
    path = write_recording(tmp_path / "idle.jsonl", rec, {"workload": "gaps"}, version=3)
    lines = lines_of(path)
    assert lines[0]["version"] == 3 and lines[0]["encoding"] == trace.ENCODING_V3
    idle = [(o["step"], o["steps"]) for o in lines if o["type"] == "idle"]
    # steps 3 and 55 change nothing either, but their metrics say idle_skipped: one-step idle lines
    assert idle == [(3, 1), (4, 46), (55, 1), (56, 144)] and rec.idle_runs() == [(4, 46), (56, 144)]
    assert sum(o["type"] == "delta" for o in lines) == 202 - 48 - 144 and lines[-1] == {"type": "end", "steps": 202}
    _, back = load_recording(path)
    assert back.idle_runs() == rec.idle_runs() and all(back.at(s) == rec.at(s) for s in rec.steps)
    v2 = write_recording(tmp_path / "idle2.jsonl", rec, version=2)  # version 2: a line a step, as it always had
    assert sum(o["type"] == "delta" for o in lines_of(v2)) == 202
    _, back2 = load_recording(v2)
    assert back2.idle_runs() == rec.idle_runs() and all(back2.at(s) == rec.at(s) for s in (0, 3, 4, 30, 49, 50, 150, 201))


def test_v3_is_smaller_than_v2_and_a_cut_trace_loads_to_its_last_whole_line(tmp_path, burst):
    snaps, header = burst
    v2 = write_trace(tmp_path / "v2.jsonl", snaps, header, version=2)
    v3 = write_trace(tmp_path / "v3.jsonl", snaps, header, version=3)
    assert v3.stat().st_size < 0.6 * v2.stat().st_size
    text = v3.read_text()
    v3.write_text(text[: text.index('"type":"delta","step":70') - 30])  # in the middle of step 69's line
    got_header, rec = load_recording(v3)
    assert got_header["truncated"] is True and rec.num_steps == 69 and rec.last() == snaps[68]


def v3_lines(snaps, header, tmp_path) -> list[dict]:
    return lines_of(write_trace(tmp_path / "ok3.jsonl", snaps[:40], header, version=3))


V3_CASES = {
    "bad base64": (lambda ls: [*ls[:3], {**ls[3], "data": "@@"}, *ls[4:]], "not base64"),
    "not deflate": (lambda ls: [*ls[:3], {**ls[3], "data": base64.b64encode(b"\xff\xff\xff\xff").decode()}, *ls[4:]], "deflate"),
    "a delta left out": (lambda ls: [*ls[:3], *ls[4:]], "does not follow|deflate|record"),
    "lines swapped": (lambda ls: [*ls[:3], {**ls[4], "step": 2}, {**ls[3], "step": 3}, *ls[5:]], "record|deflate|out of range|values|ids|keeps"),
    "idle first": (lambda ls: [ls[0], {"type": "idle", "step": 0, "steps": 3, "metrics": ls[1]["metrics"]}, *ls[1:]], "idle run"),
    "idle steps 0": (lambda ls: [*ls[:3], {"type": "idle", "step": 1, "steps": 0, "metrics": ls[3]["metrics"]}], "covers"),
    "idle steps str": (lambda ls: [*ls[:3], {"type": "idle", "step": 1, "steps": "9", "metrics": ls[3]["metrics"]}], "covers"),
    "idle step gap": (lambda ls: [*ls[:3], {"type": "idle", "step": 7, "steps": 2, "metrics": ls[3]["metrics"]}], "does not follow"),
    "idle huge": (lambda ls: [*ls[:3], {"type": "idle", "step": 1, "steps": 1 << 60, "metrics": ls[3]["metrics"]}], "covers"),
    "wrong encoding": (lambda ls: header_change(ls, encoding="zlib+base64"), "encoding"),
}


@pytest.mark.parametrize("case", sorted(V3_CASES))
def test_malformed_v3_traces_raise_one_line_trace_errors(tmp_path, burst, case):
    snaps, header = burst
    assert_one_line_error(tmp_path / "bad3.jsonl", v3_lines(snaps, header, tmp_path), *V3_CASES[case])


# ---------------------------------------------------------------------------- version 4
def test_v4_is_v3_in_frames_smaller_and_a_cut_trace_loads_to_its_last_whole_frame(tmp_path, burst):
    snaps, header = burst
    v3 = write_trace(tmp_path / "v3.jsonl", snaps, header, version=3)
    v4 = write_trace(tmp_path / "v4.trace", snaps, header, version=4)
    assert lines_of(v4)[0]["version"] == 4 and lines_of(v4)[0]["encoding"] == trace.ENCODING_V4
    # the same records, kinds and steps, in the same order (idle runs, keyframes, the end)
    kinds = lambda ls: [(o["type"], o.get("step")) for o in ls[1:]]  # noqa: E731
    assert kinds(lines_of(v4)) == kinds(lines_of(v3))
    assert v4.stat().st_size < 0.75 * v3.stat().st_size
    assert read_trace(v4) == read_trace(v3)
    data = v4.read_bytes()
    head, frames = split_frames(data)
    cut = len(head)
    for kind, payload in frames:
        if kind == b"D" and int.from_bytes(payload[:8], "little") == 69:
            break
        cut += 5 + len(payload)
    for end in (cut + 3, cut + 20):  # in step 69's frame head, in its piece
        v4.write_bytes(data[:end])
        got_header, rec = load_recording(v4)
        assert got_header["truncated"] is True and rec.num_steps == 69 and rec.last() == snaps[68]


def test_v4_keeps_idle_runs(tmp_path):
    rec = gapped_recording()
    path = write_recording(tmp_path / "idle.trace", rec, {"workload": "gaps"})
    idle = [(o["step"], o["steps"]) for o in lines_of(path) if o["type"] == "idle"]
    assert idle == [(3, 1), (4, 46), (55, 1), (56, 144)]
    _, back = load_recording(path)
    assert back.idle_runs() == rec.idle_runs() and all(back.at(s) == rec.at(s) for s in rec.steps)


def test_v4_metrics_round_trip_exactly():
    from pagedkv_core.metrics import StepMetrics
    from pagedkv_core.record.recording import INT_METRICS
    from pagedkv_core.record.trace_frames import MetricsCodec

    rng = np.random.default_rng(5)
    names = trace.METRIC_FIELDS
    writer, reader = MetricsCodec(names, INT_METRICS), MetricsCodec(names, INT_METRICS)
    for i in range(50):
        m = StepMetrics()
        for n in names:
            if n in INT_METRICS:
                setattr(m, n, int(rng.choice([0, 1, -1, (1 << 63) - 1, -(1 << 63), int(rng.integers(-1e9, 1e9))])))
            else:
                setattr(m, n, float(rng.choice([0.0, -0.0, 1e-300, 1e300, rng.random()])))
        if i == 25:
            writer.restart(), reader.restart()
        assert reader.decode(writer.encode(m)) == [getattr(m, n) for n in names]


def v4_bytes(snaps, header, tmp_path) -> bytes:
    return write_trace(tmp_path / "ok4.trace", snaps[:40], header).read_bytes()


def _v4_edit(edit):
    def apply(data: bytes) -> bytes:
        head, frames = split_frames(data)
        return join_frames(head, edit(frames))
    return apply


V4_CASES = {
    "unknown kind": (_v4_edit(lambda fs: [*fs[:3], (b"X", fs[3][1]), *fs[4:]]), "unknown frame kind"),
    "huge length": (lambda d: d + b"D" + (0xFFFFFFFF).to_bytes(4, "little") + b"\0" * 64, "over the"),
    "not deflate": (_v4_edit(lambda fs: [*fs[:3], (b"D", fs[3][1][:8] + b"\xff\xff\xff\xff"), *fs[4:]]), "deflate"),
    "a step left out": (_v4_edit(lambda fs: [*fs[:3], *fs[4:]]), "does not follow|deflate|record|metric"),
    "no step number": (_v4_edit(lambda fs: [*fs[:3], (b"D", b"\1\2"), *fs[4:]]), "no step number"),
    "a wrong JSON frame": (_v4_edit(lambda fs: [*fs[:3], (b"J", b'{"type":"delta","step":2}'), *fs[3:]]), "JSON frame"),
    "JSON frame not JSON": (_v4_edit(lambda fs: [*fs[:3], (b"J", b"{oops"), *fs[3:]]), "not JSON"),
    "JSON frame not UTF-8": (_v4_edit(lambda fs: [*fs[:3], (b"J", b"\xff\xfe"), *fs[3:]]), "UTF-8"),
    "data after the end": (_v4_edit(lambda fs: [*fs, fs[3]]), "after the end"),
    "wrong encoding": (lambda d: d.replace(trace.ENCODING_V4.encode(), trace.ENCODING_V3.encode(), 1), "encoding"),
}


@pytest.mark.parametrize("case", sorted(V4_CASES))
def test_malformed_v4_traces_raise_one_line_trace_errors(tmp_path, burst, case):
    snaps, header = burst
    edit, match = V4_CASES[case]
    path = tmp_path / "bad4.trace"
    path.write_bytes(edit(v4_bytes(snaps, header, tmp_path)))
    with pytest.raises(TraceError, match=match) as info:
        load_recording(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_v4_refuses_a_metric_that_is_not_finite(tmp_path, burst):
    import dataclasses

    snaps, header = burst
    bad = [*snaps[:5], dataclasses.replace(snaps[5], metrics=dataclasses.replace(snaps[5].metrics, kv_usage=float("nan")))]
    path = write_trace(tmp_path / "nan.trace", bad, header)
    with pytest.raises(TraceError, match="kv_usage is nan, not a finite number"):
        load_recording(path)


def test_v3_file_records_round_trip_any_values():
    from pagedkv_core.record.stream_codec import pack_file_record, unpack_file_record

    rng = np.random.default_rng(3)
    for _ in range(30):
        values = {name: rng.integers(np.iinfo(dt).min if dt.kind == "i" else 0, np.iinfo(dt).max, size=int(rng.integers(0, 9)),
                                     dtype=dt, endpoint=True) for name, dt in STEP_FIELDS.items()}
        record = pack(STEP_FIELDS, values)
        assert unpack_file_record(STEP_FIELDS, pack_file_record(STEP_FIELDS, record)) == record


@pytest.mark.parametrize("fields", [STEP_FIELDS, KEYFRAME_FIELDS], ids=["step", "keyframe"])
def test_file_records_pack_the_same_bytes_all_at_once_and_field_by_field(fields, monkeypatch):
    """A small record is packed in one pass over all its fields, a big one field by field: both
    give the same bytes, each field at the narrowest width that holds its stored values."""
    from pagedkv_core.record import stream_codec
    from pagedkv_core.record.stream_codec import DIFF_FIELDS, pack_file_record, unpack_file_record

    rng = np.random.default_rng(11)

    def some(dt, k, span):
        info = np.iinfo(dt)
        lo, hi = (max(info.min, -span), min(info.max, span)) if span else (info.min, info.max)
        return rng.integers(lo, hi, size=k, dtype=dt, endpoint=True)

    for case in range(400):
        span = [0, 100, 40_000, 3_000_000_000][case % 4]
        values = {name: some(dt, int(rng.integers(0, 12)) * (rng.random() < 0.6), span) for name, dt in fields.items()}
        record = pack(fields, values)
        before = None
        if fields is STEP_FIELDS and case % 3:
            before = {name: some(fields[name], len(values[name]), span) for name in DIFF_FIELDS}
        monkeypatch.setattr(stream_codec, "ALL_AT_ONCE_VALUES", 1 << 14)
        once = pack_file_record(fields, record, before)
        monkeypatch.setattr(stream_codec, "ALL_AT_ONCE_VALUES", -1)
        assert pack_file_record(fields, record, before) == once
        if before is None:
            assert unpack_file_record(fields, once) == record
            head = (4 * len(fields) + 7) // 8 * 8
            widths = np.frombuffer(once, dtype=np.uint8, offset=head, count=len(fields))
            for (name, dt), w in zip(fields.items(), widths.tolist()):
                a = values[name].astype(np.int64)
                if name in stream_codec.DELTA_FIELDS and len(a):
                    a = np.diff(a, prepend=0)
                    a = (a + 2**31) % 2**32 - 2**31 if dt.itemsize == 4 else a
                fits = [k for k in (1, 2, 4, 8) if not len(a) or -(2 ** (8 * k - 1)) <= a.min() <= a.max() < 2 ** (8 * k - 1)]
                assert w == min(fits[0], dt.itemsize) if len(a) else w == dt.itemsize, name
