"""The real model: loader, our Llama forward over the paged pool, the runner and its sampler."""
from __future__ import annotations

import os

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPU_FLAGS_ENV = "PAGEDKV_CPU_FLAGS"
# The vector-ISA flags that decide the CPU's fast paths (oneDNN's GEMM kernels, native bf16), as
# /proc/cpuinfo names them: what a test run's machine line and a benchmark's result report.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8")


def _cpuinfo_flags() -> set[str] | None:
    """The CPU flags from ``/proc/cpuinfo`` (None where there is no such file: not Linux).

    ``PAGEDKV_CPU_FLAGS`` (space- or comma-separated) keeps only those of the real flags, so that
    a run can behave as on a CPU that lacks the others: ``PAGEDKV_CPU_FLAGS="avx2 fma"`` with
    ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` (which cap torch's own kernels) is how the
    README's test section emulates an AVX2-only machine. It can hide a flag, never add one."""
    flags = _proc_cpuinfo_flags()
    keep = os.environ.get(CPU_FLAGS_ENV)
    if flags is None or keep is None:
        return flags
    return flags & set(keep.replace(",", " ").split())


def _proc_cpuinfo_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def cpu_isa_flags() -> list[str] | None:
    """Which of :data:`ISA_FLAGS` this CPU has, in that order (narrowed by ``PAGEDKV_CPU_FLAGS`` as
    for the engine); None where there is no ``/proc/cpuinfo``."""
    flags = _cpuinfo_flags()
    return None if flags is None else [f for f in ISA_FLAGS if f in flags]


def cpu_model_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("" where there is no such file or line)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16), i.e. whether the bf16
    engine is worth offering: there its matmuls run 2-4x the fp32 rate; elsewhere oneDNN emulates
    bf16 and it is slower than fp32. Reads the flags in ``/proc/cpuinfo``; elsewhere asks torch."""
    flags = _cpuinfo_flags()
    if flags is not None:
        return bool(flags.intersection(BF16_CPU_FLAGS))
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)  # private: absent from some builds
    try:
        return bool(probe()) if probe is not None else False
    except Exception:
        return False
