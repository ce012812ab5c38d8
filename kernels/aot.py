"""Ahead-of-time compile check: every kernel specialization the engine uses must compile for
Hopper (sm_90) and Ampere (sm_80). Needs no GPU (Triton ships ptxas).

The launches are produced by the same ``plan_*`` functions the wrappers use, from small CPU
tensors with the engine's shapes, and are bound exactly as ``JITFunction.run`` binds them, so
the compiled specializations (constexprs, dtypes, integer and pointer divisibility) are the
ones a GPU run would compile. Compilations that coincide are done once.

Run::

    python -m kernels.aot                 # all specializations, sm_90 and sm_80
    python -m kernels.aot --arch 90 -j 4  # one arch, 4 processes

It refuses to run with ``TRITON_INTERPRET=1`` (the kernels would be interpreter functions).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class AttnSpec:
    """One attention shape the engine (or the issue) runs."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int


def attention_specs() -> list[AttnSpec]:
    specs = []
    # SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64; bf16 and fp32 on the GPU; the
    # contiguous baseline is block size 1.
    for dtype in ("bf16", "fp32"):
        for bs in (1, 8, 16, 32, 64, 128):
            specs.append(AttnSpec("smollm2", 9, 3, 64, dtype, bs))
    # The head dims and GQA ratios (1, 3, 4, 8) in bf16, and fp16/fp32 once per head
    # dim, at a common block size.
    for head_dim in (64, 128):
        for heads, kv in ((8, 8), (9, 3), (16, 4), (32, 4)):
            specs.append(AttnSpec(f"gqa{heads // kv}", heads, kv, head_dim, "bf16", 16))
        specs.append(AttnSpec("gqa4", 16, 4, head_dim, "fp16", 16))
        specs.append(AttnSpec("gqa4", 16, 4, head_dim, "fp32", 16))
    return specs


def _launches_for(spec: AttnSpec):
    """All launches (decode with and without split-K, every reduce width the heuristic can
    pick, the scatter, the block copy) for one spec, from small CPU tensors."""
    from . import triton_kernels as tk

    dtype = DTYPES[spec.dtype]
    bs = spec.block_size
    num_blocks = 4
    max_blocks = 4
    k_cache = torch.zeros((num_blocks, bs, spec.num_kv_heads, spec.head_dim), dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    launches = []
    for num_seqs in (1, 3):
        q = torch.zeros((num_seqs, spec.num_heads, spec.head_dim), dtype=dtype)
        bt = torch.zeros((num_seqs, max_blocks), dtype=torch.int32)
        lens = torch.ones((num_seqs,), dtype=torch.int32)
        parts = [1] + [1 << i for i in range(1, tk.MAX_PARTITIONS.bit_length())]
        for p in parts:
            # a (virtual) context long enough for p partitions; only the plan is built
            ctx = p * tk.MIN_PARTITION_TOKENS
            _, ls = tk.plan_paged_attention_decode(q, k_cache, v_cache, bt, lens, None, None,
                                                   max_context_len=ctx, num_partitions=p)
            launches += ls
    for num_tokens in (1, 5):
        key = torch.zeros((num_tokens, spec.num_kv_heads, spec.head_dim), dtype=dtype)
        slots = torch.zeros((num_tokens,), dtype=torch.int64)
        launches += tk.plan_reshape_and_cache(key, key.clone(), k_cache, v_cache, slots)
        launches += tk.plan_reshape_and_cache(key, key.clone(), k_cache, v_cache, slots.int())
    pairs = torch.tensor([[0, 1]], dtype=torch.long)
    ls, _ = tk.plan_copy_blocks([k_cache], [v_cache], pairs)
    launches += ls
    return launches


def bind(launch, target):
    """``(key, ASTSource, options)`` exactly as ``JITFunction.run`` would compile ``launch``."""
    import triton
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = bool(kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug)
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    src = ASTSource(fn, signature, constexprs, attrs)
    key = (target.arch, fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
           repr(sorted(attrs.items())), options.num_warps, options.num_stages)
    return key, src, options


def collect(archs=(90, 80)):
    """Deduplicated ``[(key, description, launch, arch)]`` over all specs and archs."""
    from triton.backends.compiler import GPUTarget

    seen = {}
    for spec in attention_specs():
        for launch in _launches_for(spec):
            for arch in archs:
                key, _, _ = bind(launch, GPUTarget("cuda", arch, 32))
                if key not in seen:
                    consts = {k: v for k, v in launch.kwargs.items() if k[0].isupper()}
                    desc = f"sm_{arch} {launch.name} {spec.name} {spec.dtype} bs={spec.block_size} {consts}"
                    seen[key] = (desc, launch, arch)
    return [(k, *v) for k, v in seen.items()]


_ITEMS: list | None = None
_ARCHS: tuple = ()


def _items(archs):
    global _ITEMS, _ARCHS
    if _ITEMS is None or _ARCHS != tuple(archs):
        _ITEMS = [(desc, launch, arch) for _, desc, launch, arch in collect(archs)]
        _ARCHS = tuple(archs)
    return _ITEMS


def _compile_index(args):
    archs, index = args
    return _compile_one(_items(archs)[index])


def _compile_one(item):
    import triton
    from triton.backends.compiler import GPUTarget

    desc, launch, arch = item
    t0 = time.perf_counter()
    try:
        _, src, options = bind(launch, GPUTarget("cuda", arch, 32))
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options.__dict__)
        ok = bool(compiled.asm.get("cubin"))
        err = "" if ok else "no cubin produced"
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        ok, err = False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return desc, ok, err, time.perf_counter() - t0


def _worker_init():
    os.environ.pop("TRITON_INTERPRET", None)


def run(archs=(90, 80), jobs: int | None = None, verbose: bool = False) -> list[tuple[str, bool, str, float]]:
    from . import triton_kernels as tk

    if tk.INTERPRETED:
        raise RuntimeError("kernels.aot must run without TRITON_INTERPRET=1 (the kernels are "
                           "interpreter functions); run it in a fresh process")
    archs = tuple(archs)
    items = _items(archs)
    jobs = jobs or min(len(items), os.cpu_count() or 1)
    if jobs <= 1:
        results = [_compile_one(it) for it in items]
    else:
        # kernels do not pickle: each worker rebuilds the (deterministic) list and takes indices
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init) as ex:
            results = list(ex.map(_compile_index, [(archs, i) for i in range(len(items))], chunksize=1))
    if verbose:
        for desc, ok, err, dt in results:
            print(f"{'ok  ' if ok else 'FAIL'} {dt:5.1f}s {desc}{'  ' + err if err else ''}")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, action="append", help="compute capability, e.g. 90 (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    archs = tuple(args.arch or (90, 80))
    t0 = time.perf_counter()
    results = run(archs, args.jobs, verbose=not args.quiet)
    failed = [r for r in results if not r[1]]
    print(f"AOT: {len(results) - len(failed)}/{len(results)} specializations compiled for "
          f"{', '.join(f'sm_{a}' for a in archs)} in {time.perf_counter() - t0:.1f}s")
    for desc, _, err, _ in failed:
        print(f"FAILED: {desc}: {err}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
