"""Ahead-of-time compile check: every kernel specialization the engine uses compiles for
sm_90 (Hopper) and sm_80 (Ampere), with no GPU.

The test process runs with ``TRITON_INTERPRET=1`` (conftest), under which ``@triton.jit``
returns interpreter functions that cannot be compiled; so the compilation runs in a fresh
subprocess without it (``python -m kernels.aot``), with an empty Triton cache so that every
kernel is really compiled down to a cubin by the bundled ptxas.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PAGEDKV_KERNELS")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_specs_cover_the_engine():
    from kernels.aot import attention_specs

    specs = attention_specs()
    smol = {(s.dtype, s.block_size) for s in specs if (s.num_heads, s.num_kv_heads, s.head_dim) == (9, 3, 64)}
    for dtype in ("bf16", "fp32"):
        for bs in (1, 8, 16, 32, 64, 128):
            assert (dtype, bs) in smol
    assert {s.head_dim for s in specs} == {64, 128}
    assert {s.num_heads // s.num_kv_heads for s in specs} == {1, 3, 4, 8}
    assert {s.dtype for s in specs} == {"fp32", "fp16", "bf16"}


def test_all_specializations_compile_for_sm90_and_sm80(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kernels.aot", "-q", "-j", str(min(4, os.cpu_count() or 1))],
                       cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = [line for line in r.stdout.splitlines() if line.startswith("AOT:")]
    assert summary, r.stdout
    done, total = summary[0].split()[1].split("/")
    assert done == total and int(total) >= 100, summary[0]
    assert "sm_90" in summary[0] and "sm_80" in summary[0]


def test_aot_catches_gpu_only_errors(tmp_path):
    """The compile check is not vacuous: ``tl.dot`` with K < 16 runs on the interpreter but
    cannot compile for a GPU, and the same binding path reports it."""
    src = tmp_path / "bad_kernel.py"
    src.write_text(textwrap.dedent('''
        import torch, triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from kernels.aot import _compile_one
        from kernels.triton_kernels import Launch

        @triton.jit
        def small_dot(a_ptr, b_ptr, c_ptr, K: tl.constexpr):
            offs16 = tl.arange(0, 16)
            offs_k = tl.arange(0, K)
            a = tl.load(a_ptr + offs16[:, None] * K + offs_k[None, :])
            b = tl.load(b_ptr + offs_k[:, None] * 16 + offs16[None, :])
            tl.store(c_ptr + offs16[:, None] * 16 + offs16[None, :], tl.dot(a, b))

        a = torch.zeros(16, 16, dtype=torch.float16)
        for k in (8, 16):
            launch = Launch(small_dot, (1,), (a, a, a.float()), dict(K=k))
            desc, ok, err, _ = _compile_one(("k=%d" % k, launch, 90))
            print(k, ok, err)
    '''))
    r = subprocess.run([sys.executable, str(src)], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["8"].startswith("False"), r.stdout
    assert lines["16"].startswith("True"), r.stdout
