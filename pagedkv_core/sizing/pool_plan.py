"""Sizing a real model's KV pools before anything is loaded or allocated.

``torch.zeros`` commits its memory at once: a 10,000,000-slot pool of SmolLM2 asks for 460 GB
and dies inside the allocator, after the model has taken seconds to load. So the pool is
planned first, from numbers that cost nothing to get: the requested size (slots, blocks or a
byte budget) and the model's bytes per token, read from its ``config.json`` without touching
the weights. A plan that does not fit the memory budget (:mod:`pagedkv_core.sizing.memory`) is
refused with its numbers.

:func:`preflight` runs every check that needs neither torch nor the weights (device name,
thread count, dtype name, model path, pool plan), so that a command line with a bad value
fails in well under a second. :class:`~pagedkv_core.llm.LLM` runs it, then plans again from
the loaded model (its exact dtype) before the engine allocates anything.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

from ..config import ConfigError, EngineConfig, setting_spec
from .kv_math import KVShape
from .memory import check_fits, kv_pool_bytes, process_budget
from ..safe_io import loads_json, read_text_capped

DEFAULT_CPU_SLOTS = 2048
# The EngineConfig fields an LLM takes as keyword arguments: all but the pool size, which the
# LLM sizes itself (pool_slots | pool_blocks | kv_budget_bytes | memory_fraction).
ENGINE_SETTINGS = tuple(f.name for f in fields(EngineConfig) if f.name != "pool_slots")
HOST_SWAP_BUDGET = 1 << 30  # default host pool for swapped-out blocks: at most this many bytes
DEVICES = ("auto", "cpu", "cuda")
# The dtypes the model runner computes in (model/runner.py); the KV calculator knows more (int8, fp8).
MODEL_DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KB
HINT = "use a smaller pool or swap pool (pool slots, pool blocks, KV budget, swap slots), or raise PAGEDKV_MEMORY_BUDGET"
# Where a GPU driver shows itself (NVIDIA, and AMD's for ROCm builds): without one, CUDA cannot work.
_GPU_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


@dataclass(frozen=True)
class PoolPlan:
    """The device pool and the host swap pool of one engine, before either exists."""

    slots: int
    swap_slots: int
    bytes_per_token: int
    sized_by: str

    @property
    def device_bytes(self) -> int:
        return kv_pool_bytes(self.slots, 0, self.bytes_per_token)

    @property
    def host_bytes(self) -> int:
        return kv_pool_bytes(0, self.swap_slots, self.bytes_per_token)

    def check_budget(self, device_type: str = "cpu", budget: int | None = None, device_free: int | None = None) -> None:
        """BudgetError (one line, with the numbers) unless the pools fit. On the CPU both pools
        live in this process's memory; with CUDA the host pool does, and the device pool must
        fit the GPU's free memory (``device_free``, when known)."""
        budget = process_budget() if budget is None else budget
        per = f"x {self.bytes_per_token:,} B per token"
        if device_type == "cuda":
            check_fits(self.host_bytes, budget, f"the host swap pool ({self.swap_slots:,} slots {per})", hint=HINT)
            if device_free is not None:
                check_fits(self.device_bytes, device_free, f"the GPU KV pool ({self.slots:,} slots {per}; "
                           "the budget is the GPU's free memory)", hint=HINT)
            return
        check_fits(self.device_bytes + self.host_bytes, budget,
                   f"the KV pool ({self.slots:,} slots + {self.swap_slots:,} swap slots {per})", hint=HINT)


