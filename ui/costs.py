"""What a preemption costs, measured so that the load on the machine cannot decide the lesson.

Timing two real-model runs one after the other on a shared machine measures the machine as much
as the runs: a busy neighbour during one of them can make it look 30× slower. So the lesson
separates what it measures into two kinds:

* **Work**, which load cannot change: the bytes a swap moves (out and back) and the tokens a
  recompute prefills again, counted from the engine's events.
* **Rates**, which load does change, measured the same way for both modes: a host memory copy
  (the swap's operation) and a float32 matrix multiply (the prefill's), timed alternately,
  ``repeats`` times each, medians taken. Both see the same load, so their ratio, and with it the
  verdict, holds on a busy machine.

The modelled cost of each mode is then work / rate: swap = bytes / copy bandwidth (and, for a
GPU, bytes / the PCIe link); recompute = recomputed tokens x FLOPs per token / FLOP rate, with
FLOPs per token = 2 x parameters (one multiply-add per weight; attention over the context adds
4 x layers x context x hidden, under 3% at these lengths). The pages also run the two modes
interleaved step by step (:func:`ui.timed_runs.run_interleaved`), so the measured step times of
the two runs share the machine's load too.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16: 32 GB/s raw each way, about 25 GB/s for pinned host copies
PCIE_NAME = "PCIe 4.0 x16"
COPY_BYTES = 64 << 20  # larger than the caches, so the copy runs at memory speed
MATMUL_N = 1024  # 2 x 1024^3 = 2.1 GFLOP per multiply
REPEATS = 5


@dataclass(frozen=True)
class Rates:
    """Medians of ``repeats`` alternating timings on this machine."""

    copy_bytes_per_s: float
    flops_per_s: float
    repeats: int
    threads: int
    copy_samples_s: tuple[float, ...] = ()
    matmul_samples_s: tuple[float, ...] = ()


def measure_rates(repeats: int = REPEATS, copy_bytes: int = COPY_BYTES, matmul_n: int = MATMUL_N) -> Rates:
    """Time a host copy of ``copy_bytes`` and an n x n float32 matmul, alternately, ``repeats``
    times each (after one warm-up of each); medians."""
    import torch

    if repeats < 3:
        raise ValueError(f"repeats must be at least 3 for a median that one outlier cannot move, got {repeats}")
    src = torch.rand(copy_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    a, b = torch.rand(matmul_n, matmul_n), torch.rand(matmul_n, matmul_n)
    out = torch.empty(matmul_n, matmul_n)
    dst.copy_(src)
    torch.mm(a, b, out=out)
    copies, mms = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        t1 = time.perf_counter()
        torch.mm(a, b, out=out)
        t2 = time.perf_counter()
        copies.append(t1 - t0)
        mms.append(t2 - t1)
    return Rates(copy_bytes / statistics.median(copies), 2 * matmul_n**3 / statistics.median(mms), repeats,
                 torch.get_num_threads(), tuple(copies), tuple(mms))


@dataclass(frozen=True)
class CostModel:
    """Modelled cost of the work each mode did, at the measured rates."""

    bytes_moved: int  # swap: to host and back
    tokens_recomputed: int
    flops_per_token: float
    rates: Rates
    pcie_bytes_per_s: float = PCIE_BYTES_PER_S

    @property
    def recompute_flops(self) -> float:
        return self.tokens_recomputed * self.flops_per_token

    @property
    def swap_s(self) -> float:
        return self.bytes_moved / self.rates.copy_bytes_per_s

    @property
    def swap_pcie_s(self) -> float:
        return self.bytes_moved / self.pcie_bytes_per_s

    @property
    def recompute_s(self) -> float:
        return self.recompute_flops / self.rates.flops_per_s

    @property
    def winner(self) -> str:
        """The cheaper mode here: "swap" or "recompute" (swap on a tie: it computes nothing)."""
        return "swap" if self.swap_s <= self.recompute_s else "recompute"

    @property
    def factor(self) -> float:
        """How many times cheaper the winner is."""
        lo, hi = sorted((self.swap_s, self.recompute_s))
        return hi / lo if lo > 0 else float("inf")

    @property
    def gpu_break_even_flops_per_s(self) -> float:
        """The prefill FLOP rate at which recomputing costs what the PCIe link needs to swap."""
        return self.recompute_flops / self.swap_pcie_s if self.swap_pcie_s > 0 else float("inf")


def flops_per_token(num_params: int) -> float:
    """Forward-pass FLOPs per token: a multiply and an add per weight."""
    return 2.0 * num_params


def seconds(s: float) -> str:
    """A duration in the unit that reads best: µs, ms or s."""
    if s < 1e-3:
        return f"{s * 1e6:,.0f} µs"
    if s < 1:
        return f"{s * 1e3:,.1f} ms"
    return f"{s:,.2f} s"


def rate(value: float, unit: str) -> str:
    """A rate in G or T of ``unit`` per second."""
    return f"{value / 1e12:,.1f} T{unit}/s" if value >= 1e12 else f"{value / 1e9:,.1f} G{unit}/s"
