"""Argument validation shared by the reference and the Triton wrappers.

An out-of-bounds index inside a Triton kernel reads or writes someone else's memory without
any error, so every public entry point checks shapes, dtypes, devices, contiguity and index
ranges here before launching anything. (On CUDA the range checks cost one small reduction and
a host sync each; the benchmark times the unchecked launcher separately.)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fail(msg: str) -> None:
    raise ValueError(msg)


def _any(mask: torch.Tensor) -> bool:
    return bool(mask.any().item()) if mask.numel() else False


def check_paged_attention(q, k_cache, v_cache, block_tables, context_lens, out=None) -> int:
    """Returns the longest context (0 for an empty batch)."""
    if q.dim() != 3:
        _fail(f"q must be [num_seqs, num_heads, head_dim], got {tuple(q.shape)}")
    if k_cache.dim() != 4:
        _fail(f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        _fail(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kd = k_cache.shape
    if kd != head_dim:
        _fail(f"head_dim mismatch: q has {head_dim}, cache has {kd}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        _fail(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if q.dtype not in FLOAT_DTYPES:
        _fail(f"unsupported dtype {q.dtype}; use float32, float16 or bfloat16")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(f"dtype mismatch: q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}")
    if block_size < 1 or block_size & (block_size - 1):
        _fail(f"block_size must be a power of two, got {block_size}")
    devs = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    if len(devs) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        _fail("k_cache and v_cache must be contiguous")
    if q.stride(2) != 1:
        _fail("q must be contiguous in its last dimension")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        _fail(f"block_tables must be int32 [num_seqs={num_seqs}, max_blocks], got "
              f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.shape != (num_seqs,):
        _fail(f"context_lens must be int32 [num_seqs={num_seqs}], got "
              f"{context_lens.dtype} {tuple(context_lens.shape)}")
    if block_tables.stride(1) != 1:
        _fail("block_tables must be contiguous in its last dimension")
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            _fail(f"out must match q ({tuple(q.shape)}, {q.dtype}, {q.device}); got "
                  f"{tuple(out.shape)}, {out.dtype}, {out.device}")
        if out.stride(2) != 1:
            _fail("out must be contiguous in its last dimension")
    if num_seqs == 0:
        return 0
    # One host sync for all range checks (and the longest context, which the caller needs).
    max_blocks = block_tables.shape[1]
    lens = context_lens.long()
    bad_len = ((lens < 0) | (lens > max_blocks * block_size)).any()
    if max_blocks:
        used = torch.arange(max_blocks, device=lens.device)[None, :] * block_size < lens[:, None]
        bad_bt = (used & ((block_tables < 0) | (block_tables >= num_blocks))).any()
    else:
        bad_bt = torch.zeros((), dtype=torch.bool, device=lens.device)
    bad_len, bad_bt, max_ctx = torch.stack([bad_len.long(), bad_bt.long(), lens.max()]).tolist()
    if bad_len:
        _fail(f"context_lens must lie in [0, max_blocks * block_size = {max_blocks * block_size}]")
    if bad_bt:
        _fail(f"block_tables entries within each context must lie in [0, num_blocks={num_blocks})")
    return int(max_ctx)


def check_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    if key.dim() != 3 or value.shape != key.shape:
        _fail(f"key/value must both be [num_tokens, num_kv_heads, head_dim], got "
              f"{tuple(key.shape)} and {tuple(value.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        _fail(f"k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
              f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if tuple(key.shape[1:]) != tuple(k_cache.shape[2:]):
        _fail(f"key heads/dims {tuple(key.shape[1:])} do not match the cache {tuple(k_cache.shape[2:])}")
    dtypes = {key.dtype, value.dtype, k_cache.dtype, v_cache.dtype}
    if len(dtypes) != 1 or key.dtype not in FLOAT_DTYPES:
        _fail(f"key, value and caches must share one float dtype, got {sorted(map(str, dtypes))}")
    devs = {t.device for t in (key, value, k_cache, v_cache, slot_mapping)}
    if len(devs) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        _fail("k_cache and v_cache must be contiguous")
    h, d = key.shape[1], key.shape[2]
    for name, t in (("key", key), ("value", value)):
        if t.shape[0] and (t.stride(2) != 1 or (h > 1 and t.stride(1) != d)):
            _fail(f"{name} must be contiguous within each token ([num_kv_heads, head_dim])")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        _fail(f"slot_mapping must be [num_tokens={key.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        _fail(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if _any((slot_mapping < -1) | (slot_mapping >= num_slots)):
        _fail(f"slot_mapping values must lie in [-1, num_slots={num_slots})")


def _as_pairs(block_mapping) -> torch.Tensor:
    if torch.is_tensor(block_mapping):
        pairs = block_mapping.detach().to(device="cpu", dtype=torch.long)
    else:
        pairs = torch.tensor([tuple(p) for p in block_mapping], dtype=torch.long)
    if pairs.numel() == 0:
        return torch.empty((0, 2), dtype=torch.long)
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        _fail(f"block_mapping must be (src, dst) pairs, shape [n, 2]; got {tuple(pairs.shape)}")
    return pairs.contiguous()


def check_copy_blocks(k_caches, v_caches, block_mapping) -> torch.Tensor:
    """Returns the mapping as a CPU int64 ``[n, 2]`` tensor."""
    if isinstance(k_caches, torch.Tensor) or isinstance(v_caches, torch.Tensor):
        _fail("k_caches and v_caches must be lists of per-layer pools")
    k_caches, v_caches = list(k_caches), list(v_caches)
    if not k_caches or len(k_caches) != len(v_caches):
        _fail(f"need one K and one V pool per layer, got {len(k_caches)} and {len(v_caches)}")
    ref = k_caches[0]
    for t in k_caches + v_caches:
        if t.shape != ref.shape or t.dtype != ref.dtype or t.device != ref.device:
            _fail("all pools must share shape, dtype and device")
        if not t.is_contiguous():
            _fail("pools must be contiguous")
    if ref.dim() < 1:
        _fail("pools must have a leading block dimension")
    pairs = _as_pairs(block_mapping)
    if pairs.shape[0] == 0:
        return pairs
    nb = ref.shape[0]
    if bool(((pairs < 0) | (pairs >= nb)).any()):
        _fail(f"block ids must lie in [0, num_blocks={nb})")
    src, dst = pairs[:, 0], pairs[:, 1]
    if dst.unique().numel() != dst.numel():
        _fail("copy_blocks: destination blocks must be distinct")
    if bool(torch.isin(dst, src).any()):
        _fail("copy_blocks: a destination block is also a source block in the same call")
    return pairs


def check_swap_blocks(src, dst, block_mapping) -> torch.Tensor:
    """Returns the mapping as a CPU int64 ``[n, 2]`` tensor."""
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    dsts = list(dst) if isinstance(dst, (list, tuple)) else [dst]
    if not srcs or len(srcs) != len(dsts):
        _fail(f"src and dst must hold the same number of pools, got {len(srcs)} and {len(dsts)}")
    for s, d in zip(srcs, dsts):
        if s.dtype != d.dtype or tuple(s.shape[1:]) != tuple(d.shape[1:]):
            _fail(f"src {s.dtype} {tuple(s.shape)} and dst {d.dtype} {tuple(d.shape)} blocks differ")
    pairs = _as_pairs(block_mapping)
    if pairs.shape[0] == 0:
        return pairs
    for s, d in zip(srcs, dsts):
        if bool(((pairs[:, 0] < 0) | (pairs[:, 0] >= s.shape[0])).any()):
            _fail(f"source block ids must lie in [0, {s.shape[0]})")
        if bool(((pairs[:, 1] < 0) | (pairs[:, 1] >= d.shape[0])).any()):
            _fail(f"destination block ids must lie in [0, {d.shape[0]})")
    if pairs[:, 1].unique().numel() != pairs.shape[0]:
        _fail("swap_blocks: destination blocks must be distinct")
    return pairs
