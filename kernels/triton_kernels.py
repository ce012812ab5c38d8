"""Triton kernels of the paged KV cache, with wrappers that validate every argument.

Same public signatures as :mod:`kernels.reference`. On CUDA tensors these run compiled Triton;
with ``TRITON_INTERPRET=1`` set before this module is imported, they run on the Triton CPU
interpreter (tests, demonstrations).

Every wrapper is split in two: ``plan_*`` validates nothing and returns the list of
:class:`Launch` records (kernel, grid, arguments) that it would run; the public function
validates, plans and launches. :mod:`kernels.aot` compiles exactly the planned launches for
sm_80 / sm_90 without a GPU, so the compile check sees the same specializations (constexprs,
dtypes, integer divisibility) as the runtime.

Paged decode attention (flash-decoding style):

* grid ``(num_seqs, num_kv_heads, num_partitions)``; one program handles all query heads of a
  KV group (padded to a power of two and masked) so each K/V tile is read once per group;
* the token axis is tiled by ``BLOCK_N`` tokens independently of the cache block size: the
  physical block of every token in a tile is gathered from the block table, so block sizes 1
  to 128 all use the same tile width (no ``tl.dot`` with K < 16);
* online softmax in the exp2 domain, fp32 state, fp16/bf16 inputs;
* with more than one partition each program writes an unnormalized partial
  ``(acc, max, sum)`` and ``_paged_attn_reduce_kernel`` merges them;
* scores and ``P @ V``: ``tl.dot`` for fp16/bf16 (query heads padded to 16 rows, operands
  widened to fp32 and multiplied as TF32, which holds fp16/bf16 values exactly), a broadcast-
  multiply-reduce for fp32 (exact fp32). Loads of fp16/bf16 are converted to fp32.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from . import checks

# True when the kernels were created as Triton-interpreter functions (TRITON_INTERPRET=1 at
# import time); they then run on CPU tensors (slowly) instead of compiling for a GPU.
INTERPRETED = bool(triton.knobs.runtime.interpret)

LOG2E = 1.4426950408889634
MIN_PARTITION_TOKENS = 256  # split-K never makes partitions shorter than this
MAX_PARTITIONS = 64
SPLIT_MIN_CONTEXT = 512  # contexts up to this never split
CPU_NUM_SMS = 8  # what the heuristic assumes for interpreted (CPU) launches

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


# ----------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------


# Run-time integers that vary between calls are not specialized (no recompiles when the batch
# or the partition count changes); strides derive from the model shape and block size.
@triton.jit(do_not_specialize=["num_heads", "partition_size", "num_partitions", "stride_bt_s"])
def _paged_attn_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    scale_log2,  # softmax scale * log2(e)
    num_heads, partition_size, num_partitions,
    stride_q_s, stride_q_h, stride_o_s, stride_o_h,
    stride_c_blk, stride_c_tok, stride_c_head, stride_bt_s,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq64 = seq.to(tl.int64)

    ctx = tl.load(context_lens_ptr + seq)
    start = part * partition_size
    end = tl.minimum(start + partition_size, ctx)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g

    q = tl.load(q_ptr + seq64 * stride_q_s + heads[:, None] * stride_q_h + offs_d[None, :],
                mask=g_mask[:, None], other=0.0).to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)

    bt_row = block_tables_ptr + seq64 * stride_bt_s
    head_off = kv_head.to(tl.int64) * stride_c_head
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + offs_n
        t_mask = toks < end
        blk = tl.load(bt_row + toks // BLOCK_SIZE, mask=t_mask, other=0)
        tok_off = blk.to(tl.int64) * stride_c_blk + (toks % BLOCK_SIZE) * stride_c_tok + head_off
        kv_off = tok_off[:, None] + offs_d[None, :]
        # both loads issued before any math: twice the bytes in flight per program
        k = tl.load(k_cache_ptr + kv_off, mask=t_mask[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        v = tl.load(v_cache_ptr + kv_off, mask=t_mask[:, None], other=0.0)
        if USE_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=DOT_PRECISION)
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(t_mask[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the tile has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if SPLIT:
        row = (seq64 * num_heads + heads) * num_partitions + part  # [GROUP_PAD]
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
    else:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # context 0 -> zeros
        tl.store(out_ptr + seq64 * stride_o_s + heads[:, None] * stride_o_h + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit(do_not_specialize=["num_heads", "num_partitions"])
def _paged_attn_reduce_kernel(
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    num_heads, num_partitions, stride_o_s, stride_o_h,
    HEAD_DIM: tl.constexpr, PART_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_p = tl.arange(0, PART_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    row0 = (seq.to(tl.int64) * num_heads + head) * num_partitions
    p_mask = offs_p < num_partitions
    m = tl.load(part_m_ptr + row0 + offs_p, mask=p_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + row0 + offs_p, mask=p_mask, other=0.0)
    live = p_mask & (l > 0)
    m_max = tl.max(tl.where(live, m, float("-inf")), axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every partition empty
    w = tl.where(live, tl.exp2(m - m_max), 0.0)
    acc = tl.load(part_acc_ptr + (row0 + offs_p)[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=live[:, None], other=0.0)
    num = tl.sum(acc * w[:, None], axis=0)
    den = tl.sum(l * w, axis=0)
    o = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + seq.to(tl.int64) * stride_o_s + head * stride_o_h + offs_d,
             o.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["stride_key_t", "stride_value_t"])
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_t, stride_value_t,
    ROW: tl.constexpr, CHUNK: tl.constexpr,
):
    tok = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = (offs < ROW) & (slot >= 0)  # slot -1: nothing is read or written
    tok64 = tok.to(tl.int64)
    k = tl.load(key_ptr + tok64 * stride_key_t + offs, mask=mask)
    v = tl.load(value_ptr + tok64 * stride_value_t + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


@triton.jit(do_not_specialize=["units_per_block"])
def _copy_blocks_kernel(
    k_ptrs_ptr, v_ptrs_ptr, mapping_ptr, units_per_block,
    CHUNK: tl.constexpr,
):
    """Copies block ``mapping[pair, 0]`` to ``mapping[pair, 1]`` in the K and V pool of
    ``layer``; pools are addressed through int64 tables of base addresses, in 2-byte units
    (bit-exact for any dtype of 2 or 4 bytes)."""
    layer = tl.program_id(0)
    pair = tl.program_id(1)
    chunk = tl.program_id(2)
    src = tl.load(mapping_ptr + 2 * pair)
    dst = tl.load(mapping_ptr + 2 * pair + 1)
    offs = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < units_per_block
    k_base = tl.load(k_ptrs_ptr + layer).to(tl.pointer_type(tl.int16))
    v_base = tl.load(v_ptrs_ptr + layer).to(tl.pointer_type(tl.int16))
    kx = tl.load(k_base + src * units_per_block + offs, mask=mask)
    tl.store(k_base + dst * units_per_block + offs, kx, mask=mask)
    vx = tl.load(v_base + src * units_per_block + offs, mask=mask)
    tl.store(v_base + dst * units_per_block + offs, vx, mask=mask)


# ----------------------------------------------------------------------------------------
# Launch plans
# ----------------------------------------------------------------------------------------


@dataclass
class Launch:
    """One kernel launch: ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        return getattr(fn, "__name__", str(fn))

    def __call__(self) -> None:
        if all(g > 0 for g in self.grid):
            self.kernel[self.grid](*self.args, **self.kwargs)


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


