"""PyTorch reference implementations of the paged-KV kernels.

These are the engine's real CPU data plane (the dispatcher in :mod:`kernels` routes CPU
tensors here) and the ground truth the Triton kernels are tested against. Every function
has the same signature as its Triton counterpart in :mod:`kernels.triton_kernels`.

Layouts (vLLM-style):

* ``q``: ``[num_seqs, num_heads, head_dim]`` (one decode token per sequence)
* ``k_cache`` / ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``
* ``block_tables``: int32 ``[num_seqs, max_blocks]`` physical block ids; only the first
  ``ceil(context_lens[i] / block_size)`` entries of row ``i`` are read
* ``context_lens``: int32 ``[num_seqs]``
* a *slot* is ``block_id * block_size + offset``

Query head ``h`` attends through KV head ``h // (num_heads // num_kv_heads)`` (the same
grouping as Hugging Face's ``repeat_kv``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import checks

__all__ = [
    "paged_attention_decode",
    "reshape_and_cache",
    "copy_blocks",
    "swap_blocks",
    "gather_kv",
]


def gather_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | Sequence[int],
    context_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous K and V of one sequence: two ``[context_len, num_kv_heads, head_dim]``
    tensors (copies, in the cache dtype) of the first ``context_len`` tokens reached through
    ``block_table``. Handy for prefill attention over a paged pool."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    context_len = int(context_len)
    if context_len == 0:
        empty = k_cache.new_empty((0, num_kv_heads, head_dim))
        return empty, v_cache.new_empty((0, num_kv_heads, head_dim))
    n = -(-context_len // block_size)
    bt = torch.as_tensor(block_table[:n] if not torch.is_tensor(block_table) else block_table[:n])
    bt = bt.to(device=k_cache.device, dtype=torch.long)
    if bt.numel() < n:
        raise ValueError(f"block table has {bt.numel()} entries, context {context_len} needs {n}")
    if n and (int(bt.min()) < 0 or int(bt.max()) >= num_blocks):
        raise ValueError(f"block table entries must lie in [0, {num_blocks})")
    k = k_cache.index_select(0, bt).reshape(n * block_size, num_kv_heads, head_dim)[:context_len]
    v = v_cache.index_select(0, bt).reshape(n * block_size, num_kv_heads, head_dim)[:context_len]
    return k, v


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-token (decode) attention of each sequence over its paged K/V.

    Vectorized: the used prefix of every block table is gathered (one ``index_select`` per
    pool) into a padded, head-major ``[num_kv_heads, num_seqs, max_ctx, head_dim]`` K/V;
    scores are computed in fp32 for all query heads of a KV group at once (a reshape, no
    repeat), padded positions are masked, and a sequence with context 0 gets zeros. Returns ``out`` (allocated like ``q`` if None).
    """
    max_ctx = checks.check_paged_attention(q, k_cache, v_cache, block_tables, context_lens, out)
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out

    if max_ctx == 0:
        out.zero_()
        return out
    lens = context_lens.to(dtype=torch.long)
    n = -(-max_ctx // block_size)
    bt = block_tables[:, :n].to(dtype=torch.long)
    # Entries past a sequence's own prefix may hold anything (padding): point them at block
    # 0; the positions they cover are masked below.
    used = torch.arange(n, device=bt.device) * block_size < lens[:, None]
    bt = torch.where(used, bt, torch.zeros_like(bt))
    # flat slot of every (sequence, position < max_ctx)
    slots = (bt[:, :, None] * block_size + torch.arange(block_size, device=bt.device)).reshape(num_seqs, -1)
    slots = slots[:, :max_ctx].reshape(-1)

    # One gather per pool straight into a head-major, contiguous [Hkv, S, T, D] (the batch
    # order of the matmuls does not matter, so q is permuted instead of K/V).
    # (Gather along the pool's leading, contiguous dim and permute the small result: an
    # index_select along dim 1 of the transposed pool copied the whole pool every call, so a
    # decode step cost O(pool size) instead of O(context).)
    def gather(cache: torch.Tensor) -> torch.Tensor:
        flat = cache.view(num_blocks * block_size, num_kv_heads, head_dim)
        x = flat.index_select(0, slots).view(num_seqs, max_ctx, num_kv_heads, head_dim)
        return x.permute(2, 0, 1, 3).to(dtype=torch.float32, memory_format=torch.contiguous_format)

    k = gather(k_cache)
    v = gather(v_cache)
    pad = torch.arange(max_ctx, device=q.device)[None, :] >= lens[:, None]  # [S, T]
    # Slots past a context (the tail of its last block, other sequences' padding) may hold
    # anything, NaN included: keep them out of P @ V, not only out of the softmax.
    if v.device.type == "cpu":
        for i, length in enumerate(context_lens.tolist()):
            if length < max_ctx:
                v[:, i, length:].zero_()
    else:
        v.masked_fill_(pad[None, :, :, None], 0.0)

    qg = q.float().reshape(num_seqs, num_kv_heads, group, head_dim).transpose(0, 1)  # [Hkv, S, G, D]
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [Hkv, S, G, T]
    scores.masked_fill_(pad[None, :, None, :], float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # context 0: all -inf
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p, v) / torch.where(denom > 0, denom, torch.ones_like(denom))  # [Hkv, S, G, D]
    out.copy_(o.transpose(0, 1).reshape(num_seqs, num_heads, head_dim))
    return out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into the pools at
    ``slot_mapping`` (``slot = block_id * block_size + offset``); slot -1 is skipped."""
    checks.check_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
    if key.shape[0] == 0:
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    keep = slots >= 0
    idx = slots[keep]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, idx, key[keep])
    v_flat.index_copy_(0, idx, value[keep])


def copy_blocks(
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Copy-on-write: for every ``(src, dst)`` pair, block ``dst`` of every layer's K and V
    pool becomes a copy of block ``src``."""
    mapping = checks.check_copy_blocks(k_caches, v_caches, block_mapping)
    if mapping.shape[0] == 0:
        return
    src = mapping[:, 0].to(k_caches[0].device)
    dst = mapping[:, 1].to(k_caches[0].device)
    for cache in list(k_caches) + list(v_caches):
        cache.index_copy_(0, dst, cache.index_select(0, src))


def swap_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for every ``(s, d)`` pair; the
    two pools may live on different devices (device <-> host swap). ``src``/``dst`` may
    also be equal-length lists of pools (one per layer / per K and V)."""
    pairs = checks.check_swap_blocks(src, dst, block_mapping)
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    dsts = list(dst) if isinstance(dst, (list, tuple)) else [dst]
    if pairs.shape[0] == 0:
        return
    for s_pool, d_pool in zip(srcs, dsts):
        s_idx = pairs[:, 0].to(s_pool.device)
        d_idx = pairs[:, 1].to(d_pool.device)
        d_pool.index_copy_(0, d_idx, s_pool.index_select(0, s_idx).to(d_pool.device))
