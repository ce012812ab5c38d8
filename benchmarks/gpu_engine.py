#!/usr/bin/env python
"""GPU check of the real model on the paged engine (one script, under 4 minutes on an H200).

1. Greedy equality on CUDA in fp32: our engine (paged pool, Triton decode kernel) against
   transformers' own ``generate`` on the same GPU, 8 chat prompts x 32 tokens, each prompt alone.
2. Pool sizing by profiling: ``LLM(device="cuda")`` with no pool size measures the activation
   peak of a dummy step and sizes the KV pool from what is left of 90 % of the GPU (capped).
3. Throughput in bf16: 256 chat requests (16 prompts x 16 variants, seeded sampling,
   ``max_tokens`` 64..256) through the paged engine; reports generated tokens per second (first
   step to last), steps, peak and mean concurrency, peak and mean KV usage, preemptions and the
   prefix-cache hit rate.
4. Writes ``benchmarks/results/gpu_engine.json``.

Exit status: 0 when the equality check passed and the workload ran, 1 when something failed
(the JSON says what), 2 without CUDA (one line on stderr).

Usage: ``python benchmarks/gpu_engine.py [--out PATH] [--requests N]``
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_engine.json"
T0 = time.perf_counter()

from pagedkv_core.workloads.prompts import CHAT_PROMPTS  # noqa: E402  (the same 16 questions everywhere)
VARIANTS = ["", " Answer briefly.", " Explain it to a child.", " Use an example.", " Be precise.",
            " Answer in a friendly tone.", " Give some background first.", " Then summarise.",
            " Answer in two parts.", " Mention a common mistake.", " Keep it simple.", " Add a fun fact.",
            " Be thorough.", " Use a list.", " Answer as a teacher would.", " Finish with a question."]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def check_equality(loaded, device: str, num_prompts: int, max_tokens: int) -> dict:
    """Greedy ids of our engine (fp32) vs transformers' generate on the same device (fp32)."""
    import torch

    from pagedkv_core.llm import LLM
    from pagedkv_core.sampling import SamplingParams

    llm = LLM(loaded=loaded, device=device, dtype="float32", block_size=16, pool_slots=8192, swap_slots=1024)
    prompts = [llm.encode(p, chat=True) for p in CHAT_PROMPTS[:num_prompts]]
    t0 = time.perf_counter()
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens))]
    ours_s = time.perf_counter() - t0
    hf_model = loaded.model.to(device)
    theirs = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            y = hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False)
            theirs.append(y[0, len(ids):].tolist())
    hf_s = time.perf_counter() - t0
    loaded.model.to("cpu")
    del llm
    if device == "cuda":
        torch.cuda.empty_cache()
    mismatches = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append({"prompt": i, "first_difference_at": first, "ours": a, "transformers": b})
    return {
        "prompts": num_prompts,
        "max_tokens": max_tokens,
        "equal": not mismatches,
        "equal_prompts": num_prompts - len(mismatches),
        "mismatches": mismatches,
        "ours_s": round(ours_s, 3),
        "transformers_s": round(hf_s, 3),
        "tokens": sum(map(len, ours)),
    }


