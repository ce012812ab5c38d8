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
import torch.nn.functional as F

from . import checks

__all__ = [
    "PagedDecode",
    "CacheWrite",
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


class PagedDecode:
    """Decode attention of one step's batch, run once per layer.

    Every layer of a decode step attends through the same block tables and context lengths, so
    they are validated, and turned into gather indices and a padding mask, once: on the first
    call. Each call (one layer: its query and its pools, of the shape the first call saw)
    gathers the used K/V slots of every sequence in one ``index_select`` per pool and runs one
    ``scaled_dot_product_attention`` over all sequences: the ``group`` query heads that share a
    KV head are presented as ``group`` queries of that head (a view of ``q``, no repeat), and the
    gathered ``[S, T, Hkv, D]`` K/V are viewed head-major without a copy.

    Padding positions (past a context, up to the longest) are masked out of the softmax and
    gather the sequence's own first slot instead of whatever the table or the pool holds there,
    so a poisoned slot (stale data, NaN) never reaches ``P @ V``; a sequence with context 0 gets
    zeros.
    """

    def __init__(self, block_tables: torch.Tensor, context_lens: torch.Tensor):
        self.block_tables = block_tables
        self.context_lens = context_lens
        self._layout = None  # (q shape, cache shape, dtype, device) of the first call
        self._slots = self._mask = self._empty = None
        self._max_ctx = 0

    def _plan(self, q, k_cache, v_cache, out) -> None:
        self._max_ctx = max_ctx = checks.check_paged_attention(
            q, k_cache, v_cache, self.block_tables, self.context_lens, out)
        self._layout = (tuple(q.shape), tuple(k_cache.shape), q.dtype, q.device)
        if q.shape[0] == 0 or max_ctx == 0:
            return
        block_size = k_cache.shape[1]
        dev = q.device
        lens = self.context_lens.to(dtype=torch.long)
        pos = torch.arange(max_ctx, device=dev)
        table = self.block_tables[:, : -(-max_ctx // block_size)].to(dtype=torch.long)
        slots = table[:, pos // block_size] * block_size + pos % block_size  # [S, T]
        valid = pos[None, :] < lens[:, None]
        empty = lens == 0
        # padding reads the sequence's first slot (slot 0 for an empty one): in range and finite
        first = torch.where(empty, 0, slots[:, 0])
        self._slots = torch.where(valid, slots, first[:, None]).reshape(-1)
        if bool(empty.any()):
            self._empty = empty
            valid[empty, 0] = True  # keep the softmax of an empty row finite; its output is zeroed
        if not bool(valid.all()):
            self._mask = valid[:, None, None, :]  # [S, 1, 1, T], broadcast over heads and the group

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        if self._layout is None:
            self._plan(q, k_cache, v_cache, out)
        elif ((tuple(q.shape), tuple(k_cache.shape), q.dtype, q.device) != self._layout
              or v_cache.shape != k_cache.shape or v_cache.dtype != q.dtype or k_cache.dtype != q.dtype
              or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(2) != 1):
            raise ValueError("PagedDecode: every layer must pass q and pools of the shape, dtype and "
                             "device of the first call (contiguous pools)")
        num_seqs, num_heads, head_dim = q.shape
        _, _, num_kv_heads, _ = k_cache.shape
        if out is not None and (out.shape != q.shape or out.dtype != q.dtype):
            raise ValueError(f"out must match q ({tuple(q.shape)}, {q.dtype})")
        if num_seqs == 0 or self._max_ctx == 0:
            return (torch.empty_like(q) if out is None else out).zero_()
        if scale is None:
            scale = 1.0 / math.sqrt(head_dim)
        T = self._max_ctx

        def gather(cache: torch.Tensor) -> torch.Tensor:  # [S, Hkv, T, D], a view of the gather
            flat = cache.view(-1, num_kv_heads, head_dim)
            return flat.index_select(0, self._slots).view(num_seqs, T, num_kv_heads, head_dim).transpose(1, 2)

        qg = q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
        o = F.scaled_dot_product_attention(qg, gather(k_cache), gather(v_cache), attn_mask=self._mask, scale=scale)
        o = o.view(num_seqs, num_heads, head_dim)  # (contiguous: no copy when ``out`` is None)
        if self._empty is not None:
            o.masked_fill_(self._empty[:, None, None], 0.0)
        return o if out is None else out.copy_(o)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-token (decode) attention of each sequence over its paged K/V: one layer's
    :class:`PagedDecode`. Returns ``out`` (allocated like ``q`` if None)."""
    return PagedDecode(block_tables, context_lens)(q, k_cache, v_cache, scale, out)


class CacheWrite:
    """The slot-mapping scatter of one step, run once per layer.

    The slot mapping is validated (and its skipped ``-1`` entries filtered) once, on the first
    call; every call then writes that layer's ``key``/``value [num_tokens, num_kv_heads,
    head_dim]`` into its pools with one ``index_copy_`` each.
    """

    def __init__(self, slot_mapping: torch.Tensor):
        self.slot_mapping = slot_mapping
        self._layout = None
        self._rows = self._idx = None

    def __call__(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        layout = (tuple(key.shape), tuple(k_cache.shape), key.dtype, key.device)
        if self._layout is None:
            checks.check_reshape_and_cache(key, value, k_cache, v_cache, self.slot_mapping)
            self._layout = layout
            slots = self.slot_mapping.to(device=k_cache.device, dtype=torch.long)
            keep = slots >= 0
            if bool(keep.all()):
                self._idx = slots
            else:
                self._rows = keep.nonzero().squeeze(1)
                self._idx = slots.index_select(0, self._rows)
        elif (layout != self._layout or value.shape != key.shape or v_cache.shape != k_cache.shape
              or {value.dtype, k_cache.dtype, v_cache.dtype} != {key.dtype}
              or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
            raise ValueError("CacheWrite: every layer must pass keys and pools of the shape, dtype and "
                             "device of the first call (contiguous pools)")
        if key.shape[0] == 0 or self._idx.numel() == 0:
            return
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        if self._rows is not None:
            key, value = key.index_select(0, self._rows), value.index_select(0, self._rows)
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, self._idx, key)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, self._idx, value)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into the pools at
    ``slot_mapping`` (``slot = block_id * block_size + offset``); slot -1 is skipped. One
    layer's :class:`CacheWrite`."""
    CacheWrite(slot_mapping)(key, value, k_cache, v_cache)


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