def slots_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """The most slots, in whole blocks, whose K/V fit in ``budget_bytes``."""
    return max(0, int(budget_bytes) // (bytes_per_token * block_size)) * block_size


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_sizing(pool_slots=None, pool_blocks=None, kv_budget_bytes=None, memory_fraction=None) -> None:
    """At most one way of sizing the pool."""
    given = [n for n, v in (("pool_slots", pool_slots), ("pool_blocks", pool_blocks),
                            ("kv_budget_bytes", kv_budget_bytes), ("memory_fraction", memory_fraction)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give the pool size one way only, got {', '.join(given)}")


def plan_pool(bytes_per_token: int, block_size: int, device_type: str, *, pool_slots=None, pool_blocks=None,
              kv_budget_bytes=None, memory_fraction=None, swap_slots=None) -> PoolPlan | None:
    """The pools as requested (see :class:`~pagedkv_core.llm.LLM` for the order of the ways).
    None when the device pool is to be profiled on the GPU (``memory_fraction``, or CUDA with
    no size given): its size is known only once the model runs. Raises ConfigError."""
    check_sizing(pool_slots, pool_blocks, kv_budget_bytes, memory_fraction)
    max_slots = setting_spec("pool_slots").hi
    if pool_slots is not None:
        slots, how = setting_spec("pool_slots").check(pool_slots), "pool_slots"
    elif pool_blocks is not None:
        slots, how = _positive("pool_blocks", pool_blocks) * block_size, "pool_blocks"
        if slots > max_slots:
            raise ConfigError(f"pool_blocks={pool_blocks:,} of {block_size} slots is {slots:,} slots, "
                              f"more than the {max_slots:,.0f} allowed")
    elif kv_budget_bytes is not None:
        budget = _positive("kv_budget_bytes", kv_budget_bytes)
        slots, how = slots_for_budget(budget, bytes_per_token, block_size), "kv_budget_bytes"
        if slots < block_size:
            raise ConfigError(f"kv_budget_bytes={budget} holds no block of {block_size} slots "
                              f"({bytes_per_token * block_size} bytes each)")
        if slots > max_slots:
            raise ConfigError(f"kv_budget_bytes={budget:,} sizes a pool of {slots:,} slots, "
                              f"more than the {max_slots:,.0f} allowed")
    elif memory_fraction is not None or device_type == "cuda":
        return None
    else:
        slots, how = max(block_size, (DEFAULT_CPU_SLOTS // block_size) * block_size), "default"
    if swap_slots is None:
        host_cap = max(block_size, slots_for_budget(HOST_SWAP_BUDGET, bytes_per_token, block_size))
        swap_slots = min(slots, host_cap)
    else:
        swap_slots = setting_spec("swap_slots").check(swap_slots)
    return PoolPlan(slots, swap_slots, bytes_per_token, how)


# ---------------------------------------------------------------------------- before loading
def gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in _GPU_DRIVER_PATHS)


def device_type_of(device) -> str:
    """"cpu" or "cuda" for a device name (``auto``: CUDA when a GPU driver is present; torch
    has the last word once it is imported). ConfigError for anything else, and for CUDA on a
    machine without a GPU driver. A ``torch.device`` passes through to the runner's check."""
    if not isinstance(device, str) and device is not None:
        return getattr(device, "type", "cpu")
    name = str(device or "auto").strip().lower()
    base, colon, index = name.partition(":")
    if base not in DEVICES or (colon and (base != "cuda" or not (index.isascii() and index.isdigit()))):
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if base == "auto":
        return "cuda" if gpu_driver_present() else "cpu"
    if base == "cuda" and not gpu_driver_present():
        raise ConfigError("device 'cuda' requested but CUDA is not available (no GPU driver on this machine)")
    return base


def check_threads(threads) -> int | None:
    """None, or a thread count in ``[1, os.cpu_count()]`` (torch aborts the whole process, or
    exhausts the machine's threads, on an absurd one)."""
    if threads is None:
        return None
    cores = os.cpu_count() or 1
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= cores:
        raise ConfigError(f"threads must be an integer in [1, {cores}] (the CPU cores), got {threads!r}")
    return threads


def dtype_name_of(dtype, device_type: str) -> str:
    """The KV dtype's name: None/"auto" is float32 on the CPU and bfloat16 on CUDA (the runner's
    defaults). ConfigError for a dtype the runner does not compute in."""
    if dtype is None or dtype == "auto":
        return "bfloat16" if device_type == "cuda" else "float32"
    name = str(dtype).replace("torch.", "").lower()
    if name not in MODEL_DTYPES:
        raise ConfigError(f"dtype must be one of float32, bfloat16, float16, got {dtype!r}")
    return name


def model_kv_shape(model) -> KVShape | None:
    """The KV shape of ``model`` (None: the bundled model, or a path), read without loading any
    weights: from a model directory's ``config.json``; from a GGUF file's converted
    ``config.json`` once the first load has made it, and before that from the GGUF's own
    metadata header (:mod:`~pagedkv_core.sources.model.gguf_header`), so that a fresh
    machine's first run is checked as fast as every later one. None when neither can be read
    (the loader then reports why). Raises ModelLoadError for a path that does not exist or is
    not a model."""
    from ..sources.model.gguf_header import read_gguf_config
    from ..sources.model.loader import gguf_cache_dir, resolve_source  # no torch, no transformers

    source = resolve_source(model)
    path = (gguf_cache_dir(source) if source.is_file() else source) / "config.json"
    try:
        if path.is_file():
            data = loads_json(read_text_capped(path, MAX_CONFIG_BYTES, "model config"), f"model config {str(path)!r}")
        elif source.is_file():
            data = read_gguf_config(source)
        else:
            return None
        shape = KVShape.from_config(SimpleNamespace(**data), name=Path(source).name)
        if shape.bytes_per_token() > 0:
            return shape
    except (ConfigError, AttributeError, TypeError, ValueError, ZeroDivisionError, OSError):
        pass  # not a config we can read: the loader reports it properly
    return None


def preflight(model=None, device="auto", dtype=None, threads=None, *, pool_slots=None, pool_blocks=None,
              kv_budget_bytes=None, memory_fraction=None, kv_shape: KVShape | None = None,
              **engine_settings) -> PoolPlan | None:
    """Every check of an ``LLM(...)`` call that needs neither torch nor the weights, in well
    under a second: the engine settings, the device, the threads, the dtype, the model path,
    and the pools against the memory budget (when the model's config can be read without
    loading it). ``kv_shape``: the model's, when it is already loaded (``model`` is then not
    read). Returns the plan (None when it needs the loaded model). Raises ConfigError,
    BudgetError or ModelLoadError (each one line)."""
    unknown = set(engine_settings) - set(ENGINE_SETTINGS)
    if unknown:
        raise ConfigError(f"unknown engine setting(s): {', '.join(sorted(unknown))}")
    device_type = device_type_of(device)
    check_threads(threads)
    dtype_name = dtype_name_of(dtype, device_type)
    check_sizing(pool_slots, pool_blocks, kv_budget_bytes, memory_fraction)
    block_size = setting_spec("block_size").check(engine_settings.get("block_size", setting_spec("block_size").default))
    EngineConfig(**{**engine_settings, "pool_slots": pool_slots or max(block_size, DEFAULT_CPU_SLOTS)})
    if kv_budget_bytes is not None and device_type == "cpu":  # the pool is about this big, whatever the model
        check_fits(_positive("kv_budget_bytes", kv_budget_bytes), process_budget(), "a KV pool sized to the KV budget",
                   hint=HINT)
    shape = kv_shape if kv_shape is not None else model_kv_shape(model)
    if shape is None:  # a GGUF's first load: planned again once it is loaded
        return None
    plan = plan_pool(shape.bytes_per_token(dtype_name), block_size, device_type, pool_slots=pool_slots,
                     pool_blocks=pool_blocks, kv_budget_bytes=kv_budget_bytes, memory_fraction=memory_fraction,
                     swap_slots=engine_settings.get("swap_slots"))
    if plan is not None:
        plan.check_budget(device_type)
    return plan
