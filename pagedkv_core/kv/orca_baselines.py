"""The vLLM paper's other two contiguous baselines (Kwon et al., SOSP 2023, section 6.1).

Both know the answer's length in advance, which no real server does; they bound how well any
reserve-ahead allocator could do. Where a request states no ``output_len`` (the real model
without a trace), they fall back to ``max_tokens``, like Orca (Max).

- **Orca (Pow2)** reserves the answer's length rounded up to a power of two;
- **Orca (Oracle)** reserves exactly the answer's length.
"""
from __future__ import annotations

from .contiguous import ContiguousAllocator


def _answer_len(max_tokens: int, output_len: int | None) -> int:
    return min(output_len, max_tokens) if output_len else max_tokens


class OrcaPow2Allocator(ContiguousAllocator):
    name = "contiguous-pow2"
    answer_words = "answer slots (its length rounded up to a power of two)"

    def answer_reservation(self, max_tokens: int, output_len: int | None) -> int:
        n = _answer_len(max_tokens, output_len)
        return min(1 << (n - 1).bit_length(), max_tokens)


class OrcaOracleAllocator(ContiguousAllocator):
    name = "contiguous-oracle"
    answer_words = "answer slots (its exact length)"

    def answer_reservation(self, max_tokens: int, output_len: int | None) -> int:
        return _answer_len(max_tokens, output_len)
