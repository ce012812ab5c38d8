"""A trace written by a process of its own (pagedkv_core/record/trace_process.py): the same file
byte for byte as the in-process writer's, errors as one line, and a parent that dies leaves a
trace that loads up to what it sent."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_core.cli.parsing import run_command
from pagedkv_core.cli.simulate import _listed
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record import trace_process
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.record.trace_file import TraceWriter, load_recording
from pagedkv_core.record.trace_process import TraceWriterError, TraceWriterProcess, open_trace_writer
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import LogStream, build_workload, stream_workload_file

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "pagedkv_core" / "data" / "azure_conv_2023.csv"
MOONCAKE = ROOT / "pagedkv_core" / "data" / "mooncake_fast25" / "conversation_trace.jsonl"

pytestmark = pytest.mark.skipif(not trace_process.can_fork(), reason="the trace writer process needs fork")


class Tee:
    """Every call the engine and the CLI make of a trace writer, to two of them."""

    def __init__(self, *writers):
        self.writers = writers

    def __getattr__(self, name):
        def both(*args, **kwargs):
            return [getattr(w, name)(*args, **kwargs) for w in self.writers]
        return both


class Forks:
    """Requests of three samples each: a prefill forked three ways, copy-on-write on the shared last block."""

    def submit(self, engine) -> None:
        for i in range(6):
            prompt = [(7 * i + j) % 40000 + 3 for j in range(21 + 5 * i)]
            engine.add_request(f"f{i}", prompt, SamplingParams(max_tokens=40, n=3), arrival_step=3 * i, output_len=30 + i)


def _run_into(tmp_path: Path, config: EngineConfig, workload, name: str, coalesce: bool = False) -> tuple[Path, Path]:
    here, there = tmp_path / f"{name}-inline.trace", tmp_path / f"{name}-process.trace"
    inline, child = TraceWriter(here, {"workload": name}), TraceWriterProcess(there, {"workload": name})
    tee = Tee(inline, child)
    try:
        engine = Engine(config, ScriptedSource(), recording=tee, snapshots=False, skip_idle=True, coalesce=coalesce)
        if isinstance(workload, LogStream):
            engine.feed(_listed(workload.requests(), tee))
        else:
            workload.submit(engine)
        tee.set_header(engine.trace_header())
        while engine.has_unfinished():
            engine.step(snapshot=False, outputs=False)
    finally:
        tee.close({"note": "tee"})
    return here, there


@pytest.mark.parametrize("name, config, make", [
    # a load spike preempted by swap on a small pool (46 swaps out and in)
    ("burst-swap", EngineConfig(pool_slots=512, preemption="swap", swap_slots=1024),
     lambda: build_workload("burst", 0)),
    # a shared system prompt: prefix-cache hits, and preemption by recompute
    ("shared-preamble", EngineConfig(pool_slots=2048), lambda: build_workload("shared_preamble", 0)),
    # a streamed request log: requests listed in their steps, idle stretches as runs
    ("azure-stream", EngineConfig(pool_slots=32768),
     lambda: stream_workload_file(AZURE, 0, count=120, max_tokens="answer")),
    # a hashed log: prefix-cache blocks stored and evicted, block size 32
    ("mooncake-stream", EngineConfig(pool_slots=8192, block_size=32),
     lambda: stream_workload_file(MOONCAKE, 0, count=60, length_scale=1 / 16)),
    ("forks", EngineConfig(pool_slots=1024), Forks),
    ("contiguous", EngineConfig(pool_slots=2048, allocator="contiguous"), lambda: build_workload("explainer40", 0)),
])
@pytest.mark.parametrize("coalesce", [False, True], ids=["steps", "decode-runs"])
def test_the_child_writes_the_in_process_writers_file_byte_for_byte(tmp_path, name, config, make, coalesce):
    here, there = _run_into(tmp_path, config, make(), name, coalesce)
    assert here.read_bytes() == there.read_bytes()
    header, recording = load_recording(there)
    assert not header.get("truncated") and header["note"] == "tee"
    assert recording.num_steps >= 50


def test_a_file_that_cannot_be_created_fails_in_the_constructor(tmp_path):
    with pytest.raises(OSError) as err:
        TraceWriterProcess(tmp_path / "no-such-folder" / "run.trace")
    assert "No such file or directory" in str(err.value)


def _record_steps(writer, steps: int = 40) -> Engine:
    engine = Engine(EngineConfig(pool_slots=2048), ScriptedSource(), recording=writer, snapshots=False)
    build_workload("explainer40", 0).submit(engine)
    for _ in range(steps):
        engine.step(snapshot=False, outputs=False)
    return engine


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full to fail a write")
def test_a_write_that_fails_is_one_line_and_the_run_is_not_left_waiting():
    writer = TraceWriterProcess("/dev/full")
    with pytest.raises(TraceWriterError) as err:
        _record_steps(writer, 400)  # the child's writes fail once its buffer goes out
        writer.close()
    message = str(err.value)
    assert message.startswith("writing the trace failed:") and "No space left on device" in message
    assert "\n" not in message
    assert writer.close() == writer.path  # closed already: nothing more to do
    assert not writer._child.is_alive()


def test_the_cli_reports_a_failed_trace_write_in_one_line(capsys):
    def failing():
        raise TraceWriterError("writing the trace failed: [Errno 28] No space left on device")

    assert run_command(failing) == 1
    assert capsys.readouterr().err == "error: writing the trace failed: [Errno 28] No space left on device\n"


def test_a_parent_that_never_closes_leaves_a_trace_that_loads_up_to_what_it_sent(tmp_path):
    path = tmp_path / "cut.trace"
    writer = TraceWriterProcess(path)
    engine = _record_steps(writer, 40)
    writer.flush()  # everything so far is sent
    engine.step(snapshot=False, outputs=False)  # one more step, still in this process's batch
    writer._abandon()  # as if this process died: the pipe closes without a close message
    header, recording = load_recording(path)
    assert header["truncated"] is True
    assert recording.num_steps == 40


def test_the_child_ignores_ctrl_c(tmp_path):
    path = tmp_path / "interrupted.trace"
    writer = TraceWriterProcess(path)
    _record_steps(writer, 20)
    writer.flush()
    os.kill(writer._child.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the whole group
    writer.close()
    header, recording = load_recording(path)
    assert not header.get("truncated") and recording.num_steps == 20


def test_one_core_writes_in_process(monkeypatch, tmp_path):
    monkeypatch.setattr(trace_process, "usable_cores", lambda: 1)
    writer = open_trace_writer(tmp_path / "one.trace")
    assert isinstance(writer, TraceWriter)
    writer.close()
    monkeypatch.setattr(trace_process, "usable_cores", lambda: 2)
    writer = open_trace_writer(tmp_path / "two.trace")
    assert isinstance(writer, TraceWriterProcess)
    writer.close()


def test_simulate_writes_its_trace_through_the_child_and_prints_nothing_twice(tmp_path):
    trace = tmp_path / "sim.trace"
    done = subprocess.run([sys.executable, "-m", "pagedkv_core", "simulate", "--workload", "burst", "--pool-slots", "512",
                           "--trace-out", str(trace), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stderr == ""  # one JSON line, printed once
    header, recording = load_recording(trace)
    assert not header.get("truncated") and recording.num_steps > 50
