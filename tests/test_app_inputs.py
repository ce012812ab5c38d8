"""Every kind of app input, bad: the URL's parameters, the two uploads (workload files and traces)
and the sidebar's widgets. Each gets an error (or, for a request of a workload that breaks a
request-level bound, a warning that names the request and the reason, while the others run), on
one line, and the page carries on: no exception element, ever.

The uploads go through AppTest's own file_uploader (``set_value`` with the file's bytes), so they
take the same path as a browser's. Widgets are set through AppTest too; Streamlit itself clamps a
number outside a widget's bounds, so the cases that reach our code are the ones the bounds allow.
"""
from __future__ import annotations

import gzip
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.trace_file import write_trace
from pagedkv_core.workloads.scenarios import build_workload
from tests.apptest import app, open_page, uploader

POOL_PAGE = "pages/reserve_or_page.py"


@dataclass(frozen=True)
class Case:
    name: str
    fragment: str  # what the message must say
    query: dict = field(default_factory=dict)  # URL parameters
    upload: tuple | None = None  # (uploader key, file name, bytes)
    widgets: tuple = ()  # (kind, key, value) set in turn on the pool page
    kind: str = "error"  # or "warning": a rejected request of a workload that runs
    page: str = POOL_PAGE


def messages(at, kind: str) -> list[str]:
    return [e.value for e in getattr(at, kind)]


def run(case: Case):
    """The case's input on its page; returns the AppTest after the input's run and the messages
    of the case's kind. A URL is read on the first run (the home page: it is read once per
    session, wherever it lands), then the page must still draw."""
    if case.query:
        at = app(**case.query).run()
        assert not at.exception, [e.value for e in at.exception]
        first = messages(at, case.kind)
        at.switch_page(case.page).run()
        assert not at.exception, [e.value for e in at.exception]
        return at, first + messages(at, case.kind)
    at = open_page(case.page)
    if case.upload is not None:
        key, name, data = case.upload
        uploader(at, key).set_value((name, data, "application/octet-stream")).run()
    for kind, key, value in case.widgets:
        getattr(at, kind)(key=key).set_value(value).run()
        assert not at.exception, [e.value for e in at.exception]
    return at, messages(at, case.kind)


# ---------------------------------------------------------------------------- files to upload
def _v1_trace(step_edit=None, header_edit=None) -> bytes:
    """A two-step version-1 trace (one full snapshot a line); ``step_edit`` edits the first step
    (returning the object, or the line's text), ``header_edit`` the header."""
    engine = Engine(EngineConfig(allocator="paged", block_size=8, pool_slots=256), ScriptedSource())
    build_workload("burst").submit(engine)
    snaps = [engine.step()[1] for _ in range(2)]
    with tempfile.TemporaryDirectory() as d:
        lines = write_trace(Path(d) / "t.jsonl", snaps, engine.trace_header(), version=1).read_text().splitlines()
    header, step = json.loads(lines[0]), json.loads(lines[1])
    if header_edit:
        header_edit(header)
    edited = step_edit(step) if step_edit else step
    text = edited if isinstance(edited, str) else json.dumps(edited)  # a str: the line's text as it is
    return "\n".join([json.dumps(header), text, *lines[2:]]).encode() + b"\n"


def _setting(key, value):
    def edit(obj):
        obj[key] = value
        return obj
    return edit


def _request(**fields) -> dict:
    return {"id": "a", "prompt_len": 10, "output_len": 4, "max_tokens": 8, **fields}


def _workload(*requests) -> bytes:
    return json.dumps(list(requests)).encode()


DEEP = b"[" * 100_000 + b"]" * 100_000
HEADER = _v1_trace().split(b"\n")[0]
CSV_HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"


def trace(name: str, data: bytes) -> tuple:
    return ("trace_upload", name, data)


def workload(name: str, data: bytes) -> tuple:
    return ("workload_upload", name, data)


