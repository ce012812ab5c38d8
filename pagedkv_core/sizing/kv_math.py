"""KV-cache arithmetic: how many bytes one token, one block and one pool cost.

Every token keeps one key and one value vector per layer and per KV head, so
    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element
and a block of ``block_size`` token slots costs ``block_size`` times that.
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "int8": 1, "fp8": 1}


@dataclass(frozen=True)
class KVShape:
    """The part of a model's architecture that sizes its KV cache."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_heads: int | None = None  # query heads, for the grouped-query note
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "KVShape":
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(
            name=name or getattr(config, "name_or_path", "") or config.model_type,
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            num_heads=num_heads,
            max_position_embeddings=getattr(config, "max_position_embeddings", None),
        )

    def bytes_per_token(self, dtype: str = "float32") -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(dtype)

    def bytes_per_block(self, block_size: int, dtype: str = "float32") -> int:
        return block_size * self.bytes_per_token(dtype)

    @property
    def gqa_ratio(self) -> int:
        return (self.num_heads or self.num_kv_heads) // self.num_kv_heads


def dtype_bytes(dtype: str) -> int:
    key = str(dtype).replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
