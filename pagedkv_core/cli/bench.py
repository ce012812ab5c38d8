"""``python -m pagedkv_core bench [NAME ...]``: a launcher for ``python -m benchmarks``.

The benchmarks live in the repository's ``benchmarks/`` folder, outside the library: this
command runs them as a module in a child process (same flags, same output, same exit code), so
that the library never imports them. ``python -m pagedkv_core bench --help`` shows their flags.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

from ..config import ConfigError
from .parsing import PROG

ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds benchmarks/ beside pagedkv_core/


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        add_help=False,  # --help goes to the benchmarks, which know their flags
        help="run the benchmarks and write benchmarks/results/NAME.json (python -m benchmarks; -h for its flags)",
    )
    p.set_defaults(func=cmd_bench, passes_through=True)  # main hands over every argument unparsed


def cmd_bench(args: argparse.Namespace) -> int:
    if not (ROOT / "benchmarks" / "__main__.py").is_file():
        raise ConfigError(f"the benchmarks need the repository's benchmarks/ directory (not found in {ROOT})")
    cmd = [sys.executable, "-m", "benchmarks", "--prog", f"{PROG} bench", *args.rest]
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}
    return _returncode(_run_relayed(cmd, env))


def _run_relayed(cmd: list[str], env: dict) -> int:
    """Runs ``cmd`` with its output on this process's ``sys.stdout``/``sys.stderr``: handed the
    same files when they are real ones, copied line by line when they are not (a test's capture)."""
    streams = (sys.stdout, sys.stderr)
    for s in streams:
        s.flush()
    real = all(_has_fd(s) for s in streams)
    if real:
        return subprocess.run(cmd, env=env, stdout=sys.stdout, stderr=sys.stderr).returncode
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    copiers = [threading.Thread(target=_copy, args=(pipe, out), daemon=True)
               for pipe, out in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))]
    for t in copiers:
        t.start()
    for t in copiers:
        t.join()
    return child.wait()


def _has_fd(stream) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False
    return True


def _copy(pipe, out) -> None:
    for line in pipe:
        out.write(line)
        out.flush()
    pipe.close()


def _returncode(rc: int) -> int:
    """A child killed by signal N reads as 128 + N, as a shell reports it."""
    return 128 - rc if rc < 0 else rc