CASES = [
    # ------------------------------------------------------------------ the URL
    Case("url guide_step superscript two", "URL parameter guide_step: must be a whole number from 1, got '²'",
         query={"guide": "on", "guide_step": "²"}),
    Case("url guide_step zero", "guide_step: must be a whole number from 1, got '0'", query={"guide_step": "0"}),
    Case("url guide_step huge", "guide_step: must be a whole number from 1", query={"guide_step": "9" * 5000}),
    Case("url guide not a switch", "URL parameter guide: must be on or off, got 'maybe'", query={"guide": "maybe"}),
    Case("url speed 0", "URL parameter speed: must be a whole number of steps per second from 1 to 50, got '0'; "
         "Play starts at 10 steps/s", query={"speed": "0"}),
    Case("url speed 51", "speed: must be a whole number of steps per second from 1 to 50, got '51'",
         query={"speed": "51"}),
    Case("url speed superscript", "speed: must be a whole number of steps per second", query={"speed": "²"}),
    Case("url present not a switch", "URL parameter present: must be on or off", query={"present": "¹"}),
    Case("url pool_slots 10**9", "pool_slots must be <= 1,048,576, got 1,000,000,000", query={"pool_slots": "1000000000"}),
    Case("url pool_slots words", "pool_slots: must be a whole number, got 'lots'", query={"pool_slots": "lots"}),
    Case("url block_size 0", "block_size: must be one of 1, 2, 4", query={"block_size": "0"}),
    Case("url swap_slots 1e400", "swap_slots: must be a whole number, got '1e400'", query={"swap_slots": "1e400"}),
    Case("url watermark nan", "watermark must be a number in [0, 1), got nan", query={"watermark": "nan"}),
    Case("url watermark inf", "watermark must be a number in [0, 1), got inf", query={"watermark": "inf"}),
    Case("url seed negative", "seed must be >= 0, got -1", query={"seed": "-1"}),
    Case("url seed superscript", "seed: must be a whole number, got '²'", query={"seed": "²"}),
    Case("url preemption", "preemption", query={"preemption": "teleport"}),
    Case("url prefix_caching", "prefix_caching: must be on or off", query={"prefix_caching": "sometimes"}),
    Case("url workload", "workload: must be one of", query={"workload": "../../etc/passwd"}),
    Case("url source", "source: must be one of scripted, model", query={"source": "gpu"}),
    Case("url contiguous_policy", "contiguous_policy: must be one of max, pow2, oracle",
         query={"contiguous_policy": "best"}),
    # ------------------------------------------------------------------ uploaded traces
    Case("trace nested 10**5 deep", "deep.jsonl:2: JSON nested too deeply",
         upload=trace("deep.jsonl", HEADER + b"\n" + DEEP + b"\n")),
    Case("trace waiting 5", "field waiting must be a list of sequence ids (integers), got 5",
         upload=trace("w.jsonl", _v1_trace(_setting("waiting", 5)))),
    Case("trace waiting [null]", "field waiting must be a list of sequence ids (integers), got [None]",
         upload=trace("w.jsonl", _v1_trace(_setting("waiting", [None])))),
    Case("trace waiting 5 still one line", "Cannot replay w.jsonl: w.jsonl:2: ",
         upload=trace("w.jsonl", _v1_trace(_setting("waiting", 5)))),
    Case("trace waiting [null] still one line", "Cannot replay w.jsonl: w.jsonl:2: ",
         upload=trace("w.jsonl", _v1_trace(_setting("waiting", [None])))),
    Case("trace number 1e400", "number 1e400 is out of range",
         upload=trace("n.jsonl", _v1_trace(lambda s: json.dumps(s).replace('"step": 0', '"step": 1e400', 1)))),
    Case("trace step block_size 0", "block_size must be an integer in [1, 1,024], got 0",
         upload=trace("b.jsonl", _v1_trace(_setting("block_size", 0)))),
    Case("trace header block_size 0", "its config is invalid (block_size must be >= 1, got 0)",
         upload=trace("b.jsonl", _v1_trace(header_edit=lambda h: h["config"].__setitem__("block_size", 0)))),
    Case("trace header requests 5", "header requests must be a list of objects",
         upload=trace("r.jsonl", _v1_trace(header_edit=lambda h: h.__setitem__("requests", 5)))),
    Case("trace empty", "empty.jsonl is empty, not a pagedkv trace", upload=trace("empty.jsonl", b"")),
    Case("trace binary", "bin.jsonl:1: not JSON", upload=trace("bin.jsonl", bytes(range(256)) * 8)),
    Case("trace header only", "Cannot replay h.jsonl: ", upload=trace("h.jsonl", HEADER + b"\n")),
    # ------------------------------------------------------------------ uploaded workloads
    Case("workload deep JSON", "deep.json: JSON nested more than 8 deep", upload=workload("deep.json", DEEP)),
    Case("workload prompt_len 10**9", "Every request in p.json is rejected: 'a': prompt_len must be <= 1,048,576",
         upload=workload("p.json", _workload(_request(prompt_len=10**9))), kind="warning"),
    Case("workload n 40000", "'a': n must be <= 256, got 40,000",
         upload=workload("n.json", _workload(_request(n=40000))), kind="warning"),
    Case("workload token 2**31", "'a': prompt token id 2,147,483,648 is over the bound of 2,147,483,646",
         upload=workload("t.json", _workload({"id": "a", "prompt": [5, 2**31], "output_len": 4, "max_tokens": 8})),
         kind="warning"),
    Case("workload one bad request of two", "1 of 2 requests in m.json are rejected (the others run): 'big'",
         upload=workload("m.json", _workload(_request(id="big", output_len=10**12), _request(id="ok"))),
         kind="warning"),
    Case("workload lone surrogate id", "string '\\ud800' is not valid Unicode",
         upload=workload("s.json", b'[{"id": "\\ud800", "prompt_len": 10, "output_len": 4, "max_tokens": 8}]')),
    Case("workload not a list", "a workload must be a JSON list of requests, got dict",
         upload=workload("o.json", b'{"requests": 5}')),
    Case("workload 1e400", "1e400", upload=workload("e.json", b'[{"id": "a", "prompt_len": 1e400}]')),
    Case("workload empty", "empty.json is not valid JSON", upload=workload("empty.json", b"")),
    Case("workload CSV without the columns", "missing column(s) TIMESTAMP", upload=workload("bad.csv", b"a,b\n1,2\n")),
    Case("workload CSV 1e400 tokens", "ContextTokens must be a whole number >= 1, got '1e400'",
         upload=workload("x.csv", CSV_HEADER + b"2023-11-16 18:15:46.6805900,1e400,10\n")),
    Case("workload gzip that is not", "t.csv.gz: cannot read the request log", upload=workload("t.csv.gz", b"notgzip")),
    Case("workload gzip bomb of rows", "no requests after row",
         upload=workload("z.csv.gz", gzip.compress(CSV_HEADER + b"2023-11-16 18:15:46.6805900,5,5\n")),
         widgets=(("number_input", "csv_start", 10**12),)),
    Case("workload JSONL bad line", "h.jsonl line 2: hash_ids has 1 ids, but input_length 600 is 2 blocks",
         upload=workload("h.jsonl", b'{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
                                    b'{"timestamp": 9, "input_length": 600, "output_length": 2, "hash_ids": [1]}\n')),
    Case("workload JSONL block size that splits its hash blocks", "block size 64 does not divide the log's "
         "32-token hash blocks", upload=workload("s.jsonl", b'{"timestamp": 0, "input_length": 600, "output_length": '
                                                           b'2, "hash_ids": [1, 2]}\n'),
         widgets=(("select_slider", "hash_length_scale", "1/16"), ("select_slider", "block_size", 64))),
    # ------------------------------------------------------------------ widgets
    Case("widget pool below one block", "pool_slots must hold at least one block of 128 slots",
         widgets=(("select_slider", "block_size", 128), ("number_input", "pool_slots", 100))),
    Case("widget pool over the bound", "pool_slots must hold at least one block",
         widgets=(("number_input", "pool_slots", 10**9),)),  # Streamlit resets it to the minimum, 1
    Case("widget model path to a system file", "model file '/etc/shadow' is not a .gguf file",
         widgets=(("text_input", "model_path", "/etc/shadow"), ("radio", "source", "model"))),
    # ------------------------------------------------------------------ real-model pools over the budget
    Case("live pair pool over the budget", "the two real-model KV pools (1,048,576 device slots each",
         query={"pool_slots": "1048576", "source": "model"}),
    Case("live engine pool over the budget", "a real-model KV pool of 1,048,576 slots",
         query={"pool_slots": "1048576"}, page="pages/live_engine.py"),
    Case("prefix sharing pool over the budget", "a real-model KV pool of 1,048,576 slots",
         query={"pool_slots": "1048576"}, page="pages/prefix_sharing.py"),
]


