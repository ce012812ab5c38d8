"""pagedkv_core/observe/vllm_server.py without vLLM: a stand-in interpreter plays the server, so that the
start, the progress-bounded wait and the process-group stop are checked in ``make test``.

The stand-in (``venv/bin/python``) takes vLLM's command line, logs a line, starts a child of its
own (the engine-core process of a real server) and then, by its mode: answers ``/health``, exits
with code 3, or stays silent. The real server is ``tests/vllm`` (``make test-vllm``).
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pagedkv_core.observe.vllm_server import VLLMServer, VLLMServerError, _group_alive, omp_bind
from tests.browser import free_port

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = r'''
import argparse, http.server, json, os, subprocess, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int)
ap.add_argument("--kv-events-config")
args, _ = ap.parse_known_args()
mode = os.environ["STAND_IN_MODE"]
print("argv " + json.dumps(sys.argv[1:]), flush=True)
print("env " + json.dumps({k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")}), flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child {child.pid}", flush=True)
if mode == "exit":
    sys.exit(3)
if mode == "silent":
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", args.port), H).serve_forever()
'''


@pytest.fixture
def venv(tmp_path):
    """A venv whose python is the stand-in (run by this interpreter)."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "venv"


def _child_pid(log: Path) -> int:
    for _ in range(600):  # the stand-in writes it first thing; a bound, not a pace
        for line in log.read_text().splitlines() if log.exists() else ():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.1)
    raise AssertionError(f"no child line in {log}")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _server(venv, tmp_path, mode, monkeypatch) -> VLLMServer:
    monkeypatch.setenv("STAND_IN_MODE", mode)
    return VLLMServer(free_port(), free_port(), free_port(), model=tmp_path, venv=venv, log_path=tmp_path / "server.log")


def test_started_with_vllms_command_and_stopped_with_its_whole_group(venv, tmp_path, monkeypatch):
    server = _server(venv, tmp_path, "serve", monkeypatch)
    with server:
        assert server.healthy()
        argv = json.loads(server.log_path.read_text().splitlines()[0][len("argv "):])
        assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
        for flag, value in (("--model", str(tmp_path)), ("--host", "127.0.0.1"), ("--port", str(server.port)),
                            ("--block-size", "32"), ("--dtype", "float32")):
            assert argv[argv.index(flag) + 1] == value
        assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
        events = json.loads(argv[argv.index("--kv-events-config") + 1])
        assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv-events",
                          "endpoint": f"tcp://*:{server.events_port}",
                          "replay_endpoint": f"tcp://*:{server.replay_port}"}
        env = json.loads(server.log_path.read_text().splitlines()[1][len("env "):])
        assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": omp_bind()}
        child = _child_pid(server.log_path)
        pgid = server.proc.pid
    assert server.proc is None and not _group_alive(pgid)
    assert _gone(child), "the server's own child processes are stopped too"


def test_a_server_that_exits_while_starting_fails_with_its_log(venv, tmp_path, monkeypatch):
    server = _server(venv, tmp_path, "exit", monkeypatch)
    with pytest.raises(VLLMServerError, match=r"exited with code 3 while starting(.|\n)*child \d+"):
        with server:
            pass


def test_a_server_whose_log_stays_silent_fails_and_is_stopped(venv, tmp_path, monkeypatch):
    server = _server(venv, tmp_path, "silent", monkeypatch).start()
    pgid = server.proc.pid
    child = _child_pid(server.log_path)
    with pytest.raises(VLLMServerError, match="wrote nothing for 1 s while starting"):
        server.wait_ready(stall_s=1.0, poll_s=0.1)
    assert server.proc is None and not _group_alive(pgid) and _gone(child)


def test_a_missing_venv_says_to_run_make_vllm(tmp_path):
    with pytest.raises(VLLMServerError, match="run `make vllm`"):
        VLLMServer(free_port(), free_port(), free_port(), model=tmp_path, venv=tmp_path / "none").start()


def test_the_command_stops_the_server_on_sigterm(venv, tmp_path):
    """``make vllm`` (``python -m pagedkv_core.observe.vllm_server``) started from a script: SIGTERM stops
    the server's whole process group and the command ends."""
    port = free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv_core.observe.vllm_server", "--port", str(port), "--events-port", str(free_port()),
         "--replay-port", str(free_port()), "--venv", str(venv), "--log", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "STAND_IN_MODE": "serve"})
    try:
        line = ""
        while "is ready" not in line:  # the command says so once /health answers
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the command ended before the server was ready"
        assert f"http://127.0.0.1:{port}" in line
        child = _child_pid(log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _gone(child)
