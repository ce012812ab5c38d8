"""Our own Llama forward over a flattened token batch and a paged KV pool.

The weights are read by name, from the converted safetensors file
(:mod:`pagedkv_core.sources.model.checkpoint`) or a transformers model
(:meth:`LlamaModel.from_transformers`), into plain tensors: the Q, K and V projections fused into
one matrix, the gate and up projections fused into another (on the CPU in fp32 and bf16 each matrix
is pre-packed for oneDNN once, see :class:`Linear`). One forward runs every token of a step at once:

    tokens [T] -> embedding -> 30 x (RMSNorm -> fused QKV -> rotary -> write K/V through the slot
    mapping -> attention -> O -> residual -> RMSNorm -> SiLU-gated MLP -> residual)
    -> final RMSNorm + tied LM head, only for the rows that sample.

Attention has two paths, chosen per token by :class:`AttentionMetadata` (built once per step by
the runner; prefill tokens come first in the flattened batch, decode tokens after):

* prefill (a chunk of one or more new tokens, possibly after a cached prefix): the sequence's K/V
  for positions ``[0, context_len)`` is gathered from the pool through its block table (the prefix
  was written by earlier steps or found in the prefix cache; the chunk's own K/V was written a
  moment before), and every chunk of the step runs in one padded ``scaled_dot_product_attention``
  call with a causal mask shifted by the chunk's start position. A lone chunk without a prefix
  skips the gather (plain causal attention over its fresh K/V).
* decode (one new token per sequence): one paged decode attention over the block tables and
  context lengths of all decoding sequences at once (Triton on CUDA, PyTorch reference on CPU).

:meth:`LlamaModel.forward_parts` runs the batches of several engines (each with its own pools and
metadata) as one forward: the matmuls over all their rows at once, each part's K/V writes and
attention on its own pools; :meth:`LlamaModel.forward` is its one-part case.

Everything the layers share is prepared once per step, not once per layer: the rotary rows of the
step's positions, the slot-mapping scatter and the decode attention's gather indices and padding
mask (``kernels.cache_writer`` and ``kernels.decode_attention`` validate and build them in the
first layer and reuse them in the other 29). A decode step of 32 sequences on one CPU core spends
about two thirds of its time in the matmuls in fp32 and half in bf16; the rest is attention over
the gathered context and some 40 small elementwise ops per layer (see ``bench roofline``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels


class Linear:
    """``y = x @ weight.T + bias``. On the CPU in fp32 and bf16 the weight is pre-packed once into
    oneDNN's blocked layout (``torch.ops.mkldnn``), which runs the small-batch matmuls of decoding
    about 1.6x (fp32) and 2x (bf16, on AMX/AVX512-BF16 cores) faster than a plain GEMM on the
    row-major weight; elsewhere it is ``F.linear``. :meth:`add` folds a residual into the GEMM's
    output (oneDNN's sum post-op) in fp32, where that is exact (the accumulator is the output);
    in bf16 it would skip the rounding of the product before the add that transformers does, so
    there it stays a separate add."""

    __slots__ = ("weight", "bias", "packed", "fused_add")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool):
        self.bias = bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32) if pack else None
        self.fused_add = pack and weight.dtype == torch.float32
        self.weight = None if pack else weight  # the packed copy replaces it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)``, in one pass over the output."""
        if self.fused_add:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")
        return residual + self(x)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.weight, self.packed, self.bias) if t is not None]


