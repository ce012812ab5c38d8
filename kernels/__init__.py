"""Data plane of the paged KV-cache engine: paged decode attention, the slot-mapping scatter,
copy-on-write block copies and device<->host block swaps.

The engine calls the functions below. They dispatch per call on the tensors' device:

* ``"auto"`` (default): CUDA tensors run the compiled Triton kernels
  (:mod:`kernels.triton_kernels`), CPU tensors run the PyTorch references
  (:mod:`kernels.reference`).
* ``"reference"``: always the PyTorch references.
* ``"triton"``: always Triton. For CPU tensors this runs the Triton code on the Triton
  interpreter, which is slow and only for demonstration and tests; it needs
  ``TRITON_INTERPRET=1`` in the environment before the kernels are first used.

Choose with :func:`set_backend` or the ``PAGEDKV_KERNELS`` environment variable.

A model forward runs the same attention and the same scatter in every layer of a step, with the
same block tables and slot mapping. :func:`decode_attention` and :func:`cache_writer` take those
once per step and return a callable to run per layer: on the references the indices are
validated and built on the first layer only (:class:`reference.PagedDecode`,
:class:`reference.CacheWrite`); on Triton each call is the ordinary, fully checked launch.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import contextmanager

import torch

from . import reference
from .reference import gather_kv

__all__ = [
    "paged_attention_decode",
    "reshape_and_cache",
    "decode_attention",
    "cache_writer",
    "copy_blocks",
    "swap_blocks",
    "gather_kv",
    "set_backend",
    "get_backend",
    "use_backend",
    "alloc_host_cache",
    "BACKENDS",
]

BACKENDS = ("auto", "reference", "triton")


def _validate_backend(name: str) -> str:
    name = (name or "auto").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown kernels backend {name!r}; choose one of {BACKENDS}")
    return name


_backend = _validate_backend(os.environ.get("PAGEDKV_KERNELS", "auto"))


def set_backend(name: str) -> None:
    """Select ``"auto"``, ``"reference"`` or ``"triton"`` (see the module docstring)."""
    global _backend
    name = _validate_backend(name)
    if name == "triton":
        _triton_module(for_cpu=None)  # fail now, not at the first call, if Triton is missing
    _backend = name


def get_backend() -> str:
    return _backend


@contextmanager
def use_backend(name: str):
    """Temporarily select a backend: ``with kernels.use_backend("triton"): ...``."""
    old = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(old)


def _triton_module(for_cpu: bool | None):
    try:
        from . import triton_kernels
    except ImportError as e:  # pragma: no cover - triton is a hard requirement of the project
        raise RuntimeError(f"the Triton kernels need the triton package: {e}") from e
    if for_cpu and not triton_kernels.INTERPRETED:
        raise RuntimeError(
            "kernels backend 'triton' on CPU tensors runs the Triton interpreter, which must be "
            "enabled before the kernels are first imported: set TRITON_INTERPRET=1 in the "
            "environment before starting Python (or use the 'reference' / 'auto' backend)."
        )
    return triton_kernels


def _impl(t: torch.Tensor):
    """The module that runs a call whose main tensor is ``t``."""
    if _backend == "reference":
        return reference
    if _backend == "triton":
        return _triton_module(for_cpu=not t.is_cuda)
    if t.is_cuda:
        return _triton_module(for_cpu=False)
    return reference


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of ``q [num_seqs, num_heads, head_dim]`` over the paged pools
    ``k_cache``/``v_cache [num_blocks, block_size, num_kv_heads, head_dim]`` through
    ``block_tables`` (int32 ``[num_seqs, max_blocks]``) for ``context_lens`` (int32
    ``[num_seqs]``) tokens. ``scale`` defaults to ``head_dim ** -0.5``. Writes and returns
    ``out`` (same shape and dtype as ``q``); a sequence with context 0 gets zeros."""
    return _impl(q).paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, out)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value [num_tokens, num_kv_heads, head_dim]`` into the pools at
    ``slot_mapping`` (``slot = block_id * block_size + offset``; -1 skips the token)."""
    return _impl(key).reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)


def decode_attention(block_tables: torch.Tensor, context_lens: torch.Tensor):
    """One step's decode attention, to call once per layer as
    ``attend(q, k_cache, v_cache, scale=None, out=None)`` (the arguments of
    :func:`paged_attention_decode` less the block tables and context lengths given here)."""
    impl = _impl(block_tables)
    if impl is reference:
        return reference.PagedDecode(block_tables, context_lens)

    def attend(q, k_cache, v_cache, scale=None, out=None):
        return impl.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, out)

    return attend


def cache_writer(slot_mapping: torch.Tensor):
    """One step's slot-mapping scatter, to call once per layer as
    ``write(key, value, k_cache, v_cache)`` (see :func:`reshape_and_cache`)."""
    impl = _impl(slot_mapping)
    if impl is reference:
        return reference.CacheWrite(slot_mapping)

    def write(key, value, k_cache, v_cache):
        return impl.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

    return write


def copy_blocks(
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Copy-on-write: copy block ``src`` to block ``dst`` for every ``(src, dst)`` pair in
    every layer's K and V pool (one launch on CUDA)."""
    return _impl(k_caches[0]).copy_blocks(k_caches, v_caches, block_mapping)


def swap_blocks(
    src: torch.Tensor | Sequence[torch.Tensor],
    dst: torch.Tensor | Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for every ``(s, d)`` pair, across
    devices (swap-out: device pool -> host pool; swap-in: the reverse). ``src``/``dst`` may be
    single pools or equal-length lists of pools. Plain torch copies on every backend
    (asynchronous when the host pool is pinned)."""
    first = src[0] if isinstance(src, (list, tuple)) else src
    other = dst[0] if isinstance(dst, (list, tuple)) else dst
    if _backend != "reference" and (first.is_cuda or other.is_cuda):
        return _triton_module(for_cpu=False).swap_blocks(src, dst, block_mapping)
    return reference.swap_blocks(src, dst, block_mapping)


def alloc_host_cache(shape, dtype: torch.dtype, pin: bool | None = None) -> torch.Tensor:
    """A zeroed host pool for swapped-out blocks; pinned (page-locked) when CUDA is available,
    so swaps to and from the GPU are asynchronous DMA copies."""
    if pin is None:
        pin = torch.cuda.is_available()
    return torch.zeros(shape, dtype=dtype, pin_memory=bool(pin))
