"""Memory: peak resident memory of ``LLM(...).generate`` on the CPU with a 2,048-slot pool.

A fresh Python subprocess (so that no other variant's memory is counted) imports pagedkv, loads
SmolLM2-135M-Instruct (fp32), builds ``LLM(device="cpu", pool_slots=2048)`` and generates the 16
chat prompts x 64 tokens. It reports the process's peak RSS (``VmHWM``; ``ru_maxrss`` can include
the parent's memory, see :func:`vm_hwm_bytes`), the RSS sampled every 5 ms during ``generate``
and the RSS after each phase. Target: peak <= 1.5 GB (1.5 x 10^9 bytes). For reference it also
measures the same run with ``PAGEDKV_CPU_LINEAR=plain`` (no oneDNN pre-packed weight copies); ``--quick``
(4 tokens, a smoke run of the measurement) leaves that second process out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_BYTES = 1.5e9
POOL_SLOTS = 2048


def vm_hwm_bytes(pid: int | str = "self") -> int:
    """A process's peak resident set (``VmHWM``; this process by default). Unlike ``ru_maxrss``
    it belongs to the process's own address space: Linux carries the parent's high-water mark
    into a child's ``ru_maxrss`` across fork/vfork + exec, which would count the benchmark
    runner's memory. OSError when the process is gone."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def child(max_new_tokens: int) -> dict:
    """Runs inside the subprocess; prints nothing, returns the figures."""
    import resource

    from benchmarks.common import peak_rss, rss_bytes

    phases = {"start": rss_bytes()}
    import torch

    torch.set_num_threads(1)
    from pagedkv_core.llm import LLM
    from pagedkv_core.sampling import SamplingParams

    phases["imports"] = rss_bytes()
    llm = LLM(device="cpu", threads=1, pool_slots=POOL_SLOTS, progress=lambda f, m: None)
    phases["model_loaded"] = rss_bytes()
    from benchmarks.common import CHAT_PROMPTS

    with peak_rss() as sampled:
        outs = llm.generate(CHAT_PROMPTS, SamplingParams(max_tokens=max_new_tokens), chat=True)
    phases["after_generate"] = rss_bytes()
    return {
        "peak_rss_bytes": vm_hwm_bytes(),
        "peak_rss_sampled_during_generate_bytes": sampled["peak"],
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_by_phase_bytes": phases,
        "pool_bytes": llm.pool_info["bytes"],
        "swap_pool_slots": llm.pool_info["swap_slots"],
        "runner_weight_bytes": llm.runner.model.weight_bytes,
        "tokens_generated": sum(len(o.outputs[0].token_ids) for o in outs),
        "requests": len(outs),
    }


def _spawn(max_new_tokens: int, env: dict | None = None) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.bench_memory import child; "
            f"print('RESULT ' + json.dumps(child({max_new_tokens})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"memory subprocess failed (exit {proc.returncode}): {tail[0]}")
    return json.loads(line[len("RESULT "):])


def run(quick: bool = False) -> dict:
    max_new_tokens = 4 if quick else 64
    r = _spawn(max_new_tokens)
    if not quick:  # what the oneDNN pre-packed weight copies cost: the same run with plain linears
        plain = _spawn(max_new_tokens, {"PAGEDKV_CPU_LINEAR": "plain"})
        r["with_plain_linears"] = {"env": "PAGEDKV_CPU_LINEAR=plain", "peak_rss_bytes": plain["peak_rss_bytes"],
                                   "peak_rss_gb": round(plain["peak_rss_bytes"] / 1e9, 3)}
    peak = r["peak_rss_bytes"]
    return {
        "setup": {"pool_slots": POOL_SLOTS, "prompts": 16, "max_new_tokens": max_new_tokens, "dtype": "float32",
                  "torch_threads": 1, "process": "fresh subprocess: import, load, LLM(...).generate"},
        **r,
        "peak_rss_gb": round(peak / 1e9, 3),
        "targets": [{"name": "peak RSS of generate, 2,048-slot pool (GB)", "value": round(peak / 1e9, 3),
                     "target": "<= 1.5", "pass": peak <= TARGET_BYTES}],
    }


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    rows = [{"phase": k, "RSS MB": round(v / 2**20, 1)} for k, v in result["rss_by_phase_bytes"].items()]
    rows.append({"phase": "peak during generate (sampled)", "RSS MB": round(result["peak_rss_sampled_during_generate_bytes"] / 2**20, 1)})
    rows.append({"phase": "peak (VmHWM)", "RSS MB": round(result["peak_rss_bytes"] / 2**20, 1)})
    if "with_plain_linears" in result:
        rows.append({"phase": "peak, plain linears (PAGEDKV_CPU_LINEAR=plain)",
                     "RSS MB": round(result["with_plain_linears"]["peak_rss_bytes"] / 2**20, 1)})
    print_table(rows, ["phase", "RSS MB"])


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("memory", {"command": "python benchmarks/bench_memory.py", "quick": "--quick" in sys.argv, **res}))