def choose_num_partitions(num_seqs: int, num_kv_heads: int, max_context_len: int, sms: int) -> int:
    """Split-K heuristic: split a long context only while the grid has fewer than ~2 waves of
    programs, and keep every partition at least ``MIN_PARTITION_TOKENS`` long. Returns a power
    of two in [1, MAX_PARTITIONS]."""
    if max_context_len <= SPLIT_MIN_CONTEXT:
        return 1
    programs = max(1, num_seqs * num_kv_heads)
    target = 2 * sms
    if programs >= target:
        return 1
    want = -(-target // programs)
    want = min(want, max_context_len // MIN_PARTITION_TOKENS, MAX_PARTITIONS)
    if want <= 1:
        return 1
    return 1 << (want.bit_length() - 1)  # round down to a power of two


def decode_config(dtype: torch.dtype, group: int, head_dim: int,
                  use_dot: bool | None = None, block_n: int | None = None) -> dict:
    """Tile shape and path of the decode kernel for one (dtype, GQA group, head_dim)."""
    if use_dot is None:
        use_dot = dtype != torch.float32
    group_pad = max(16, _next_pow2(group)) if use_dot else _next_pow2(group)
    if block_n is None:
        if use_dot:
            block_n = 64 if head_dim <= 64 else 32
        else:  # registers: GROUP_PAD * BLOCK_N * HEAD_DIM fp32 products per program
            block_n = max(16, min(64, _next_pow2(8192 // (group_pad * head_dim) + 1) // 2))
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    work = group_pad * block_n * head_dim  # fp32 products held per tile (no-dot path)
    num_warps = 4 if (use_dot or work <= 4096) else 8
    # fp16/bf16 values are exact in TF32 (10-bit mantissa), so the tensor-core TF32 dot loses
    # nothing on them but the rounding of the probabilities; fp32 inputs need IEEE.
    dot_precision = "ieee" if dtype == torch.float32 else "tf32"
    return dict(use_dot=bool(use_dot), group_pad=group_pad, block_n=block_n, num_warps=num_warps,
                dot_precision=dot_precision)


def plan_paged_attention_decode(
    q, k_cache, v_cache, block_tables, context_lens, scale=None, out=None, *,
    max_context_len: int | None = None, num_partitions: int | None = None,
    use_dot: bool | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None,
) -> tuple[torch.Tensor, list[Launch]]:
    """Allocates ``out`` (if None) and the split-K scratch, returns ``(out, launches)``.
    ``max_context_len`` bounds the context (default: ``max_blocks * block_size``, no sync)."""
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16, got {head_dim}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    cfg = decode_config(q.dtype, group, head_dim, use_dot, block_n)
    bn = cfg["block_n"]
    if num_partitions is None:
        num_partitions = choose_num_partitions(num_seqs, num_kv_heads, max_context_len, num_sms(q.device))
    num_partitions = min(MAX_PARTITIONS, max(1, int(num_partitions)))
    # partitions are whole tiles; drop the ones that would start past the longest context
    partition_size = max(bn, -(-max(max_context_len, 1) // num_partitions))
    partition_size = -(-partition_size // bn) * bn
    num_partitions = max(1, -(-max(max_context_len, 1) // partition_size))
    split = num_partitions > 1

    if split:
        part_acc = torch.empty((num_seqs, num_heads, num_partitions, head_dim), dtype=torch.float32, device=q.device)
        part_m = torch.empty((num_seqs, num_heads, num_partitions), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused (SPLIT=False)

    decode = Launch(
        _paged_attn_decode_kernel,
        (num_seqs, num_kv_heads, num_partitions),
        (q, k_cache, v_cache, block_tables, context_lens, out, part_acc, part_m, part_l,
         float(scale) * LOG2E, num_heads, partition_size, num_partitions,
         q.stride(0), q.stride(1), out.stride(0), out.stride(1),
         k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0)),
        dict(GROUP=group, GROUP_PAD=cfg["group_pad"], HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
             BLOCK_N=bn, USE_DOT=cfg["use_dot"], DOT_PRECISION=cfg["dot_precision"], SPLIT=split,
             num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or 2),
    )
    launches = [decode]
    if split:
        launches.append(Launch(
            _paged_attn_reduce_kernel,
            (num_seqs, num_heads),
            (out, part_acc, part_m, part_l, num_heads, num_partitions, out.stride(0), out.stride(1)),
            # one width for every partition count: no recompiles, one AOT specialization
            dict(HEAD_DIM=head_dim, PART_PAD=MAX_PARTITIONS, num_warps=4, num_stages=1),
        ))
    return out, launches


def plan_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping) -> list[Launch]:
    row = k_cache.shape[2] * k_cache.shape[3]
    chunk = min(_next_pow2(row), 2048)
    num_tokens = key.shape[0]
    return [Launch(
        _reshape_and_cache_kernel,
        (num_tokens, -(-row // chunk)),
        (key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0)),
        dict(ROW=row, CHUNK=chunk, num_warps=4 if chunk >= 512 else 1, num_stages=1),
    )]


COPY_CHUNK = 1024


def plan_copy_blocks(k_caches, v_caches, pairs: torch.Tensor) -> tuple[list[Launch], list[torch.Tensor]]:
    """``pairs``: CPU int64 [n, 2]. Returns the launches and the tensors they keep alive."""
    device = k_caches[0].device
    ref = k_caches[0]
    block_bytes = ref[0].numel() * ref.element_size() if ref.shape[0] else 0
    units = block_bytes // 2
    k_ptrs = torch.tensor([t.data_ptr() for t in k_caches], dtype=torch.int64, device=device)
    v_ptrs = torch.tensor([t.data_ptr() for t in v_caches], dtype=torch.int64, device=device)
    mapping = pairs.to(device=device, dtype=torch.int64).contiguous()
    launch = Launch(
        _copy_blocks_kernel,
        (len(k_caches), pairs.shape[0], -(-units // COPY_CHUNK)),
        (k_ptrs, v_ptrs, mapping, units),
        dict(CHUNK=COPY_CHUNK, num_warps=4, num_stages=1),
    )
    return [launch], [k_ptrs, v_ptrs, mapping]


# ----------------------------------------------------------------------------------------
# Public functions (same signatures as kernels.reference)
# ----------------------------------------------------------------------------------------


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    num_partitions: int | None = None,
    use_dot: bool | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Triton paged decode attention; see :func:`kernels.paged_attention_decode`. The
    keyword-only knobs force the split-K partition count, the score path and the tile width
    (tests and benchmarks); by default a heuristic picks them."""
    max_ctx = checks.check_paged_attention(q, k_cache, v_cache, block_tables, context_lens, out)
    out, launches = plan_paged_attention_decode(
        q, k_cache, v_cache, block_tables, context_lens, scale, out,
        max_context_len=max_ctx, num_partitions=num_partitions, use_dot=use_dot, block_n=block_n)
    for launch in launches:
        launch()
    return out


def paged_attention_decode_unchecked(
    q, k_cache, v_cache, block_tables, context_lens, scale=None, out=None, *,
    max_context_len: int | None = None, num_partitions: int | None = None,
) -> torch.Tensor:
    """No validation and no host sync: for benchmarks and callers that already validated."""
    out, launches = plan_paged_attention_decode(
        q, k_cache, v_cache, block_tables, context_lens, scale, out,
        max_context_len=max_context_len, num_partitions=num_partitions)
    for launch in launches:
        launch()
    return out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton slot-mapping scatter; see :func:`kernels.reshape_and_cache`."""
    checks.check_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
    for launch in plan_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping):
        launch()


def copy_blocks(
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Triton copy-on-write over all layers in one launch; see :func:`kernels.copy_blocks`."""
    pairs = checks.check_copy_blocks(k_caches, v_caches, block_mapping)
    if pairs.shape[0] == 0:
        return
    if k_caches[0].element_size() not in (2, 4):
        raise ValueError(f"copy_blocks supports 2- and 4-byte dtypes, got {k_caches[0].dtype}")
    launches, keep_alive = plan_copy_blocks(k_caches, v_caches, pairs)
    for launch in launches:
        launch()
    del keep_alive  # stream-ordered: the caching allocator keeps them until the kernel ran


def swap_blocks(
    src: torch.Tensor | Sequence[torch.Tensor],
    dst: torch.Tensor | Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Device <-> host block copies (plain torch): one batched gather, one DMA and one
    scatter per pool, through pinned staging memory when CUDA is involved. Swap-out (device
    -> host) synchronizes once at the end, so the host pool is readable on return; swap-in
    is stream-ordered and returns immediately."""
    pairs = checks.check_swap_blocks(src, dst, block_mapping)
    if pairs.shape[0] == 0:
        return
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    dsts = list(dst) if isinstance(dst, (list, tuple)) else [dst]
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    sync_devices: set[torch.device] = set()
    for s_pool, d_pool in zip(srcs, dsts):
        s_idx = pairs[:, 0].to(s_pool.device)
        d_idx = pairs[:, 1].to(d_pool.device)
        if s_pool.device == d_pool.device:
            d_pool.index_copy_(0, d_idx, s_pool.index_select(0, s_idx))
        elif s_pool.is_cuda and not d_pool.is_cuda:  # swap-out
            staged = s_pool.index_select(0, s_idx)
            host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            host.copy_(staged, non_blocking=True)
            pending.append((d_pool, d_idx, host))
            sync_devices.add(s_pool.device)
        elif d_pool.is_cuda and not s_pool.is_cuda:  # swap-in
            host = torch.empty((pairs.shape[0],) + tuple(s_pool.shape[1:]), dtype=s_pool.dtype, pin_memory=True)
            torch.index_select(s_pool, 0, s_idx, out=host)
            d_pool.index_copy_(0, d_idx, host.to(d_pool.device, non_blocking=True))
        else:  # two different GPUs
            d_pool.index_copy_(0, d_idx, s_pool.index_select(0, s_idx).to(d_pool.device))
    for dev in sync_devices:
        torch.cuda.current_stream(dev).synchronize()
    for d_pool, d_idx, host in pending:
        d_pool.index_copy_(0, d_idx, host)
