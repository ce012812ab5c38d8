"""Malformed files never escape as anything but their one-line error.

Hypothesis mutates valid workload files, prompts files and traces: a field deleted or replaced
by a wrong type, null, a huge or negative number, a string for a number, a deep nesting, NaN,
Infinity, 1e400, a 5,000-digit integer, a lone surrogate, garbage record data. Reading one must
either succeed (and a workload then runs) or raise ConfigError / TraceError with one line:
never a RecursionError, a UnicodeEncodeError, an OverflowError, a numpy error or a hang.
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagedkv_core.cli.generate import load_prompts
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine, kept_request_id
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.trace_file import TraceError, TraceWriter, load_recording
from pagedkv_core.record.trace_frames import join_frames, split_frames
from pagedkv_core.workloads.scenarios import parse_workload, workload_from_bytes

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EXAMPLES = int(os.environ.get("PAGEDKV_MALFORMED_EXAMPLES", "300"))  # per file kind; more for a soak run


class Raw(str):
    """Text that goes into the JSON as it is (not valid JSON on its own terms, or too deep to build)."""


RAW = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"), Raw("9" * 5000),
       Raw('"\\ud800"'), Raw('"\\udfff x"'), Raw("[" * 5000 + "]" * 5000), Raw("[" * 100_000 + "]" * 100_000),
       Raw('{"a":' * 3000 + "1" + "}" * 3000), Raw("[1,]"), Raw("{"), Raw("")]
NUMBERS = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63, 10**12, 10**30, -(10**30), 0.5, 1e300, -0.0])
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=6), st.sampled_from(["5", "", "nan", "1e400", "\ud800"]))
VALUES = st.one_of(
    st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                 max_leaves=12),
    st.sampled_from(RAW),
)


def dumps(obj) -> str:
    """JSON text of ``obj``, with every :class:`Raw` spliced in as it is."""
    raws: list[str] = []

    def mark(o):
        if isinstance(o, Raw):
            raws.append(o)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(o, dict):
            return {k: mark(v) for k, v in o.items()}
        if isinstance(o, list):
            return [mark(v) for v in o]
        return o

    text = json.dumps(mark(obj), ensure_ascii=True, allow_nan=True)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"@@raw{i}@@"), raw)
    return text


@st.composite
def mutated(draw, base):
    """``base`` (a JSON-like tree) with one to three spots changed: a value replaced, a key
    deleted or added, or the whole of it replaced."""
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 9)) == 0:
            doc = draw(VALUES)
            continue
        node, path = doc, []
        while isinstance(node, (dict, list)) and node and draw(st.integers(0, 3)):  # mostly down to a leaf
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
            path.append(key)
            node = node[key]
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if not path:
            if isinstance(doc, dict):
                doc[draw(st.sampled_from(["id", "prompt", "n", "x", "type", "requests"]))] = draw(VALUES)
            continue
        action = draw(st.sampled_from(["replace", "replace", "number", "number", "delete"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "number":  # the right type, maybe the wrong size: a bound, not the shape
            parent[path[-1]] = draw(st.one_of(NUMBERS, st.integers(-5, 2**40)))
        else:
            parent[path[-1]] = draw(VALUES)
    return doc


def one_line(exc: Exception) -> None:
    message = str(exc)
    assert message and "\n" not in message, repr(message)
    event(f"{type(exc).__name__}: {message[:60]}")  # see --hypothesis-show-statistics


# ---------------------------------------------------------------------------- workloads
WORKLOAD = [
    {"id": "a", "prompt": [5, 6, 7, 8, 5, 6, 7, 8, 9], "output_len": 4, "max_tokens": 6, "n": 2},
    {"id": "b", "prompt_len": 5, "output_len": 3, "max_tokens": 4, "arrival_step": 1},
    {"id": "c", "prompt_len": 12, "output_len": 9, "max_tokens": 9},
]


def run_small(workload) -> None:
    """A workload that parsed runs on a small engine: every request finishes or is rejected."""
    if any(len(r.prompt) > 4096 or r.output_len > 64 or r.arrival_step > 64 for r in workload.requests):
        return  # valid, but long to run: parsing it was the point
    engine = Engine(EngineConfig(pool_slots=256, block_size=4), ScriptedSource())
    workload.submit(engine)
    summary = engine.run(max_steps=2000)
    assert summary.finished + len(summary.rejected) == summary.requests == len(workload.requests)
    rejected = {r["id"] for r in summary.rejected}
    # an id that is not valid UTF-8 is reported escaped (kept_request_id)
    assert {kept_request_id(r.id) for r in workload.requests if r.reject_reason is not None} <= rejected


def test_a_rejected_request_whose_id_is_not_utf8_is_reported_under_its_escaped_id():
    """Found by the fuzzing below: a request with a lone surrogate in its id and a bad field."""
    workload = parse_workload([{"id": "\ud800", "prompt": [5, 6, 7], "output_len": 4, "max_tokens": 0},
                               {"id": "b", "prompt_len": 5, "output_len": 3, "max_tokens": 4}], "w.json")
    assert workload.requests[0].reject_reason is not None
    run_small(workload)
    engine = Engine(EngineConfig(pool_slots=256, block_size=4), ScriptedSource())
    workload.submit(engine)
    summary = engine.run(max_steps=100)
    assert [r["id"] for r in summary.rejected] == ["\\ud800"] and summary.finished == 1


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(doc=mutated(WORKLOAD))
def test_malformed_workload_json_is_a_config_error(doc):
    text = dumps(doc)
    try:
        workload = workload_from_bytes(text.encode("utf-8", "surrogatepass"), "w.json")
    except ConfigError as exc:
        one_line(exc)
        return
    event(f"parsed, {sum(r.reject_reason is not None for r in workload.requests)} rejected")
    run_small(workload)


@settings(max_examples=max(1, EXAMPLES // 3), **SETTINGS)
@given(doc=mutated(WORKLOAD))
def test_malformed_decoded_workloads_are_a_config_error(doc):
    """The same through parse_workload on data decoded elsewhere (the app's own json.loads)."""
    try:
        data = json.loads(dumps(doc))
    except (ValueError, RecursionError):
        return  # not JSON at all: the file path above covers it
    try:
        workload = parse_workload(data, "w.json")
    except ConfigError as exc:
        one_line(exc)
        return
    run_small(workload)


@pytest.mark.parametrize("field, value, reason", [
    ("output_len", -1, "output_len must be >= 1, got -1"),
    ("prompt_len", -3, "prompt_len must be >= 1, got -3"),
    ("prompt", [1, -2], "prompt token ids must be >= 0, got -2"),
    ("n", 0, "n must be >= 1, got 0"),
    ("n", 257, "n must be <= 256, got 257"),
    ("prompt_len", 2**20 + 1, "prompt_len must be <= 1,048,576, got 1,048,577"),
    ("arrival_step", 1_000_001, "arrival_step must be <= 1,000,000, got 1,000,001"),
    ("max_tokens", 0, "max_tokens must be >= 1, got 0"),
])
def test_a_value_out_of_bounds_rejects_only_its_request(field, value, reason):
    bad = {"id": "bad", "prompt_len": 5, "output_len": 3, "max_tokens": 4}
    if field == "prompt":
        del bad["prompt_len"]
    w = parse_workload([{**bad, field: value}, {"id": "ok", "prompt": [7, 8], "output_len": 2, "max_tokens": 2}], "w.json")
    assert [(r.id, r.reject_reason) for r in w.requests] == [("bad", reason), ("ok", None)]
    engine = Engine(EngineConfig(pool_slots=64, block_size=4), ScriptedSource())
    w.submit(engine)
    s = engine.run()
    assert s.rejected == [{"id": "bad", "reason": reason}] and s.finished == 1 and s.tokens_generated == 2


def test_a_lone_surrogate_id_decoded_elsewhere_is_the_engines_rejection():
    w = parse_workload([{"id": "\ud800", "prompt_len": 4, "output_len": 2, "max_tokens": 2}], "w.json")
    engine = Engine(EngineConfig(pool_slots=64, block_size=4), ScriptedSource())
    w.submit(engine)
    assert engine.run().rejected == [{"id": "\\ud800", "reason": "request id is not valid UTF-8"}]


# ---------------------------------------------------------------------------- prompts files
@settings(max_examples=max(1, EXAMPLES // 3), **SETTINGS)
@given(doc=mutated(["What is the capital of France?", {"prompt": "Why is the sky blue?", "max_tokens": 5}]))
def test_malformed_prompts_files_are_a_config_error(doc):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.json"
        path.write_bytes(dumps(doc).encode("utf-8", "surrogatepass"))
        try:
            items = load_prompts(str(path))
        except ConfigError as exc:
            one_line(exc)
            return
    assert items and all(isinstance(p, str) and (m is None or m >= 1) for p, m in items)


# ---------------------------------------------------------------------------- traces
def small_trace(version: int) -> bytes:
    """A small real trace (a fork, a cache hit, a later arrival), as written in ``version``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.trace"
        writer = TraceWriter(path, {"workload": "w"}, keyframe_every=2, version=version)
        engine = Engine(EngineConfig(pool_slots=64, block_size=4), ScriptedSource(), recording=writer)
        parse_workload(WORKLOAD, "w").submit(engine)
        writer.set_header(engine.trace_header())
        while engine.has_unfinished():
            engine.step(snapshot=False)
        writer.close()
        return path.read_bytes()


@lru_cache(maxsize=1)
def trace_lines() -> tuple[dict, ...]:
    """The small trace in version 3 (text lines, edited below), as its decoded lines."""
    return tuple(json.loads(line) for line in small_trace(3).decode("utf-8").splitlines())


@lru_cache(maxsize=1)
def trace_v4() -> tuple[bytes, tuple[tuple[bytes, bytes], ...]]:
    """The same run as a version-4 trace: (its header line, its frames as (kind, payload))."""
    head, frames = split_frames(small_trace(4))
    return head, tuple(frames)


def garbage_data(data: st.DataObject) -> str:
    kind = data.draw(st.sampled_from(["base64", "zlib", "bytes", "flip"]))
    raw = data.draw(st.binary(max_size=64))
    if kind == "base64":
        return data.draw(st.text(max_size=20))
    if kind == "zlib":
        return base64.b64encode(raw).decode()
    if kind == "bytes":
        return base64.b64encode(zlib.compress(raw)).decode()
    return raw.hex()


def load(lines: list[str]):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
        return load_recording(path)


def test_the_unmutated_trace_loads():
    header, rec = load([json.dumps(line) for line in trace_lines()])
    assert rec.num_steps > 3 and header["workload"] == "w"


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_malformed_traces_are_a_trace_error(data):
    lines = [dict(line) for line in trace_lines()]
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    how = data.draw(st.sampled_from(["mutate", "mutate", "data", "cut", "drop", "swap"]), label="how")
    text = [json.dumps(line) for line in lines]
    if how == "mutate":
        text[i] = dumps(data.draw(mutated(lines[i]), label="line content"))
    elif how == "data" and "data" in lines[i]:
        text[i] = json.dumps({**lines[i], "data": garbage_data(data)})
    elif how == "cut":
        text[i] = text[i][: data.draw(st.integers(0, len(text[i])), label="cut at")]
    elif how == "drop":
        del text[i]
    elif how == "swap" and i + 1 < len(text):
        text[i], text[i + 1] = text[i + 1], text[i]
    try:
        load(text)
        event("loaded")
    except TraceError as exc:
        one_line(exc)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_malformed_v4_traces_are_a_trace_error(data):
    """Version 4's binary frames, mutated: a byte flipped, a frame cut, dropped or two swapped,
    bytes inserted. Each either loads or fails with a one-line TraceError."""
    import struct

    head, frames = trace_v4()
    frames = list(frames)
    i = data.draw(st.integers(0, len(frames) - 1), label="frame")
    how = data.draw(st.sampled_from(["flip", "flip", "cut", "drop", "swap", "insert", "length"]), label="how")
    kind, payload = frames[i]
    if how == "flip" and payload:
        at = data.draw(st.integers(0, len(payload) - 1), label="byte")
        payload = payload[:at] + bytes([payload[at] ^ data.draw(st.integers(1, 255), label="xor")]) + payload[at + 1:]
        frames[i] = (kind, payload)
    elif how == "cut":
        frames[i] = (kind, payload[: data.draw(st.integers(0, len(payload)), label="cut at")])
    elif how == "drop":
        del frames[i]
    elif how == "swap" and i + 1 < len(frames):
        frames[i], frames[i + 1] = frames[i + 1], frames[i]
    elif how == "insert":
        frames.insert(i, (data.draw(st.sampled_from([b"D", b"K", b"J", b"X"])), data.draw(st.binary(max_size=40))))
    raw = join_frames(head, frames)
    if how == "length":  # a frame's length field itself changed
        at = len(head) + sum(5 + len(p) for _, p in frames[:i]) + 1
        raw = raw[:at] + struct.pack("<I", data.draw(st.integers(0, (1 << 32) - 1))) + raw[at + 4:]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.trace"
        path.write_bytes(raw)
        try:
            load_recording(path)
            event("loaded")
        except TraceError as exc:
            one_line(exc)