_PACK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def _can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN pre-packed linears: CPU, fp32 or bf16, oneDNN present, a self-test of the GEMM and
    of its residual post-op passes, and ``PAGEDKV_CPU_LINEAR`` is not ``plain``."""
    if (device.type != "cpu" or dtype not in _PACK_TOLERANCE
            or os.environ.get("PAGEDKV_CPU_LINEAR", "") == "plain"):
        return False
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, x, r = (torch.randn(shape, generator=g).to(dtype) for shape in ((48, 32), (5, 32), (5, 48)))
        lin, tol = Linear(w, None, True), _PACK_TOLERANCE[dtype]
        return bool(torch.allclose(lin(x).float(), F.linear(x, w).float(), atol=tol, rtol=tol)
                    and torch.allclose(lin.add(x, r).float(), (r + F.linear(x, w)).float(), atol=tol, rtol=tol))
    except Exception:  # an op missing from this build, or no bf16 GEMM on this CPU: plain GEMMs
        return False


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: Linear  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]


@dataclass
class AttentionMetadata:
    """Index tensors of one step, shared by every layer (all on the model's device).

    The flattened batch holds ``num_prefill_tokens`` prefill tokens first, then one token per
    decoding sequence.
    """

    slot_mapping: torch.Tensor  # int64 [T]: where each token's K/V is written
    block_size: int
    num_prefill_tokens: int = 0
    # prefill: B chunks padded to Tq queries over Tk keys
    prefill_simple: bool = False  # one chunk, no cached prefix: plain causal attention
    prefill_q_index: torch.Tensor | None = None  # int64 [B * Tq]: flat token row of each padded query
    prefill_out_index: torch.Tensor | None = None  # int64 [P]: padded row (b * Tq + i) of each prefill token
    prefill_kv_slots: torch.Tensor | None = None  # int64 [B * Tk]: slot of every (chunk, key position)
    prefill_mask: torch.Tensor | None = None  # bool [B, 1, Tq, Tk]
    prefill_shape: tuple[int, int, int] = (0, 0, 0)  # (B, Tq, Tk)
    # decode
    decode_block_tables: torch.Tensor | None = None  # int32 [S, max_blocks]
    decode_context_lens: torch.Tensor | None = None  # int32 [S]
    # block size the decode tables are in: the batch's, or 1 (slot-level tables) when the
    # batch's block size is not a power of two, which the attention kernels require
    decode_block_size: int = 0

    @property
    def num_decode_tokens(self) -> int:
        return 0 if self.decode_context_lens is None else int(self.decode_context_lens.shape[0])


@dataclass
class BatchPart:
    """One engine's share of a forward over several engines' batches
    (:meth:`LlamaModel.forward_parts`): rows ``[start, stop)`` of the flattened batch (its prefill
    tokens first, then its decodes), their attention metadata, and that engine's KV pools."""

    start: int
    stop: int
    meta: AttentionMetadata
    k_pools: list[torch.Tensor]
    v_pools: list[torch.Tensor]


class _PartStep:
    """A part's per-step kernels, built once for the 30 layers: its slot-mapping scatter and,
    when it decodes, its decode attention over its block tables."""

    def __init__(self, part: BatchPart, total_rows: int):
        meta = part.meta
        self.part = part
        self.write_kv = kernels.cache_writer(meta.slot_mapping)
        decodes = part.stop - part.start > meta.num_prefill_tokens
        self.attend = kernels.decode_attention(meta.decode_block_tables, meta.decode_context_lens) if decodes else None
        self.decode_only = decodes and not meta.num_prefill_tokens and part.stop - part.start == total_rows


def _rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale, from the config's theta and rope scaling."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None)
    if not params and isinstance(legacy, dict):
        params = dict(legacy)
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if dim != head_dim:
        raise ValueError("partial rotary embeddings are not supported")
    base = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope_type == "default":
        return base, 1.0
    if rope_type == "linear":
        return base / float(params["factor"]), 1.0
    if rope_type == "dynamic":
        raise ValueError("dynamic NTK rope scaling depends on the sequence length; not supported")
    # llama3, yarn, longrope, ...: the same initialisation transformers uses, from the config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unknown rope type {rope_type!r}")
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq.float(), float(scale)


class LlamaModel:
    """A Llama decoder as plain tensors with a forward over a flattened, paged batch."""

    def __init__(self, config, weight, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 release=None):
        """``config``: the model's config (transformers' or :class:`~.checkpoint.ModelConfig`).
        ``weight(name)``: the tensor of a transformers parameter name (``model.layers.0.mlp.up_proj.weight``),
        or None where the model has none (no biases; ``lm_head.weight`` when the head is the
        embedding). ``release(i)``, if given, is called once layer ``i``'s weights are copied here,
        and ``release(-1)`` at the end, so that the source can free what it held."""
        cfg = config
        self.config = cfg
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.hidden_size = cfg.hidden_size
        self.eps = float(cfg.rms_norm_eps)
        self.vocab_size = cfg.vocab_size
        self.max_position = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
        self.scale = self.head_dim ** -0.5
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported activation {act!r}")

        def t(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.detach().to(device=self.device, dtype=dtype).contiguous()

        def cat(*xs):
            if all(x is None for x in xs):
                return None
            return t(torch.cat([x for x in xs], dim=0))

        self.packed_linears = pack = _can_pack(self.device, dtype)
        embed = weight("model.embed_tokens.weight")
        self.embed = t(embed)
        self.final_norm = t(weight("model.norm.weight"))
        head = weight("lm_head.weight")
        tied = head is None or head.data_ptr() == embed.data_ptr()
        self.lm_head = Linear(self.embed if tied else t(head), None, pack)
        del embed, head
        self.layers: list[LayerWeights] = []
        for i in range(self.num_layers):
            w = lambda name: weight(f"model.layers.{i}.{name}")  # noqa: E731
            self.layers.append(
                LayerWeights(
                    input_norm=t(w("input_layernorm.weight")),
                    qkv=Linear(cat(w("self_attn.q_proj.weight"), w("self_attn.k_proj.weight"), w("self_attn.v_proj.weight")),
                               cat(w("self_attn.q_proj.bias"), w("self_attn.k_proj.bias"), w("self_attn.v_proj.bias")),
                               pack),
                    o=Linear(t(w("self_attn.o_proj.weight")), t(w("self_attn.o_proj.bias")), pack),
                    post_norm=t(w("post_attention_layernorm.weight")),
                    gate_up=Linear(cat(w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")),
                                   cat(w("mlp.gate_proj.bias"), w("mlp.up_proj.bias")),
                                   pack),
                    down=Linear(t(w("mlp.down_proj.weight")), t(w("mlp.down_proj.bias")), pack),
                )
            )
            if release is not None:
                release(i)
        if release is not None:
            release(-1)
        inv_freq, rope_scale = _rope_inv_freq(cfg)
        self.inv_freq = inv_freq.to(self.device)
        self.rope_scale = rope_scale
        self._cos = self._sin_signed = None
        self._rope_len = 0
        self.ensure_rope(min(self.max_position, 4096))

    @classmethod
    def from_transformers(cls, hf_model, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                          release_source: bool = False) -> "LlamaModel":
        """From a transformers Llama model. ``release_source``: empty each of its layers' parameters
        as soon as they are copied here, so that the two copies never coexist in memory (the
        caller must not use ``hf_model`` afterwards)."""
        params = dict(hf_model.named_parameters())  # a tied head is listed once, as the embedding

        def release(i: int) -> None:
            prefix = f"model.layers.{i}." if i >= 0 else ""
            for name, p in params.items():
                if name.startswith(prefix):
                    p.data = torch.empty(0, dtype=p.dtype)

        return cls(hf_model.config, params.get, device, dtype, release if release_source else None)

    # --------------------------------------------------------------- pieces
    @property
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        tensors = [self.embed, self.final_norm] + self.lm_head.tensors()
        for lw in self.layers:
            tensors += [lw.input_norm, lw.post_norm]
            for lin in (lw.qkv, lw.o, lw.gate_up, lw.down):
                tensors += lin.tensors()
        for x in tensors:
            key = id(x) if x.is_mkldnn else x.data_ptr()  # packed oneDNN tensors expose no data pointer
            if key not in seen:
                seen.add(key)
                total += x.numel() * x.element_size()
        return total

    def ensure_rope(self, n: int) -> None:
        """Make the cos/sin tables cover positions [0, n)."""
        if n <= self._rope_len:
            return
        n = max(n, 2 * self._rope_len)
        pos = torch.arange(n, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]  # same product as transformers, in fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos = (emb.cos() * self.rope_scale).to(self.dtype)
        sin = (emb.sin() * self.rope_scale).to(self.dtype)
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated), bit for bit
        # (negation is exact), which saves the negation and the concatenation in every layer
        self._sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self._rope_len = n

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """transformers' ``x * cos + rotate_half(x) * sin``, with the sign folded into the table."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed

    # --------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_pools: list[torch.Tensor],
        v_pools: list[torch.Tensor],
        sample_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Run the decoder over ``input_ids [T]`` at ``positions [T]``, writing K/V into the
        per-layer pools (flat ``[num_slots, kv_heads, head_dim]``), and return the logits
        ``[len(sample_rows), vocab]`` of the rows in ``sample_rows`` (increasing, distinct row
        indices; all ``T`` of them means every row, taken without a copy), in the model's dtype:
        bf16 and fp16 widen to fp32 exactly, so the sampler converts only the rows it draws from
        (a greedy pick is the same on either) instead of the whole [rows, vocab] block."""
        part = BatchPart(0, int(input_ids.shape[0]), meta, k_pools, v_pools)
        return self.forward_parts(input_ids, positions, [part], sample_rows)

    def forward_parts(self, input_ids: torch.Tensor, positions: torch.Tensor, parts: list["BatchPart"],
                      sample_rows: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` over the batches of several engines at once (each a :class:`BatchPart`:
        its rows of ``input_ids``, its attention metadata and its own KV pools): every matmul runs
        once over all their rows, so the weights are read once a step instead of once an engine;
        each part's K/V writes and attention use its own pools. A row's logits are the same, bit
        for bit, as in a forward of its part alone (the oneDNN matmuls compute each row the same
        whatever the rows beside it; ``tests/test_forward_together.py``)."""
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        T = input_ids.shape[0]
        # (the caller makes sure the rotary table covers every position: ensure_rope)
        cos = self._cos.index_select(0, positions)[:, None, :]
        sin = self._sin_signed.index_select(0, positions)[:, None, :]
        h = F.embedding(input_ids, self.embed)
        q_size, kv_size = H * D, Hkv * D
        # each part's indices, validated and built once for all layers
        steps = [_PartStep(part, T) for part in parts]
        alone = len(steps) == 1 and steps[0].decode_only  # its attention's own output, no copy
        for li, lw in enumerate(self.layers):
            x = self._rms_norm(h, lw.input_norm)
            qkv = lw.qkv(x)
            # rotary embedding on the query and key heads together (one set of elementwise ops)
            qk = self._rotate(qkv[:, : q_size + kv_size].view(T, H + Hkv, D), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, q_size + kv_size :].view(T, Hkv, D)
            attn = None if alone else torch.empty((T, H, D), device=h.device, dtype=h.dtype)
            for ps in steps:
                attn = self._part_attention(ps, li, q, k, v, attn)
            h = lw.o.add(attn.reshape(T, H * D), h)

            x = self._rms_norm(h, lw.post_norm)
            gu = lw.gate_up(x)
            inter = gu.shape[-1] // 2
            h = lw.down.add(F.silu(gu[:, :inter]) * gu[:, inter:], h)

        if sample_rows.shape[0] != T:  # (the decode-only step samples every row: no copy)
            h = h.index_select(0, sample_rows)
        h = self._rms_norm(h, self.final_norm)
        return self.lm_head(h)

    def _part_attention(self, ps: "_PartStep", li: int, q, k, v, attn):
        """Layer ``li``'s K/V writes and attention for one part's rows; returns ``attn`` with its
        rows filled (or, given None, the attention's own output for a lone decode-only part)."""
        Hkv, D = self.num_kv_heads, self.head_dim
        part, meta = ps.part, ps.part.meta
        rows = slice(part.start, part.stop)
        q, k, v = q[rows], k[rows], v[rows]
        P, bs = meta.num_prefill_tokens, meta.block_size
        dbs = meta.decode_block_size or bs
        k_flat, v_flat = part.k_pools[li], part.v_pools[li]
        usable = (k_flat.shape[0] // bs) * bs
        k_cache = k_flat[:usable].view(-1, bs, Hkv, D)
        v_cache = v_flat[:usable].view(-1, bs, Hkv, D)
        ps.write_kv(k, v, k_cache, v_cache)
        if dbs != bs:
            k_cache, v_cache = k_flat.view(-1, dbs, Hkv, D), v_flat.view(-1, dbs, Hkv, D)
        if attn is None:
            return ps.attend(q, k_cache, v_cache, self.scale)
        out = attn[rows]
        if P:
            out[:P] = self._prefill_attention(q[:P], k[:P], v[:P], k_flat, v_flat, meta)
        if ps.attend is not None:
            ps.attend(q[P:], k_cache, v_cache, self.scale, out[P:])
        return attn

    def _prefill_attention(self, q, k, v, k_flat, v_flat, meta: AttentionMetadata) -> torch.Tensor:
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        gqa = H != Hkv
        if meta.prefill_simple:
            out = F.scaled_dot_product_attention(  # 4-D, so that fused CUDA backends apply
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                is_causal=True, scale=self.scale, enable_gqa=gqa,
            )
            return out[0].transpose(0, 1)
        B, Tq, Tk = meta.prefill_shape
        qp = q.index_select(0, meta.prefill_q_index).view(B, Tq, H, D).transpose(1, 2)
        kp = k_flat.index_select(0, meta.prefill_kv_slots).view(B, Tk, Hkv, D).transpose(1, 2)
        vp = v_flat.index_select(0, meta.prefill_kv_slots).view(B, Tk, Hkv, D).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=meta.prefill_mask, scale=self.scale, enable_gqa=gqa
        )  # [B, H, Tq, D]
        return out.transpose(1, 2).reshape(B * Tq, H, D).index_select(0, meta.prefill_out_index)