def build_workload(llm, num_requests: int, max_tokens_range: tuple[int, int], seed: int = 0):
    from pagedkv_core.sampling import SamplingParams

    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(num_requests):
        text = CHAT_PROMPTS[i % len(CHAT_PROMPTS)] + VARIANTS[(i // len(CHAT_PROMPTS)) % len(VARIANTS)]
        prompts.append(llm.encode(text, chat=True))
        params.append(SamplingParams(max_tokens=rng.randint(*max_tokens_range), temperature=0.8, top_p=0.95,
                                     seed=seed * 100003 + i))
    return prompts, params


def run_workload(loaded, device: str, dtype: str, num_requests: int, max_tokens_range, pool: dict) -> dict:
    import torch

    from pagedkv_core.llm import LLM
    from pagedkv_core.sampling import SamplingParams

    t0 = time.perf_counter()
    llm = LLM(loaded=loaded, device=device, dtype=dtype, block_size=16, swap_slots=16384, **pool)
    setup_s = time.perf_counter() - t0
    log(f"pool: {llm.pool_info}")
    prompts, params = build_workload(llm, num_requests, max_tokens_range)
    # warm-up (Triton JIT for this dtype and the step shapes), not timed
    llm.generate(prompts[:8], SamplingParams(max_tokens=4))
    peak_kv = 0.0
    kv_sum = 0.0
    step_times = []

    def on_step(_outs, snap):
        nonlocal peak_kv, kv_sum
        peak_kv = max(peak_kv, snap.metrics.kv_usage)
        kv_sum += snap.metrics.kv_usage
        step_times.append(snap.metrics.execute_s)

    outs = llm.generate(prompts, params, on_step=on_step)
    s = llm.last_summary
    if device == "cuda":
        torch.cuda.synchronize()
    finished = sum(1 for o in outs if o.outputs and o.outputs[0].finish_reason in ("stop", "length"))
    steps = max(1, s["steps"])
    return {
        "requests": num_requests,
        "finished": finished,
        "rejected": len(s["rejected"]),
        "dtype": s["dtype"],
        "max_tokens_range": list(max_tokens_range),
        "sampling": "temperature 0.8, top_p 0.95, seeded per request",
        "tokens_generated": s["tokens_generated"],
        "elapsed_s": round(s["elapsed_s"], 3),
        "tokens_per_s": round(s["tokens_per_s"], 1),
        "steps": s["steps"],
        "mean_step_ms": round(1000 * s["elapsed_s"] / steps, 2),
        "mean_execute_ms": round(1000 * sum(step_times) / max(1, len(step_times)), 2),
        "peak_running": s["peak_running"],
        "mean_running": round(s["mean_running"], 1),
        "peak_kv_usage": round(peak_kv, 4),
        "mean_kv_usage": round(kv_sum / steps, 4),
        "mean_token_utilization": round(s["mean_token_utilization"], 4),
        "preemptions": s["preemptions"],
        "prefix_cache_hit_rate": round(s["prefix_cache_hit_rate"], 4),
        "pool": llm.pool_info,
        "setup_s": round(setup_s, 2),
        "sample_text": outs[0].outputs[0].text[:200] if outs and outs[0].outputs else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="GPU check of the real model on the paged engine")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--requests", type=int, default=256)
    # development only: the same code paths on the CPU with tiny sizes (numbers meaningless)
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    import torch

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_engine: no CUDA device available; this benchmark needs a GPU", file=sys.stderr)
        return 2
    device = "cpu" if smoke else "cuda"
    if smoke:
        torch.set_num_threads(1)
    from pagedkv_core.sources.model.loader import load_model

    result: dict = {
        "benchmark": "gpu_engine",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if not smoke else "cpu (smoke run)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "errors": [],
    }
    ok = True
    loaded = load_model(None, progress=lambda f, m: None)
    log(f"model loaded in {loaded.load_seconds:.1f}s")

    try:
        log("greedy equality vs transformers (fp32)")
        eq = check_equality(loaded, device, num_prompts=4 if smoke else 8, max_tokens=8 if smoke else 32)
        result["equality_fp32"] = eq
        ok &= eq["equal"]
        log(f"equal: {eq['equal']} ({eq['equal_prompts']}/{eq['prompts']} prompts)")
    except Exception as exc:  # keep going: the workload is still worth measuring
        ok = False
        result["errors"].append({"section": "equality", "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
        log(f"equality check failed: {exc!r}")

    dtype = "float32" if smoke else "bfloat16"
    n = 16 if smoke else args.requests
    mt = (4, 12) if smoke else (64, 256)
    pool = {"pool_slots": 4096} if smoke else {}  # CUDA: sized by the profiling pass
    try:
        log(f"workload: {n} requests, {dtype}")
        try:
            wl = run_workload(loaded, device, dtype, n, mt, pool)
        except Exception as exc:
            if pool:
                raise
            result["errors"].append({"section": "profiled pool", "error": repr(exc),
                                     "trace": traceback.format_exc()[-2000:]})
            log(f"profiled pool sizing failed ({exc!r}); retrying with 131072 slots")
            ok = False
            wl = run_workload(loaded, device, dtype, n, mt, {"pool_slots": 131072})
        result["workload_bf16" if not smoke else "workload"] = wl
        log(f"{wl['tokens_generated']} tokens in {wl['elapsed_s']} s = {wl['tokens_per_s']} tok/s; "
            f"peak running {wl['peak_running']}, peak KV usage {wl['peak_kv_usage']:.1%}")
    except Exception as exc:
        ok = False
        result["errors"].append({"section": "workload", "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
        log(f"workload failed: {exc!r}")

    result["total_s"] = round(time.perf_counter() - T0, 1)
    result["ok"] = bool(ok)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out} (ok={ok})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
