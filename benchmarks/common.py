"""Shared pieces of the benchmarks: the chat prompts, timing, peak memory, result files."""
from __future__ import annotations

import json
import os
import platform
import resource
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# Where a --quick run writes when given no --out-dir: its figures are not meaningful, so it never
# replaces a published result (nor the README table built from them). Not kept in git.
QUICK_RESULTS = RESULTS / "quick"


def results_dir(quick: bool) -> Path:
    """Where a run writes when given no ``--out-dir``: :data:`QUICK_RESULTS` for a quick one."""
    return QUICK_RESULTS if quick else RESULTS

from pagedkv_core.workloads.prompts import CHAT_PROMPTS  # noqa: E402  (the same 16 questions everywhere)


CPU_POOL_SLOTS = 2048  # every real-model benchmark's pool: 2,048 slots in blocks of 16
CPU_BLOCK_SIZE = 16


def cpu_llm(keep_transformers_model: bool = True):
    """The LLM the real-model benchmarks run: the CPU, one torch thread, the pool above.

    ``keep_transformers_model``: load the model here and hand it over, so that the transformers
    model stays usable as the peer the benchmark compares against (an LLM that loads for itself
    frees those weights as it copies them)."""
    import torch

    from pagedkv_core.llm import LLM
    from pagedkv_core.sources.model.loader import load_model

    torch.set_num_threads(1)
    quiet = lambda f, m: None  # noqa: E731
    loaded = load_model(progress=quiet) if keep_transformers_model else None
    return LLM(device="cpu", threads=1, pool_slots=CPU_POOL_SLOTS, block_size=CPU_BLOCK_SIZE, loaded=loaded, progress=quiet)


def chat_prompt_ids(tokenizer, prompts=CHAT_PROMPTS) -> list[list[int]]:
    ids = []
    for p in prompts:
        enc = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        ids.append(list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc))
    return ids


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_rss():
    """Samples this process's resident memory every 5 ms; yields a dict whose 'peak' is filled in
    on exit (bytes)."""
    out = {"peak": rss_bytes()}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            out["peak"] = max(out["peak"], rss_bytes())
            stop.wait(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out["peak"] = max(out["peak"], rss_bytes())


def useful_tokens(ids: list[int], eos: int | None) -> list[int]:
    """Tokens up to and including the first EOS: what a user receives."""
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return ids


def cpu_model() -> str:
    from pagedkv_core.sources.model import cpu_model_name

    return cpu_model_name() or platform.processor() or platform.machine()


def _installed(dist: str) -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version(dist)
    except Exception:
        return None


def machine() -> dict:
    """The machine a result was measured on. torch figures only when this process uses torch."""
    from pagedkv_core.sources.model import cpu_isa_flags

    torch = sys.modules.get("torch")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu_model(),
        "isa_flags": cpu_isa_flags(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "load_average_1min": round(load, 2) if load is not None else None,
        "platform": platform.platform(),
        "torch": torch.__version__ if torch else _installed("torch"),
        "torch_threads": torch.get_num_threads() if torch else None,
        "python": platform.python_version(),
        "peak_rss_process_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def write_result(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    """Write ``out_dir/NAME.json`` with the date and machine. Default: ``benchmarks/results``, or
    :data:`QUICK_RESULTS` for a ``payload`` of a quick run (``"quick": True``)."""
    out_dir = Path(out_dir) if out_dir is not None else results_dir(bool(payload.get("quick")))
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), **payload}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def print_table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = [" | ".join(c.ljust(widths[c]) for c in columns), "-+-".join("-" * widths[c] for c in columns)]
    lines += [" | ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    text = "\n".join(lines)
    print(text)
    return text
