"""Roofline: the CPU engine's decode step against what one core can do, in fp32 and bf16.

On one torch thread, in ``rounds`` interleaved rounds (so that every figure sees the same machine
load), each round measures:

* **the matmul peak** of each dtype: the best of a few ``n x n @ n x n`` products (n = 2,048),
  2 n^3 FLOPs each;
* **the read bandwidth**: the best of a few sums over a 256 MiB tensor (the weights of a decode
  step do not fit in this core's share of the caches, so they come at about this rate);
* per (dtype, batch) variant, on its own model runner and paged engine (pool in blocks of 16,
  greedy, ``ignore_eos`` so that the batch stays full): ``steps`` **decode steps** of the real
  SmolLM2, every sequence decoding (prefill and warm-up steps are not timed), and the **GEMM
  floor**: the same packed weights multiplied in sequence by random activations of the batch's
  shape, nothing else (what the step would cost if attention, norms, rotary, the KV writes,
  the sampler and Python cost nothing).

A step's FLOPs are counted from its shape: 2 x (every weight a token multiplies: the 30 layers'
Q/K/V, O, gate/up and down projections and the LM head) per sequence, plus attention over the
context: 4 x heads x head_dim per (layer, context token) (Q.K and P.V), with the step's actual
context lengths. Norms, rotary, SiLU and softmax are not counted (under 0.1% of the FLOPs).
Achieved GFLOP/s = FLOPs / median step time (the runner's ``execute``: forward + sampling), as a
share of the dtype's peak (the median over rounds of each round's best). The step's thread CPU
time is recorded beside it: on a shared machine it shows how much of the wall time was spent
waiting for a core. The **roofline** of a
step is min(peak, intensity x bandwidth), with intensity = FLOPs / bytes read (every weight once,
plus each sequence's K/V): where it is below the peak, the step is memory-bound and no engine
can reach the peak at that batch.

Targets at batch 32, one thread: fp32 >= 75% of its peak, bf16 >= 50%.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = ("float32", "bfloat16")
BATCHES = (16, 32)
TARGET_BATCH = 32
TARGETS = {"float32": 0.75, "bfloat16": 0.50}  # share of the dtype's matmul peak at TARGET_BATCH
PEAK_N = 2048
BANDWIDTH_BYTES = 256 << 20
BLOCK_SIZE = 16
PHRASINGS = ["", " Answer briefly.", " Explain it to a child.", " Use an example."]


def matmul_peak(dtype, n: int = PEAK_N, reps: int = 3) -> float:
    """GFLOP/s of the best of ``reps`` square ``n x n`` matmuls in ``dtype`` (after one warm-up)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn((n, n), generator=g).to(dtype)
    b = torch.randn((n, n), generator=g).to(dtype)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def read_bandwidth(nbytes: int = BANDWIDTH_BYTES, reps: int = 3) -> float:
    """GB/s of the best of ``reps`` sums over an fp32 tensor of ``nbytes``."""
    import torch

    x = torch.ones(nbytes // 4)
    x.sum()
    return nbytes / min(_seconds(x.sum) for _ in range(reps)) / 1e9


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def matmul_params_per_token(model) -> int:
    """Weights one token multiplies: every layer's projections, and the LM head."""
    hidden, heads, kv_heads, d = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
    inter = model.config.intermediate_size
    per_layer = hidden * (heads + 2 * kv_heads) * d + heads * d * hidden + 3 * hidden * inter
    return model.num_layers * per_layer + model.vocab_size * hidden


def step_flops(model, shape) -> int:
    """FLOPs of a forward of ``shape`` (a runner's ``StepShape``): the matmuls of every token
    (the LM head only for the sampled rows) and attention over the decode contexts. Prefill
    attention is not counted: the benchmark times decode steps only."""
    tokens = shape.prefill_tokens + shape.decode_seqs
    head = model.vocab_size * model.hidden_size
    matmuls = 2 * ((matmul_params_per_token(model) - head) * tokens + head * shape.sampled_rows)
    attention = 4 * model.num_heads * model.head_dim * model.num_layers * shape.decode_context_tokens
    return matmuls + attention


def step_bytes(runner, shape) -> int:
    """Bytes a decode step must read at least: every weight once, and each sequence's K/V."""
    return runner.model.weight_bytes + shape.decode_context_tokens * runner.bytes_per_slot


def gemm_floor(model, batch: int):
    """A callable running only the step's matmuls (the model's own packed weights, random
    activations of ``batch`` rows, in layer order)."""
    import torch

    g = torch.Generator().manual_seed(0)
    dt = model.dtype
    x = torch.randn((batch, model.hidden_size), generator=g).to(dt)
    attn = torch.randn((batch, model.num_heads * model.head_dim), generator=g).to(dt)
    act = torch.randn((batch, model.config.intermediate_size), generator=g).to(dt)

    def run():
        for lw in model.layers:
            lw.qkv(x)
            lw.o(attn)
            lw.gate_up(x)
            lw.down(act)
        model.lm_head(x)

    return run


class DecodeVariant:
    """One (dtype, batch): its own runner and paged engine, decoding a full batch."""

    def __init__(self, loaded, dtype: str, batch: int, prompts: list[list[int]], max_tokens: int):
        import torch

        from pagedkv_core.llm import LLM
        from pagedkv_core.sampling import SamplingParams

        self.dtype, self.batch = dtype, batch
        slots = BLOCK_SIZE * batch * -(-(max(map(len, prompts)) + max_tokens + 1) // BLOCK_SIZE)
        self.llm = LLM(device="cpu", dtype=dtype, threads=1, pool_slots=slots, block_size=BLOCK_SIZE,
                       loaded=loaded, progress=lambda f, m: None)
        self.runner = self.llm.runner
        self.engine = self.llm.new_engine()
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for i, p in enumerate(prompts[:batch]):
            self.engine.add_request(str(i), p, sp)
        self.gemms = gemm_floor(self.runner.model, batch)
        self.samples: list[dict] = []
        self.gemm_seconds: list[float] = []
        with torch.inference_mode():
            self.gemms()  # first touch of the weights

    def warm(self, steps: int) -> None:
        """Step past the prefill, then ``steps`` more (untimed)."""
        while self.runner.last_step_shape.decode_seqs < self.batch:
            self.engine.step()
        for _ in range(steps):
            self.engine.step()

    def measure(self, steps: int) -> None:
        import torch

        with torch.inference_mode():
            self.gemm_seconds.append(_seconds(self.gemms))
        for _ in range(steps):
            c0, t0 = time.thread_time(), time.perf_counter()
            self.engine.step()
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            shape = self.runner.last_step_shape
            if shape.prefill_tokens or shape.decode_seqs != self.batch:
                continue  # (never, with ignore_eos and a pool that fits: kept honest anyway)
            self.samples.append({"execute": self.runner.last_step_seconds, "engine_step": wall, "cpu": cpu,
                                 "flops": step_flops(self.runner.model, shape),
                                 "bytes": step_bytes(self.runner, shape),
                                 "context": shape.decode_context_tokens / shape.decode_seqs})
        with torch.inference_mode():
            self.gemm_seconds.append(_seconds(self.gemms))

    def summary(self, peak: float, bandwidth: float) -> dict:
        med = lambda key: statistics.median(s[key] for s in self.samples)  # noqa: E731
        step = med("execute")
        flops, nbytes = med("flops"), med("bytes")
        gflops = statistics.median(s["flops"] / s["execute"] for s in self.samples) / 1e9
        roof = min(peak, flops / nbytes * bandwidth)
        gemm = statistics.median(self.gemm_seconds)
        model = self.runner.model
        gemm_flops = 2 * matmul_params_per_token(model) * self.batch
        return {
            "dtype": self.dtype, "batch": self.batch, "steps": len(self.samples),
            "mean_context": round(med("context"), 1),
            "step_ms": round(step * 1e3, 2),
            "engine_step_ms": round(med("engine_step") * 1e3, 2),
            "cpu_ms": round(med("cpu") * 1e3, 2),
            "tokens_per_s": round(self.batch / step, 1),
            "gflop_per_step": round(flops / 1e9, 3),
            "gflops": round(gflops, 1),
            "share_of_peak": round(gflops / peak, 3),
            "intensity_flop_per_byte": round(flops / nbytes, 2),
            "roofline_gflops": round(roof, 1),
            "share_of_roofline": round(gflops / roof, 3),
            "gemm_floor_ms": round(gemm * 1e3, 2),
            "gemm_floor_gflops": round(gemm_flops / gemm / 1e9, 1),
            "gemm_share_of_step": round(gemm / step, 3),
            "packed_linears": bool(model.packed_linears),
        }


def run(quick: bool = False, rounds: int = 3, steps: int = 8, llm=None, batches=BATCHES, dtypes=DTYPES) -> dict:
    import torch

    from benchmarks.common import chat_prompt_ids
    from pagedkv_core.sources.model import cpu_supports_bf16
    from pagedkv_core.sources.model.loader import load_model
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS

    torch.set_num_threads(1)
    warmup = 2
    if quick:
        rounds, steps, batches = 1, 2, (4,)
    loaded = llm.loaded if llm is not None and getattr(llm.loaded, "model", None) is not None else None
    loaded = loaded or load_model(progress=lambda f, m: None)
    texts = [p + s for s in PHRASINGS for p in CHAT_PROMPTS]
    prompts = chat_prompt_ids(loaded.tokenizer, texts[: max(batches)])
    max_tokens = warmup + rounds * steps + 2
    variants = [DecodeVariant(loaded, dt, b, prompts, max_tokens) for dt in dtypes for b in batches]
    for v in variants:
        v.warm(warmup)
    peaks: dict[str, list[float]] = {dt: [] for dt in dtypes}
    bandwidths = []
    with torch.inference_mode():
        for r in range(rounds):
            for dt in dtypes:
                peaks[dt].append(matmul_peak(getattr(torch, dt), reps=2 if quick else 3))
            bandwidths.append(read_bandwidth())
            for v in variants[r % len(variants):] + variants[: r % len(variants)]:  # rotate the order
                v.measure(steps)
    peak = {dt: statistics.median(p) for dt, p in peaks.items()}
    bandwidth = statistics.median(bandwidths)
    rows = [v.summary(peak[v.dtype], bandwidth) for v in variants]
    targets = []
    for row in rows:
        if row["batch"] == TARGET_BATCH and row["dtype"] in TARGETS:
            t = TARGETS[row["dtype"]]
            targets.append({"name": f"{row['dtype']} decode at batch {TARGET_BATCH}, share of the matmul peak",
                            "value": row["share_of_peak"], "target": f">= {t}", "pass": row["share_of_peak"] >= t})
    return {
        "setup": {"threads": torch.get_num_threads(), "block_size": BLOCK_SIZE, "rounds": rounds,
                  "steps_per_round": steps, "warmup_steps": warmup, "peak_matmul_n": PEAK_N,
                  "bandwidth_bytes": BANDWIDTH_BYTES, "cpu_supports_bf16": cpu_supports_bf16()},
        "peak_gflops": {dt: round(p, 1) for dt, p in peak.items()},
        "peak_gflops_rounds": {dt: [round(x, 1) for x in p] for dt, p in peaks.items()},
        "read_bandwidth_gbs": round(bandwidth, 2),
        "variants": rows,
        "targets": targets,
    }


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    peaks = ", ".join(f"{dt} {p} GFLOP/s" for dt, p in result["peak_gflops"].items())
    print(f"matmul peak ({result['setup']['peak_matmul_n']}^2, one thread): {peaks}; "
          f"read bandwidth {result['read_bandwidth_gbs']} GB/s")
    rows = [{"dtype": v["dtype"], "batch": v["batch"], "step ms": v["step_ms"], "CPU ms": v["cpu_ms"],
             "tokens/s": v["tokens_per_s"],
             "GFLOP/s": v["gflops"], "% of peak": f"{100 * v['share_of_peak']:.0f}%",
             "roofline GFLOP/s": v["roofline_gflops"], "% of roofline": f"{100 * v['share_of_roofline']:.0f}%",
             "GEMM floor ms": v["gemm_floor_ms"], "GEMMs / step": f"{100 * v['gemm_share_of_step']:.0f}%"}
            for v in result["variants"]]
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("roofline", {"command": "python benchmarks/bench_roofline.py", "quick": "--quick" in sys.argv, **res}))
