"""``python -m benchmarks [NAME ...]``: the benchmarks of this folder, one command.

    python -m benchmarks                      # all of them (GPU ones skipped without CUDA)
    python -m benchmarks throughput prefix    # some
    python -m benchmarks simulator --quick    # a fast smoke run (figures not meaningful)

``python -m pagedkv_core bench ...`` launches this same command (the library itself never
imports this folder). Each benchmark writes ``benchmarks/results/NAME.json`` (or ``--out-dir``)
with the command, the date, the machine and its targets (pass/miss), and prints a table; at the
end ``README_TABLE.md`` is rebuilt from the latest results (next to the results directory for
the default one, inside ``--out-dir`` otherwise). A ``--quick`` run without ``--out-dir`` writes
to ``benchmarks/results/quick/``, so that a smoke run never replaces a published figure.
Real-model benchmarks run on the CPU on one torch thread. A missed target is reported, not an
error: the exit status is 0 unless a benchmark crashed (1). Unknown names exit with code 2 and
one line.

Adding a benchmark: a module ``bench_NAME.py`` (a ``-`` in NAME is a ``_`` there) with
``run(quick=...) -> dict`` and ``print_result(result)``, and one line in :data:`BENCHMARKS`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from pagedkv_core.cli.parsing import OneLineParser, run_command
from pagedkv_core.config import ConfigError

HERE = Path(__file__).resolve().parent
PROG = "python -m benchmarks"

BENCHMARKS = {
    "allocation": "paged vs contiguous on the scripted source, block sizes 1-128",
    "throughput": "real SmolLM2 on the CPU vs transformers' engines; tight-budget paged vs contiguous",
    "overhead": "engine step time vs a bare batched forward on the same token batch",
    "prefix": "600-token shared system prompt: B's prefill tokens and TTFT after A",
    "simulator": "scripted engine steps/s with snapshots on (2,048 slots, 40 live requests)",
    "memory": "peak RSS of LLM.generate in a fresh process, 2,048-slot pool",
    "scale": "the Azure request log into 65,536 to 1,048,576 slots: recording speed, peak RSS, trace size, scrub latency",
    "roofline": "CPU decode step at batch 16/32, fp32 and bf16, against the core's matmul peak and memory roofline",
    "playback": "server time of one playback step's figures on the Reserve-or-page page (two 2,048-slot pools, event strip, curves)",
    "live": "the real-model Reserve-or-page pair in Chromium: Play to first frame, steps/s with 1 and 3 sessions",
    "prefix-capacity": "Mooncake's conversation trace: prefix-cache hit rate against pool size, LRU and Belady, "
                       "beside the ideal replay and the paper's Figure 9",
    "replay-speed": "whole request logs (Azure conv, also every row of it at a 16,384-token context; Mooncake conv) "
                    "at 262,144 slots with --trace-out: wall time, peak RSS, trace size, steps/s while sequences run; "
                    "beside commit 28d078f's engine (as issue 55 found it)",
    "step-cost": "an engine step's CPU time with 1 to 1,024 sequences decoding, no recording, recorded in memory and "
                 "traced to a file; the cost each running sequence adds and, at one, a step's floor, beside commit "
                 "334a5fe's engine",
    "gpu": "CUDA: benchmarks/gpu_kernels.py and benchmarks/gpu_engine.py (skipped without a GPU)",
}
MODEL_BENCHMARKS = ("throughput", "overhead", "prefix", "roofline")  # share one loaded model
DEFAULT_ROUNDS = 3
GPU_SCRIPTS = ("gpu_kernels.py", "gpu_engine.py")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=prog,
        description="Run benchmarks (default: all): " + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks that it runs (figures not meaningful)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, metavar="N",
                   help=f"interleaved rounds for {', '.join(MODEL_BENCHMARKS)} (default {DEFAULT_ROUNDS})")
    p.add_argument("--out-dir", metavar="DIR",
                   help="where NAME.json files go (default benchmarks/results; with --quick, benchmarks/results/quick)")
    # The command a launcher was called as (python -m pagedkv_core bench): messages and result
    # files name it, so that what they say can be typed again.
    p.add_argument("--prog", default=prog, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    def command() -> int:
        # --prog is read ahead, so that even a usage error names the command as it was typed.
        pre = OneLineParser(prog=PROG, add_help=False)
        pre.add_argument("--prog", default=PROG)
        prog = pre.parse_known_args(argv)[0].prog
        return run(build_parser(prog).parse_args(argv))

    return run_command(command)


def run(args: argparse.Namespace) -> int:
    from benchmarks import report
    from benchmarks.common import RESULTS, results_dir, write_result

    names = list(dict.fromkeys(args.names)) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"unknown benchmark {unknown[0]!r}: use one of {', '.join(BENCHMARKS)}")
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    out_dir = Path(args.out_dir) if args.out_dir else results_dir(args.quick)
    command = args.prog + ("" if not args.names else " " + " ".join(args.names))
    command += " --quick" * args.quick + (f" --rounds {args.rounds}" if args.rounds != DEFAULT_ROUNDS else "")
    command += f" --out-dir {args.out_dir}" if args.out_dir else ""
    shared_llm = _SharedModel()
    skipped: dict[str, str] = {}
    failed = []
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
            module = importlib.import_module(f"benchmarks.bench_{name.replace('-', '_')}")
            kwargs = {"quick": args.quick}
            if name in MODEL_BENCHMARKS:
                kwargs["llm"] = shared_llm.get()
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
    default_dir = out_dir.resolve() == RESULTS.resolve()
    table_path = (RESULTS.parent / "README_TABLE.md") if default_dir else out_dir / "README_TABLE.md"
    report.write_table(out_dir, table_path, skipped, args.prog + (" --quick" if args.quick else ""))
    print(f"wrote {_rel(table_path)}")
    return 1 if failed else 0


class _SharedModel:
    """One LLM for the model benchmarks, loaded on first use."""

    def __init__(self):
        self._llm = None

    def get(self):
        if self._llm is None:
            from benchmarks.common import cpu_llm

            self._llm = cpu_llm(keep_transformers_model=True)  # the benchmarks run transformers as the peer
        return self._llm


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
    for script in GPU_SCRIPTS:
        path = HERE / script
        if not path.exists():
            print(f"{script}: not in this checkout")
            continue
        cmd = [sys.executable, str(path), "--out", str(out_dir / script.replace(".py", ".json"))]
        if quick and script == "gpu_engine.py":
            cmd += ["--requests", "16"]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=HERE.parent, env={**os.environ}).returncode
        if rc != 0:
            raise RuntimeError(f"{script} exited with {rc}")
    return None
