#!/usr/bin/env python
"""GPU check of the ``kernels`` package (one script, under 4 minutes on an H200).

1. Correctness on CUDA: every kernel against its PyTorch reference (decode across dtypes,
   block sizes, GQA shapes and forced/heuristic split-K; the scatter, block copy and swap
   bit-exact; the public dispatcher and its argument checks).
2. Timing: paged decode for num_seqs {1, 8, 64, 256} x context {128, 1024, 8192} (+ 64 x 4096)
   against ``torch.nn.functional.scaled_dot_product_attention`` on the same K/V laid out
   densely; achieved bandwidth = bytes of K/V read / time. Also block sizes, split-K on/off
   and a small tile sweep at 64 x 4096, for tuning.
3. Writes ``benchmarks/results/gpu_kernels.json``.

Targets (H200): paged decode at >= 60% of 4.3 TB/s at 64 x 4096, and <= 1.3x the dense SDPA
time there. Exit status: 0 when every correctness check passed (targets are reported, not
enforced), 1 when a check failed, 2 when there is no CUDA device.

Usage: ``python benchmarks/gpu_kernels.py [--out PATH]``
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_kernels.json"
H200_COPY_TBPS = 4.3  # the measured copy bandwidth
TARGET_FRACTION = 0.60
TARGET_SDPA_RATIO = 1.3
TIME_BUDGET_S = 200.0  # optional sections are skipped past this

SHAPES = {
    # name: (num_heads, num_kv_heads, head_dim)
    "llama8b": (32, 8, 128),
    "smollm2": (9, 3, 64),
}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


T0 = time.perf_counter()


def main() -> int:
    ap = argparse.ArgumentParser(description="GPU check of the kernels package")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    # development only: run every section on the CPU with the Triton interpreter and tiny
    # sizes, to exercise this script's own code paths without a GPU (numbers meaningless)
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    smoke = args.cpu_smoke

    try:
        import torch
    except ImportError:
        print("gpu_kernels: torch is not installed; nothing to check", file=sys.stderr)
        return 2
    if smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("gpu_kernels: --cpu-smoke needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
    elif not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device available; this check needs an NVIDIA GPU (exit 2)", file=sys.stderr)
        return 2
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("gpu_kernels: unset TRITON_INTERPRET; the GPU check compiles the kernels", file=sys.stderr)
        return 2

    sys.path.insert(0, str(ROOT))
    import triton

    results: dict = {
        "device": "cpu (smoke run, numbers meaningless)" if smoke else torch.cuda.get_device_name(0),
        "capability": None if smoke else list(torch.cuda.get_device_capability(0)),
        "num_sms": None if smoke else torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "checks": [],
        "decode": [],
        "block_sizes": [],
        "split_k": [],
        "tuning": [],
        "skipped": [],
    }
    status = 0
    try:
        bench = Bench(torch, results, smoke)
        bench.copy_bandwidth()
        bench.correctness()
        bench.decode_sweep()
        bench.block_size_sweep()
        bench.split_k_effect()
        bench.tile_sweep()
        bench.targets()
    except Exception as e:  # noqa: BLE001 - record and report, still write the JSON
        results["error"] = f"{type(e).__name__}: {e}"
        results["traceback"] = traceback.format_exc()
        log(f"ERROR {results['error']}")
        status = 1
    finally:
        results["elapsed_s"] = round(time.perf_counter() - T0, 1)
        failed = [c for c in results["checks"] if not c["ok"]]
        results["checks_passed"] = len(results["checks"]) - len(failed)
        results["checks_failed"] = len(failed)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        log(f"wrote {args.out}")
    if failed:
        status = 1
        for c in failed:
            log(f"FAILED check: {c['name']}: {c.get('detail', '')}")
    t = results.get("targets", {})
    log(f"checks {results['checks_passed']}/{len(results['checks'])} passed; targets: {t}")
    return status


class Bench:
    def __init__(self, torch, results, smoke=False):
        import kernels
        from kernels import reference as ref
        from kernels import triton_kernels as tk

        self.torch = torch
        self.kernels, self.ref, self.tk = kernels, ref, tk
        self.r = results
        self.smoke = smoke
        self.dev = torch.device("cpu" if smoke else "cuda")
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(0)
        if smoke:
            self.sweep_seqs, self.sweep_ctx, self.target_point = (1, 2), (16, 40), (2, 64)
            self.copy_numel, self.bs_sweep, self.split_points = 1 << 16, (1, 16), ((1, 600),)
            self.corr_bs, self.corr_long = (1, 16), 40
        else:
            self.sweep_seqs, self.sweep_ctx, self.target_point = (1, 8, 64, 256), (128, 1024, 8192), (64, 4096)
            self.copy_numel, self.bs_sweep = 1 << 30, (1, 8, 16, 32, 64, 128)
            self.split_points = ((1, 8192), (8, 8192), (1, 1024), (64, 4096))
            self.corr_bs, self.corr_long = (1, 16, 128), 700
        import triton.testing

        self.do_bench = triton.testing.do_bench

    # ------------------------------------------------------------------ helpers

    def time_ms(self, fn, rep=60) -> float:
        if self.smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return float(self.do_bench(fn, warmup=10, rep=rep, return_mode="median"))

    def sync(self):
        if not self.smoke:
            self.torch.cuda.synchronize()

    def empty_cache(self):
        if not self.smoke:
            self.torch.cuda.empty_cache()

    def check(self, name, ok, **detail):
        entry = {"name": name, "ok": bool(ok)}
        entry.update(detail)
        self.r["checks"].append(entry)
        if not ok:
            log(f"  FAIL {name} {detail}")

    def over_budget(self, section) -> bool:
        if time.perf_counter() - T0 > TIME_BUDGET_S:
            self.r["skipped"].append(section)
            log(f"skipping {section}: past the {TIME_BUDGET_S:.0f}s budget")
            return True
        return False

    def make_case(self, lens, num_heads, num_kv_heads, head_dim, block_size, dtype, poison=True):
        torch = self.torch
        need = [-(-n // block_size) for n in lens]
        max_blocks = max(1, max(need)) + 1
        num_blocks = sum(need) + 2
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        kc = torch.randn(shape, device=self.dev, generator=self.gen).to(dtype)
        vc = torch.randn(shape, device=self.dev, generator=self.gen).to(dtype)
        q = torch.randn((len(lens), num_heads, head_dim), device=self.dev, generator=self.gen).to(dtype)
        perm = torch.randperm(num_blocks, device=self.dev, generator=self.gen).tolist()
        bt = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
        used = set()
        for i, n in enumerate(need):
            ids = [perm.pop() for _ in range(n)]
            used.update(ids)
            bt[i, :n] = torch.tensor(ids, dtype=torch.int32)
            if poison and n:
                tail = lens[i] - (n - 1) * block_size
                kc[ids[-1], tail:] = float("nan")
                vc[ids[-1], tail:] = float("nan")
        if poison:
            for b in set(range(num_blocks)) - used:
                kc[b] = float("nan")
                vc[b] = float("nan")
        lens_t = torch.tensor(lens, dtype=torch.int32, device=self.dev)
        return q, kc, vc, bt.to(self.dev), lens_t

    # ------------------------------------------------------------------ sections

    def copy_bandwidth(self):
        torch = self.torch
        n = self.copy_numel  # 2 GiB of bf16 on the GPU
        a = torch.empty(n, dtype=torch.bfloat16, device=self.dev)
        b = torch.empty_like(a)
        ms = self.time_ms(lambda: b.copy_(a))
        tbps = 2 * a.numel() * a.element_size() / (ms * 1e-3) / 1e12
        self.r["copy_bandwidth_TBps"] = round(tbps, 3)
        log(f"device copy bandwidth {tbps:.2f} TB/s (read + write)")
        del a, b
        self.empty_cache()

    def correctness(self):
        torch, tk, ref, kernels = self.torch, self.tk, self.ref, self.kernels
        tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
        log("correctness: paged decode vs reference")
        shapes = [(9, 3, 64), (32, 8, 128), (8, 8, 64), (16, 2, 128)]
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for h, hkv, d in shapes:
                for bs in self.corr_bs:
                    if (h, hkv, d) in ((8, 8, 64), (16, 2, 128)) and bs != 16:
                        continue
                    lens = [0, 1, bs + 1, self.corr_long, 3 * bs - 1 if bs > 1 else 45]
                    case = self.make_case(lens, h, hkv, d, bs, dtype)
                    expect = ref.paged_attention_decode(*case).float()
                    for parts in (None, 1, 4):
                        out = tk.paged_attention_decode(*case, num_partitions=parts).float()
                        err = (out - expect).abs().max().item()
                        ok = not torch.isnan(out).any().item() and torch.allclose(out, expect, atol=tol[dtype], rtol=tol[dtype])
                        self.check(f"decode {str(dtype)[6:]} h{h}/{hkv} d{d} bs{bs} parts={parts}", ok, max_abs_err=err)
        self.sync()

        log("correctness: public dispatcher on CUDA")
        case = self.make_case([5, 300], 9, 3, 64, 16, torch.bfloat16)
        with kernels.use_backend("triton" if self.smoke else "auto"):
            out = kernels.paged_attention_decode(*case)
        expect = tk.paged_attention_decode(*case)
        self.check("dispatcher auto -> triton on cuda", torch.equal(out, expect))
        bad = case[3].clone()
        bad[1, 3] = case[1].shape[0]
        try:
            kernels.paged_attention_decode(case[0], case[1], case[2], bad, case[4])
            self.check("out-of-range block id rejected on cuda", False)
        except ValueError:
            self.check("out-of-range block id rejected on cuda", True)

        log("correctness: reshape_and_cache / copy_blocks / swap_blocks (bit-exact)")
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for hkv, d, bs in ((3, 64, 16), (8, 128, 1), (8, 128, 128)):
                nb = 12
                kc = torch.randn((nb, bs, hkv, d), device=self.dev, generator=self.gen).to(dtype)
                vc = torch.randn_like(kc)
                num_slots = nb * bs
                t = min(37, num_slots)
                key = torch.randn((t, hkv, d), device=self.dev, generator=self.gen).to(dtype)
                val = torch.randn_like(key)
                slots = torch.randperm(num_slots, device=self.dev, generator=self.gen)[:t]
                slots[::3] = -1
                a, b = kc.clone(), vc.clone()
                c, e = kc.clone(), vc.clone()
                tk.reshape_and_cache(key, val, a, b, slots)
                ref.reshape_and_cache(key, val, c, e, slots)
                ok = torch.equal(a.view(torch.uint8), c.view(torch.uint8)) and torch.equal(b.view(torch.uint8), e.view(torch.uint8))
                self.check(f"reshape_and_cache {str(dtype)[6:]} h{hkv} d{d} bs{bs}", ok)

                layers = 4
                ks = [torch.randn_like(kc) for _ in range(layers)]
                vs = [torch.randn_like(kc) for _ in range(layers)]
                mapping = [(0, 5), (3, 7), (0, 11), (2, 1)]
                k2, v2 = [x.clone() for x in ks], [x.clone() for x in vs]
                tk.copy_blocks(ks, vs, mapping)
                ref.copy_blocks(k2, v2, mapping)
                ok = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(ks + vs, k2 + v2))
                self.check(f"copy_blocks {str(dtype)[6:]} h{hkv} d{d} bs{bs} x{layers} layers", ok)

                for pinned in ((False,) if self.smoke else (True, False)):
                    host = torch.zeros((6,) + tuple(kc.shape[1:]), dtype=dtype, pin_memory=pinned)
                    kernels.swap_blocks([kc], [host], [(4, 0), (9, 5)])
                    ok = torch.equal(host[0].view(torch.uint8), kc[4].cpu().view(torch.uint8)) and \
                        torch.equal(host[5].view(torch.uint8), kc[9].cpu().view(torch.uint8))
                    back = torch.zeros_like(kc)
                    kernels.swap_blocks(host, back, [(0, 2), (5, 3)])
                    self.sync()
                    ok = ok and torch.equal(back[2], kc[4]) and torch.equal(back[3], kc[9]) and \
                        torch.count_nonzero(back[0]).item() == 0
                    self.check(f"swap_blocks out+in {str(dtype)[6:]} bs{bs} pinned={pinned}", ok)
        self.sync()
        log(f"correctness: {sum(c['ok'] for c in self.r['checks'])}/{len(self.r['checks'])} ok")

    def _pool(self, shape_name, num_seqs, ctx, block_size, dtype):
        torch = self.torch
        h, hkv, d = SHAPES[shape_name]
        nbps = -(-ctx // block_size)
        num_blocks = num_seqs * nbps
        kc = torch.randn((num_blocks, block_size, hkv, d), device=self.dev, dtype=dtype, generator=self.gen)
        vc = torch.randn_like(kc)
        bt = torch.randperm(num_blocks, device=self.dev, generator=self.gen).to(torch.int32).reshape(num_seqs, nbps)
        return kc, vc, bt

    def _dense(self, kc, bt, num_seqs, ctx):
        # [S, Hkv, T, D] contiguous: the same K/V, laid out densely for SDPA
        _, bs, hkv, d = kc.shape
        n = bt.shape[1]
        x = kc[bt.long()].reshape(num_seqs, n * bs, hkv, d)[:, :ctx]
        return x.permute(0, 2, 1, 3).contiguous()

    def _sdpa_fns(self, q, kd, vd, forced_backends=True):
        torch = self.torch
        F = torch.nn.functional
        h, hkv = q.shape[1], kd.shape[1]
        q4 = q.unsqueeze(2)  # [S, H, 1, D]
        fns = {}
        try:
            F.scaled_dot_product_attention(q4[:1], kd[:1], vd[:1], enable_gqa=True)
            fns["sdpa_gqa"] = lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)
        except (TypeError, RuntimeError):
            pass
        if not forced_backends and fns:
            return fns
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                                  ("sdpa_cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None))):
                if backend is None:
                    continue

                def fn(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)
                try:
                    fn()
                    fns[name] = fn
                except (TypeError, RuntimeError):
                    pass
        except ImportError:
            pass
        if not fns:  # very old torch: expand the KV heads
            ke = kd.repeat_interleave(h // hkv, dim=1)
            ve = vd.repeat_interleave(h // hkv, dim=1)
            fns["sdpa_expanded"] = lambda: F.scaled_dot_product_attention(q4, ke, ve)
        return fns

    def decode_sweep(self):
        torch, tk = self.torch, self.tk
        dtype = torch.bfloat16
        bs = 16
        for shape_name in ("llama8b", "smollm2"):
            h, hkv, d = SHAPES[shape_name]
            max_s, max_ctx = max(self.sweep_seqs), max(self.sweep_ctx + (self.target_point[1],))
            log(f"decode sweep {shape_name} (h{h}/{hkv} d{d} bf16 bs{bs})")
            kc, vc, bt_full = self._pool(shape_name, max_s, max_ctx, bs, dtype)
            configs = [(s, c) for s in self.sweep_seqs for c in self.sweep_ctx] + [self.target_point]
            for s, c in configs:
                n = -(-c // bs)
                bt = bt_full[:s, :n].contiguous()
                lens = torch.full((s,), c, dtype=torch.int32, device=self.dev)
                q = torch.randn((s, h, d), device=self.dev, dtype=dtype, generator=self.gen)
                out = torch.empty_like(q)
                kv_bytes = 2 * s * c * hkv * d * kc.element_size()
                paged = lambda: tk.paged_attention_decode_unchecked(q, kc, vc, bt, lens, None, out, max_context_len=c)
                checked = lambda: tk.paged_attention_decode(q, kc, vc, bt, lens, None, out)
                _, launches = tk.plan_paged_attention_decode(q, kc, vc, bt, lens, None, out, max_context_len=c)
                t_paged = self.time_ms(paged)
                t_checked = self.time_ms(checked, rep=30)
                kd, vd = self._dense(kc, bt, s, c), self._dense(vc, bt, s, c)
                # forcing each SDPA backend is only tried where a backend that expands the
                # KV heads internally still fits in memory
                fns = self._sdpa_fns(q, kd, vd, forced_backends=kv_bytes <= (4 << 30))
                sdpa = {}
                for name, fn in list(fns.items()):
                    try:
                        sdpa[name] = self.time_ms(fn)
                    except torch.cuda.OutOfMemoryError:
                        fns.pop(name)
                        self.empty_cache()
                if not sdpa:
                    raise RuntimeError(f"no SDPA variant ran at {s} x {c}")
                # outputs agree with the dense baseline
                paged()
                ref_out = next(iter(fns.values()))().squeeze(2)
                err = (out.float() - ref_out.float()).abs().max().item()
                self.check(f"paged vs sdpa {shape_name} {s}x{c}", err < 2e-2, max_abs_err=err)
                best_name = min(sdpa, key=sdpa.get)
                entry = {
                    "shape": shape_name, "num_seqs": s, "context": c, "block_size": bs, "dtype": "bf16",
                    "num_partitions": launches[0].grid[2], "block_n": launches[0].kwargs["BLOCK_N"],
                    "kv_bytes": kv_bytes,
                    "paged_ms": round(t_paged, 4), "paged_checked_ms": round(t_checked, 4),
                    "paged_TBps": round(kv_bytes / (t_paged * 1e-3) / 1e12, 3),
                    "sdpa_ms": {k: round(v, 4) for k, v in sdpa.items()},
                    "sdpa_best": best_name,
                    "sdpa_best_TBps": round(kv_bytes / (sdpa[best_name] * 1e-3) / 1e12, 3),
                    "paged_over_sdpa_best": round(t_paged / sdpa[best_name], 3),
                }
                self.r["decode"].append(entry)
                log(f"  {s:4d} x {c:5d}: paged {t_paged * 1e3:8.1f} us ({entry['paged_TBps']:.2f} TB/s, "
                    f"P={entry['num_partitions']}), checked {t_checked * 1e3:8.1f} us, "
                    f"{best_name} {sdpa[best_name] * 1e3:8.1f} us -> x{entry['paged_over_sdpa_best']}")
                del kd, vd, fns
            del kc, vc, bt_full
            self.empty_cache()

    def block_size_sweep(self):
        if self.over_budget("block_sizes"):
            return
        torch, tk = self.torch, self.tk
        s, c = self.target_point
        for shape_name in ("llama8b", "smollm2"):
            h, hkv, d = SHAPES[shape_name]
            log(f"block sizes at {s} x {c} ({shape_name})")
            for bs in self.bs_sweep:
                kc, vc, bt = self._pool(shape_name, s, c, bs, torch.bfloat16)
                lens = torch.full((s,), c, dtype=torch.int32, device=self.dev)
                q = torch.randn((s, h, d), device=self.dev, dtype=torch.bfloat16, generator=self.gen)
                out = torch.empty_like(q)
                t = self.time_ms(lambda: tk.paged_attention_decode_unchecked(q, kc, vc, bt, lens, None, out,
                                                                            max_context_len=c))
                kv_bytes = 2 * s * c * hkv * d * 2
                self.r["block_sizes"].append({"shape": shape_name, "num_seqs": s, "context": c, "block_size": bs,
                                              "ms": round(t, 4), "TBps": round(kv_bytes / (t * 1e-3) / 1e12, 3)})
                log(f"  bs {bs:3d}: {t * 1e3:8.1f} us  {kv_bytes / (t * 1e-3) / 1e12:.2f} TB/s")
                del kc, vc
            self.empty_cache()

    def split_k_effect(self):
        if self.over_budget("split_k"):
            return
        torch, tk = self.torch, self.tk
        shape_name, bs = "llama8b", 16
        h, hkv, d = SHAPES[shape_name]
        log("split-K: heuristic vs forced partition counts")
        for s, c in self.split_points:
            kc, vc, bt = self._pool(shape_name, s, c, bs, torch.bfloat16)
            lens = torch.full((s,), c, dtype=torch.int32, device=self.dev)
            q = torch.randn((s, h, d), device=self.dev, dtype=torch.bfloat16, generator=self.gen)
            out = torch.empty_like(q)
            heur = tk.choose_num_partitions(s, hkv, c, tk.num_sms(q.device))
            row = {"num_seqs": s, "context": c, "heuristic_partitions": heur, "ms": {}}
            for p in sorted({1, 2, 4, 8, 16, 32, heur}):
                t = self.time_ms(lambda: tk.paged_attention_decode_unchecked(q, kc, vc, bt, lens, None, out,
                                                                            max_context_len=c, num_partitions=p), rep=30)
                row["ms"][str(p)] = round(t, 4)
            best = min(row["ms"], key=row["ms"].get)
            row["best_partitions"] = int(best)
            row["heuristic_over_best"] = round(row["ms"][str(heur)] / row["ms"][best], 3)
            self.r["split_k"].append(row)
            log(f"  {s} x {c}: heuristic P={heur} {row['ms'][str(heur)] * 1e3:.1f} us; "
                f"best P={best} {row['ms'][best] * 1e3:.1f} us; P=1 {row['ms']['1'] * 1e3:.1f} us")
            del kc, vc
        self.empty_cache()

    def tile_sweep(self):
        if self.over_budget("tuning"):
            return
        torch, tk = self.torch, self.tk
        (s, c), bs = self.target_point, 16
        for shape_name in ("llama8b", "smollm2"):
            h, hkv, d = SHAPES[shape_name]
            log(f"tile sweep at {s} x {c} ({shape_name})")
            kc, vc, bt = self._pool(shape_name, s, c, bs, torch.bfloat16)
            lens = torch.full((s,), c, dtype=torch.int32, device=self.dev)
            q = torch.randn((s, h, d), device=self.dev, dtype=torch.bfloat16, generator=self.gen)
            kv_bytes = 2 * s * c * hkv * d * 2
            variants = [(dot, bn, w, 2) for dot in (True, False) for bn in (16, 32, 64) for w in (4, 8)]
            default = tk.decode_config(torch.bfloat16, h // hkv, d)
            variants.append((True, default["block_n"], default["num_warps"], 3))
            for use_dot, block_n, warps, stages in variants:
                if time.perf_counter() - T0 > TIME_BUDGET_S + 15:
                    self.r["skipped"].append(f"tuning {shape_name} (partial)")
                    break
                row = {"shape": shape_name, "use_dot": use_dot, "block_n": block_n, "num_warps": warps,
                       "num_stages": stages}
                try:
                    out = torch.empty_like(q)
                    _, launches = tk.plan_paged_attention_decode(
                        q, kc, vc, bt, lens, None, out, max_context_len=c, use_dot=use_dot,
                        block_n=block_n, num_warps=warps, num_stages=stages)

                    def run(launches=launches):
                        for launch in launches:
                            launch()
                    t = self.time_ms(run, rep=25)
                    row.update(ms=round(t, 4), TBps=round(kv_bytes / (t * 1e-3) / 1e12, 3))
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                self.r["tuning"].append(row)
            ok = [x for x in self.r["tuning"] if x["shape"] == shape_name and "ms" in x]
            if ok:
                best = min(ok, key=lambda x: x["ms"])
                log(f"  best: {best}")
            del kc, vc
            self.empty_cache()

    def targets(self):
        s, c = self.target_point
        rows = [x for x in self.r["decode"] if x["shape"] == "llama8b" and x["num_seqs"] == s and x["context"] == c]
        if not rows:
            return
        x = rows[0]
        frac = x["paged_TBps"] / H200_COPY_TBPS
        self.r["targets"] = {
            "at": f"llama8b {s} x {c} bf16 bs16",
            "paged_TBps": x["paged_TBps"],
            "fraction_of_4.3TBps": round(frac, 3),
            "fraction_of_measured_copy": round(x["paged_TBps"] / max(self.r["copy_bandwidth_TBps"], 1e-9), 3),
            "bandwidth_target_met": frac >= TARGET_FRACTION,
            "paged_over_sdpa_best": x["paged_over_sdpa_best"],
            "sdpa_target_met": x["paged_over_sdpa_best"] <= TARGET_SDPA_RATIO,
        }


if __name__ == "__main__":
    sys.exit(main())
