"""``python -m pagedkv_core bench [NAME ...]``: the benchmarks of ``benchmarks/``, one command.

    python -m pagedkv_core bench                      # all of them (GPU ones skipped without CUDA)
    python -m pagedkv_core bench throughput prefix    # some
    python -m pagedkv_core bench simulator --quick    # a fast smoke run (figures not meaningful)

Each benchmark writes ``benchmarks/results/NAME.json`` (or ``--out-dir``) with the command, the
date, the machine and its targets (pass/miss), and prints a table; at the end
``README_TABLE.md`` is rebuilt from the latest results (next to the results directory for the
default one, inside ``--out-dir`` otherwise). Real-model benchmarks run on the CPU on one torch
thread. A missed target is reported, not an error: the exit status is 0 unless a benchmark
crashed (1). Unknown names exit with code 2 and one line.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BENCHMARKS = {
    "allocation": "paged vs contiguous on the scripted source, block sizes 1-128",
    "throughput": "real SmolLM2 on the CPU vs transformers' engines; tight-budget paged vs contiguous",
    "overhead": "engine step time vs a bare batched forward on the same token batch",
    "prefix": "600-token shared system prompt: B's prefill tokens and TTFT after A",
    "simulator": "scripted engine steps/s with snapshots on (2,048 slots, 40 live requests)",
    "memory": "peak RSS of LLM.generate in a fresh process, 2,048-slot pool",
    "playback": "server time of one playback step of the Reserve-or-page page (2,048-slot pair of heatmaps)",
    "gpu": "CUDA: benchmarks/gpu_kernels.py and benchmarks/gpu_engine.py (skipped without a GPU)",
}
_MODEL_BENCHMARKS = ("throughput", "overhead", "prefix")  # share one loaded model


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run the benchmarks and write benchmarks/results/NAME.json",
        description="Run benchmarks (default: all): " + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks that it runs (figures not meaningful)")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="interleaved rounds for throughput, overhead, prefix (default 3)")
    p.add_argument("--out-dir", metavar="DIR", help="where NAME.json files go (default benchmarks/results)")
    p.set_defaults(func=cmd_bench)


def _import_benchmarks():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import benchmarks.common  # noqa: F401  (raises ImportError when the checkout has no benchmarks/)


def cmd_bench(args: argparse.Namespace) -> int:
    from .config import ConfigError

    names = list(dict.fromkeys(args.names)) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"unknown benchmark {unknown[0]!r}: use one of {', '.join(BENCHMARKS)}")
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    try:
        _import_benchmarks()
    except ImportError as exc:
        raise ConfigError(f"the benchmarks need the repository's benchmarks/ directory: {exc}") from None
    from benchmarks import report
    from benchmarks.common import RESULTS, write_result

    out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    command = "python -m pagedkv_core bench" + ("" if not args.names else " " + " ".join(args.names))
    command += " --quick" * args.quick + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
    command += f" --out-dir {args.out_dir}" if args.out_dir else ""
    shared = {}
    skipped: dict[str, str] = {}
    failed = []

    def llm():
        if "llm" not in shared:
            import torch

            from .llm import LLM

            torch.set_num_threads(1)
            from .model.loader import load_model

            # Loaded here and handed over, so that the transformers model stays usable: the
            # benchmarks run it as the peer (an LLM that loads for itself frees those weights).
            loaded = load_model(progress=lambda f, m: None)
            shared["llm"] = LLM(device="cpu", threads=1, pool_slots=2048, block_size=16, loaded=loaded)
        return shared["llm"]

    for name in names:
        print(f"== {name}: {BENCHMARKS[name]}", flush=True)
        t0 = time.perf_counter()
        try:
            if name == "gpu":
                why = _run_gpu(out_dir, args.quick)
                if why:
                    skipped["gpu"] = why
                    print(f"skipped: {why}")
                continue
            module = __import__(f"benchmarks.bench_{name}", fromlist=["run"])
            kwargs = {"quick": args.quick}
            if name in _MODEL_BENCHMARKS:
                kwargs["llm"] = llm()
                kwargs["rounds"] = args.rounds
            result = module.run(**kwargs)
            payload = {"command": command, "quick": args.quick, **result}
            path = write_result(name, payload, out_dir=out_dir)
            module.print_result(result)
            for t in result.get("targets", []):
                print(f"  target {t['name']}: {t['value']} (target {t['target']}) -> {'pass' if t['pass'] else 'MISS'}")
            print(f"wrote {_rel(path)} in {time.perf_counter() - t0:.0f} s", flush=True)
        except Exception as exc:  # one benchmark failing must not lose the others
            failed.append(name)
            traceback.print_exc()
            print(f"error: benchmark {name} failed: {exc}", file=sys.stderr)
    table_path = (RESULTS.parent / "README_TABLE.md") if out_dir.resolve() == RESULTS.resolve() else out_dir / "README_TABLE.md"
    report.write_table(out_dir, table_path, skipped, "python -m pagedkv_core bench" + (" --quick" if args.quick else ""))
    print(f"wrote {_rel(table_path)}")
    return 1 if failed else 0


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _run_gpu(out_dir: Path, quick: bool) -> str | None:
    """Runs the GPU scripts when CUDA is available; returns why they were skipped otherwise."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    for script in ("gpu_kernels.py", "gpu_engine.py"):
        path = ROOT / "benchmarks" / script
        if not path.exists():
            print(f"{script}: not in this checkout")
            continue
        cmd = [sys.executable, str(path), "--out", str(out_dir / script.replace(".py", ".json"))]
        if quick and script == "gpu_engine.py":
            cmd += ["--requests", "16"]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ}).returncode
        if rc != 0:
            raise RuntimeError(f"{script} exited with {rc}")
    return None