def _id(case) -> str:
    return (case.values[0] if hasattr(case, "values") else case).name


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bad_input_gives_a_one_line_message_and_the_page_carries_on(case):
    at, shown = run(case)
    assert not at.exception, [e.value for e in at.exception]
    assert any(case.fragment in m for m in shown), shown
    for m in messages(at, "error") + messages(at, "warning") + shown:
        assert "\n" not in m.strip() and "Traceback" not in m, m


def test_a_lagging_browsers_stale_slider_does_not_stall_play():
    """A browser slower than the ticks sends each fragment rerun with the slider where an earlier
    tick put it: the last frame is sent again (one frame in flight, ui/player.py), never an
    earlier one, and play goes on once the browser has drawn it. A drag to a step not drawn is the
    student's."""
    at = open_page(POOL_PAGE)
    at.button(key="rop_play").click().run()
    ticks = []
    for _ in range(3):
        at.run()  # a tick of the fragment's timer
        ticks.append(at.slider(key="rop_step").value)
    assert ticks == sorted(set(ticks)), ticks
    at.slider(key="rop_step").set_value(ticks[0]).run()  # the echo of the first tick arrives late
    assert not at.exception and at.slider(key="rop_step").value == ticks[-1]  # held, not sent back
    at.run()  # the browser has drawn the last frame: the next one
    assert at.slider(key="rop_step").value > ticks[-1]
    ticks.append(at.slider(key="rop_step").value)
    at.slider(key="rop_step").set_value(ticks[-1] + 200).run()  # a drag while playing: play goes on from there
    assert at.slider(key="rop_step").value == ticks[-1] + 200
    at.run()
    assert at.slider(key="rop_step").value > ticks[-1] + 200


def test_a_link_sets_the_players_speed():
    """``?speed=1`` (a projector link at one step a second) is the Speed control's first value."""
    at = open_page(POOL_PAGE, speed="1")
    assert [sl.value for sl in at.select_slider if sl.label == "Speed"] == [1]
    assert [sl.value for sl in open_page(POOL_PAGE).select_slider if sl.label == "Speed"] == [10]
