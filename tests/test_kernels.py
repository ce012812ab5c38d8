"""Triton kernels vs the PyTorch references, on the Triton CPU interpreter.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports Triton, so the
``@triton.jit`` kernels here are interpreter functions running the real kernel code on numpy.
Shapes are kept small: the interpreter costs milliseconds per program and tile.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels import reference as ref
from kernels import triton_kernels as tk

ROOT = Path(__file__).resolve().parents[1]

TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    # bf16 keeps 8 significant bits: both sides round the output once (2^-8 relative), and
    # the dot path rounds the probabilities to TF32; allow two bf16 ulps at |o| ~ 1.
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


def test_runs_on_the_interpreter():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert tk.INTERPRETED


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


def make_case(lens, *, num_heads=9, num_kv_heads=3, head_dim=64, block_size=8,
              dtype=torch.float32, seed=0, spare_blocks=3, poison=True):
    """A random pool with shuffled block tables. Blocks that no sequence owns, the tail of
    every partially filled last block and the unused block-table entries are poisoned (NaN
    K/V, -1 / out-of-range ids), so a kernel that reads past a context fails loudly."""
    g = torch.Generator().manual_seed(seed)
    num_seqs = len(lens)
    need = [-(-n // block_size) for n in lens]
    max_blocks = max(1, max(need)) + 1  # one spare (unused) column
    num_blocks = sum(need) + spare_blocks
    k_cache = torch.randn((num_blocks, block_size, num_kv_heads, head_dim), generator=g).to(dtype)
    v_cache = torch.randn((num_blocks, block_size, num_kv_heads, head_dim), generator=g).to(dtype)
    q = torch.randn((num_seqs, num_heads, head_dim), generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    block_tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32)
    used = set()
    for i, n in enumerate(need):
        ids = [perm.pop() for _ in range(n)]
        used.update(ids)
        block_tables[i, :n] = torch.tensor(ids, dtype=torch.int32)
        if poison and n:
            tail = lens[i] - (n - 1) * block_size  # filled slots of the last block
            k_cache[ids[-1], tail:] = float("nan")
            v_cache[ids[-1], tail:] = float("nan")
        if i % 2:
            block_tables[i, n:] = num_blocks + 7  # garbage past the prefix is never read
    if poison:
        for b in range(num_blocks):
            if b not in used:
                k_cache[b] = float("nan")
                v_cache[b] = float("nan")
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, context_lens


def naive_attention(q, k_cache, v_cache, block_tables, context_lens, scale=None):
    """Per-sequence loop with explicit repeat_interleave: checks the reference itself."""
    num_seqs, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[2]
    scale = scale or 1.0 / math.sqrt(head_dim)
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i in range(num_seqs):
        n = int(context_lens[i])
        if n == 0:
            continue
        k, v = ref.gather_kv(k_cache, v_cache, block_tables[i], n)
        k = k.float().repeat_interleave(group, dim=1)
        v = v.float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,thd->ht", q[i].float(), k) * scale
        out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), v)
    return out


def run_both(case, scale=None, **triton_kwargs):
    out_t = tk.paged_attention_decode(*case, scale, **triton_kwargs)
    out_r = ref.paged_attention_decode(*case, scale)
    return out_t, out_r


def assert_close(a, b, dtype):
    assert not torch.isnan(a).any()
    torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


# ----------------------------------------------------------------------------------------
# reference vs naive
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_reference_matches_naive(block_size):
    case = make_case([0, 1, 13, 40], block_size=block_size, poison=False)
    out = ref.paged_attention_decode(*case)
    torch.testing.assert_close(out, naive_attention(*case), atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(out[0]) == 0


def test_reference_ignores_poisoned_slots():
    case = make_case([0, 1, 13, 40], block_size=8, poison=True)
    clean = make_case([0, 1, 13, 40], block_size=8, poison=False)
    out = ref.paged_attention_decode(*case)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref.paged_attention_decode(*clean))


def test_gather_kv():
    q, kc, vc, bt, lens = make_case([11], block_size=4, poison=False)
    k, v = ref.gather_kv(kc, vc, bt[0], 11)
    assert k.shape == (11, 3, 64)
    for t in range(11):
        blk = int(bt[0, t // 4])
        assert torch.equal(k[t], kc[blk, t % 4]) and torch.equal(v[t], vc[blk, t % 4])
    assert ref.gather_kv(kc, vc, bt[0].tolist(), 0)[0].shape == (0, 3, 64)


# ----------------------------------------------------------------------------------------
# paged attention: Triton (interpreted) vs reference
# ----------------------------------------------------------------------------------------


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [1, 2, 8, 16, 32, 128])
@pytest.mark.parametrize("num_partitions", [1, 3], ids=["nosplit", "split3"])
def test_decode_block_sizes(block_size, num_partitions, dtype):
    # ragged: empty, one token, a block boundary +-1, not multiples of the block size
    lens = [0, 1, block_size + 1, 2 * block_size - 1 if block_size > 1 else 37]
    lens = [min(n, 150) for n in lens]
    case = make_case(lens, block_size=block_size, seed=block_size, dtype=dtype)
    out_t, out_r = run_both(case, num_partitions=num_partitions)
    assert_close(out_t, out_r, dtype)
    assert torch.count_nonzero(out_t[0]) == 0
    if num_partitions > 1:  # the split really happened (the longest context spans > 1 tile)
        _, launches = tk.plan_paged_attention_decode(*case, max_context_len=max(lens),
                                                     num_partitions=num_partitions)
        assert launches[0].kwargs["SPLIT"] == (max(lens) > launches[0].kwargs["BLOCK_N"])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 2), (16, 2)],
                         ids=["gqa1", "gqa3", "gqa4", "gqa8"])
def test_decode_gqa_and_head_dims(num_heads, num_kv_heads, head_dim, dtype):
    case = make_case([1, 50, 23], num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, block_size=16, seed=num_heads + head_dim, dtype=dtype)
    out_t, out_r = run_both(case, num_partitions=2 if head_dim == 128 else 1)
    assert_close(out_t, out_r, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("use_dot", [False, True], ids=["reduce", "dot"])
@pytest.mark.parametrize("num_partitions", [1, 4], ids=["nosplit", "split4"])
def test_decode_dtypes_paths_split(dtype, use_dot, num_partitions):
    case = make_case([0, 1, 77, 130], block_size=16, dtype=dtype, seed=3)
    out_t, out_r = run_both(case, use_dot=use_dot, num_partitions=num_partitions, block_n=16)
    assert out_t.dtype == dtype
    assert_close(out_t, out_r, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_low_precision_close_to_fp32_truth(dtype):
    """Both sides against fp32 attention on the same (rounded) inputs: the bf16/fp16 error
    is the output rounding, not accumulated error."""
    case = make_case([5, 64, 33], block_size=8, dtype=dtype, seed=11)
    truth = naive_attention(*[t.float() if t.is_floating_point() else t for t in case])
    for out in run_both(case):
        assert_close(out, truth, dtype)


def test_split_k_partitions_shorter_than_tiles_and_empty_tails():
    # more partitions than non-empty tiles for the short sequences: empty partitions must merge
    # as zero weight, and a context of 0 must still give zeros
    case = make_case([0, 3, 200], block_size=4, seed=5)
    out_t, out_r = run_both(case, num_partitions=8, block_n=16)
    assert_close(out_t, out_r, torch.float32)
    assert torch.count_nonzero(out_t[0]) == 0


def test_split_heuristic():
    f = tk.choose_num_partitions
    assert f(1, 3, 128, 132) == 1  # short context never splits
    assert f(256, 8, 8192, 132) == 1  # grid already has many waves
    p = f(1, 3, 8192, 132)
    assert p > 1 and p & (p - 1) == 0 and p <= tk.MAX_PARTITIONS
    assert 8192 // p >= tk.MIN_PARTITION_TOKENS
    assert f(1, 3, 600, 132) <= 2
    assert f(64, 3, 4096, 132) >= 1
    # the interpreter default (8 "SMs") splits a long single sequence
    _, launches = tk.plan_paged_attention_decode(*make_case([2000], block_size=16, poison=False),
                                                 max_context_len=2000)
    assert len(launches) == 2 and launches[0].grid[2] > 1


def test_decode_heuristic_default_long_context():
    case = make_case([700, 3], block_size=32, seed=9)
    out_t, out_r = run_both(case)  # heuristic splits the 700-token sequence
    assert_close(out_t, out_r, torch.float32)


def test_decode_all_contexts_zero():
    case = make_case([0, 0], block_size=8)
    out = tk.paged_attention_decode(*case)
    assert torch.count_nonzero(out) == 0
    assert torch.count_nonzero(ref.paged_attention_decode(*case)) == 0


def test_decode_out_scale_and_strided_q():
    q, kc, vc, bt, lens = make_case([9, 30], block_size=8, seed=2)
    wide = torch.randn(2, 9, 128)
    wide[:, :, :64] = q
    q_view = wide[:, :, :64]  # last dim contiguous, other strides not
    out = torch.full((2, 9, 64), 7.0)
    r = tk.paged_attention_decode(q_view, kc, vc, bt, lens, 0.3, out)
    assert r is out
    torch.testing.assert_close(out, ref.paged_attention_decode(q, kc, vc, bt, lens, 0.3), atol=2e-5, rtol=2e-5)


def test_decode_empty_batch():
    q, kc, vc, bt, lens = make_case([4], block_size=8)
    for impl in (tk, ref):
        out = impl.paged_attention_decode(q[:0], kc, vc, bt[:0], lens[:0])
        assert out.shape == (0, 9, 64)


# ----------------------------------------------------------------------------------------
# validation: out-of-bounds access must be impossible from the public functions
# ----------------------------------------------------------------------------------------


def _bad_decode_cases():
    q, kc, vc, bt, lens = make_case([5, 12], block_size=8, poison=False)
    nb = kc.shape[0]
    bad_bt = bt.clone(); bad_bt[1, 1] = nb  # noqa: E702
    neg_bt = bt.clone(); neg_bt[0, 0] = -1  # noqa: E702
    yield "block id >= num_blocks", (q, kc, vc, bad_bt, lens)
    yield "negative block id", (q, kc, vc, neg_bt, lens)
    yield "context too long", (q, kc, vc, bt, torch.tensor([5, bt.shape[1] * 8 + 1], dtype=torch.int32))
    yield "negative context", (q, kc, vc, bt, torch.tensor([-1, 3], dtype=torch.int32))
    yield "int64 block table", (q, kc, vc, bt.long(), lens)
    yield "int64 context_lens", (q, kc, vc, bt, lens.long())
    yield "dtype mismatch", (q.half(), kc, vc, bt, lens)
    yield "heads not divisible", (q[:, :8], kc, vc, bt, lens)
    yield "head_dim mismatch", (q[:, :, :32], kc, vc, bt, lens)
    yield "non-contiguous cache", (q, kc.transpose(0, 1).contiguous().transpose(0, 1), vc, bt, lens)
    yield "block table rows", (q, kc, vc, bt[:1], lens)
    yield "non power-of-two block size", (q, kc[:, :6].contiguous(), vc[:, :6].contiguous(), bt, lens)


@pytest.mark.parametrize("impl", [tk, ref], ids=["triton", "reference"])
def test_decode_rejects_bad_arguments(impl):
    for what, args in _bad_decode_cases():
        with pytest.raises(ValueError):
            impl.paged_attention_decode(*args)
            pytest.fail(f"accepted: {what}")


def test_decode_garbage_past_prefix_is_accepted():
    # entries past ceil(len / block_size) are never read, so they may hold anything
    q, kc, vc, bt, lens = make_case([5, 12], block_size=8)
    bt[:, 2:] = 10**6
    out_t, out_r = run_both((q, kc, vc, bt, lens))
    assert_close(out_t, out_r, torch.float32)


# ----------------------------------------------------------------------------------------
# reshape_and_cache
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_reshape_and_cache(dtype, slot_dtype):
    g = torch.Generator().manual_seed(1)
    num_blocks, block_size, hkv, d = 6, 4, 3, 64
    k_cache = torch.randn((num_blocks, block_size, hkv, d), generator=g).to(dtype)
    v_cache = torch.randn((num_blocks, block_size, hkv, d), generator=g).to(dtype)
    key = torch.randn((7, hkv, d), generator=g).to(dtype)
    value = torch.randn((7, hkv, d), generator=g).to(dtype)
    slots = torch.tensor([3, -1, 0, 23, -1, 9, 14], dtype=slot_dtype)

    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expect_k[s // block_size, s % block_size] = key[t]
            expect_v[s // block_size, s % block_size] = value[t]

    for impl in (tk, ref):
        kc, vc = k_cache.clone(), v_cache.clone()
        impl.reshape_and_cache(key, value, kc, vc, slots)
        # bit-exact, and every slot not in the mapping untouched
        assert torch.equal(kc.view(torch.uint8), expect_k.view(torch.uint8)), impl.__name__
        assert torch.equal(vc.view(torch.uint8), expect_v.view(torch.uint8)), impl.__name__


def test_reshape_and_cache_all_skipped_and_strided_tokens():
    kc = torch.randn(2, 8, 2, 64)
    vc = torch.randn(2, 8, 2, 64)
    qkv = torch.randn(3, 3, 2, 64)  # [tokens, (q, k, v), heads, dim]: strided key/value views
    for impl in (tk, ref):
        a, b = kc.clone(), vc.clone()
        impl.reshape_and_cache(qkv[:, 1], qkv[:, 2], a, b, torch.full((3,), -1))
        assert torch.equal(a, kc) and torch.equal(b, vc)
        impl.reshape_and_cache(qkv[:, 1], qkv[:, 2], a, b, torch.tensor([15, 0, 8]))
        assert torch.equal(a[1, 7], qkv[0, 1]) and torch.equal(b[1, 7], qkv[0, 2])
        assert torch.equal(a[0, 0], qkv[1, 1]) and torch.equal(b[0, 0], qkv[1, 2])
        assert torch.equal(a[1, 0], qkv[2, 1]) and torch.equal(b[1, 0], qkv[2, 2])


@pytest.mark.parametrize("impl", [tk, ref], ids=["triton", "reference"])
def test_reshape_and_cache_rejects_bad_arguments(impl):
    kc = torch.zeros(2, 4, 3, 64)
    vc = torch.zeros(2, 4, 3, 64)
    key = torch.zeros(2, 3, 64)
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 8]))  # 8 == num_slots
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key, key, kc, vc, torch.tensor([0, -2]))
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key, key, kc, vc, torch.tensor([0]))  # length
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key.half(), key.half(), kc, vc, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key[:, :2], key[:, :2], kc, vc, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        impl.reshape_and_cache(key, key, kc, vc, torch.tensor([0.0, 1.0]))


# ----------------------------------------------------------------------------------------
# copy_blocks / swap_blocks: bit-exact
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_copy_blocks_bit_exact(dtype):
    g = torch.Generator().manual_seed(4)
    layers = 3
    k_caches = [torch.randn((8, 4, 3, 64), generator=g).to(dtype) for _ in range(layers)]
    v_caches = [torch.randn((8, 4, 3, 64), generator=g).to(dtype) for _ in range(layers)]
    # bit patterns a float round trip could change: NaN payloads, -0.0, denormals
    k_caches[0].view(-1)[:4] = torch.tensor([float("nan"), -0.0, 1e-40, float("-inf")]).to(dtype)
    mapping = [(1, 5), (2, 0), (1, 7)]
    expect_k = [c.clone() for c in k_caches]
    expect_v = [c.clone() for c in v_caches]
    for c in expect_k + expect_v:
        for s, d in mapping:
            c[d] = c[s]
    for impl in (tk, ref):
        kc = [c.clone() for c in k_caches]
        vc = [c.clone() for c in v_caches]
        impl.copy_blocks(kc, vc, mapping)
        for got, exp in zip(kc + vc, expect_k + expect_v):
            assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8)), impl.__name__
    # a tensor mapping and an empty mapping
    kc = [c.clone() for c in k_caches]
    vc = [c.clone() for c in v_caches]
    tk.copy_blocks(kc, vc, torch.tensor(mapping))
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(kc, expect_k))
    tk.copy_blocks(kc, vc, [])


@pytest.mark.parametrize("impl", [tk, ref], ids=["triton", "reference"])
def test_copy_blocks_rejects_bad_arguments(impl):
    kc = [torch.zeros(4, 2, 1, 16) for _ in range(2)]
    vc = [torch.zeros(4, 2, 1, 16) for _ in range(2)]
    for mapping in ([(0, 4)], [(-1, 2)], [(0, 1), (2, 1)], [(0, 1), (1, 2)], [(0, 1, 2)]):
        with pytest.raises(ValueError):
            impl.copy_blocks(kc, vc, mapping)
    with pytest.raises(ValueError):
        impl.copy_blocks(kc, vc[:1], [(0, 1)])
    with pytest.raises(ValueError):
        impl.copy_blocks(kc, [torch.zeros(4, 2, 1, 16, dtype=torch.float16)] * 2, [(0, 1)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swap_blocks_bit_exact(dtype):
    g = torch.Generator().manual_seed(6)
    device_pool = torch.randn((6, 4, 3, 64), generator=g).to(dtype)
    host_pool = torch.randn((5, 4, 3, 64), generator=g).to(dtype)
    device_pool.view(-1)[0] = float("nan")
    out_map = [(0, 4), (3, 1)]
    for impl in (tk, kernels, ref):
        host = host_pool.clone()
        impl.swap_blocks(device_pool, host, out_map)
        expect = host_pool.clone()
        expect[4], expect[1] = device_pool[0], device_pool[3]
        assert torch.equal(host.view(torch.uint8), expect.view(torch.uint8))
        # and back, as lists of pools
        dev = [torch.zeros_like(device_pool), torch.zeros_like(device_pool)]
        impl.swap_blocks([host, host], dev, torch.tensor([(4, 2), (1, 5)]))
        for d in dev:
            assert torch.equal(d[2].view(torch.uint8), device_pool[0].view(torch.uint8))
            assert torch.equal(d[5].view(torch.uint8), device_pool[3].view(torch.uint8))
            assert torch.count_nonzero(d[0]) == 0


def test_swap_blocks_rejects_bad_arguments():
    a = torch.zeros(4, 2, 1, 16)
    b = torch.zeros(2, 2, 1, 16)
    with pytest.raises(ValueError):
        kernels.swap_blocks(a, b, [(3, 2)])  # dst out of range
    with pytest.raises(ValueError):
        kernels.swap_blocks(b, a, [(2, 0)])  # src out of range
    with pytest.raises(ValueError):
        kernels.swap_blocks(a, b, [(0, 1), (2, 1)])
    with pytest.raises(ValueError):
        kernels.swap_blocks(a, b.half(), [(0, 1)])


def test_alloc_host_cache():
    t = kernels.alloc_host_cache((3, 2, 1, 4), torch.float32)
    assert t.shape == (3, 2, 1, 4) and torch.count_nonzero(t) == 0
    assert t.is_pinned() == torch.cuda.is_available()


# ----------------------------------------------------------------------------------------
# dispatcher
# ----------------------------------------------------------------------------------------


def test_dispatcher_routes_by_backend(monkeypatch):
    case = make_case([3, 17], block_size=8, poison=False)
    calls = []
    monkeypatch.setattr(tk, "paged_attention_decode", lambda *a, **k: calls.append("triton") or "t")
    monkeypatch.setattr(ref, "paged_attention_decode", lambda *a, **k: calls.append("reference") or "r")
    outer = kernels.get_backend()
    with kernels.use_backend("auto"):
        assert kernels.paged_attention_decode(*case) == "r"  # CPU tensors -> reference
        with kernels.use_backend("triton"):
            assert kernels.get_backend() == "triton"
            assert kernels.paged_attention_decode(*case) == "t"
        with kernels.use_backend("reference"):
            assert kernels.paged_attention_decode(*case) == "r"
        assert kernels.get_backend() == "auto"
    assert kernels.get_backend() == outer
    assert calls == ["reference", "triton", "reference"]
    with pytest.raises(ValueError):
        kernels.set_backend("cuda")


def test_dispatcher_triton_backend_end_to_end():
    case = make_case([0, 9, 40], block_size=8, seed=8, poison=False)
    with kernels.use_backend("triton"):
        out_t = kernels.paged_attention_decode(*case)
        kc, vc = case[1].clone(), case[2].clone()
        kernels.reshape_and_cache(case[0][:, :3], case[0][:, 3:6], kc, vc, torch.tensor([0, -1, 5]))
        kernels.copy_blocks([kc], [vc], [(0, 1)])
    with kernels.use_backend("reference"):
        out_r = kernels.paged_attention_decode(*case)
    assert_close(out_t, out_r, torch.float32)
    assert torch.equal(kc[1], kc[0]) and torch.equal(kc[0, 0], case[0][0, :3])


def _run_python(code: str, **env_overrides) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PAGEDKV_KERNELS")}
    env.update(env_overrides)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_triton_backend_on_cpu_without_interpreter_is_a_clear_error():
    code = (
        "import torch, kernels\n"
        "assert kernels.get_backend() == 'triton'\n"
        "q = torch.zeros(1, 1, 16); kc = torch.zeros(1, 1, 1, 16)\n"
        "bt = torch.zeros(1, 1, dtype=torch.int32); n = torch.ones(1, dtype=torch.int32)\n"
        "try:\n"
        "    kernels.paged_attention_decode(q, kc, kc, bt, n)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    r = _run_python(code, PAGEDKV_KERNELS="triton")
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "TRITON_INTERPRET=1" in r.stdout


def test_env_var_selects_backend_and_rejects_unknown():
    r = _run_python("import kernels; print(kernels.get_backend())", PAGEDKV_KERNELS="reference")
    assert r.stdout.strip() == "reference", r.stderr
    r = _run_python("import kernels", PAGEDKV_KERNELS="gpu")
    assert r.returncode != 0 and "unknown kernels backend" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_check_script_refuses_without_cuda():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kernels.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "CUDA" in r.stderr
