"""Replay speed: whole request logs through ``simulate --trace-out``, this engine beside an older one.

Each case is ``python -m pagedkv_core simulate --workload-file LOG --pool-slots 262144
--allocator A --trace-out TMP --json`` in its own child process, started by a fresh, small
interpreter that reports the kernel's accounting of it (``measured``: so its peak RSS is its own,
not this benchmark's, which a process started from here would inherit). Where a second core is
there, ``simulate`` writes its trace from a process of its own (``record/trace_process.py``): the kernel's figure is then the
larger of the two processes' peaks, and ``peak_rss_sum_mb`` adds up every process's peak (VmHWM,
read from /proc while the case runs: an upper bound, pages they share count twice), which is what
the RSS target is judged on; the CPU seconds are both processes':

- the Azure conversation log whole (``data/azure_conv_2023.csv``, 19,366 rows; with the CLI's
  defaults, a 2,048-token context, every row is submitted: 16,528 fit, the others are served
  cut at the context, or rejected with their reason where the prompt alone fills it);
- the same log with every row run in full (``azure-conv-all``: ``--max-context 16384``, which the log's
  longest request, 14,089 tokens, fits), paged only: Orca (Max) reserves the whole context for
  every request, so at 16,384 tokens 16 requests run at once and the log's hour takes more than
  ten minutes (measured: cut off at 600 s), which is the paper's point, not a speed figure;
- the Mooncake conversation log whole (``data/mooncake_fast25/conversation_trace.jsonl``,
  12,031 requests; ``--length-scale`` 1/16, block size 32, as the CLI's own example);

each paged (block size 16, or 32 for Mooncake) and Orca (Max) (``--allocator contiguous``),
recording on. Figures: wall time of the whole command (reading and checking the log included),
its CPU seconds (user + system, from the kernel's accounting of that child), peak RSS, the
trace's size, and steps while sequences run (the steps in which anything waits, runs or is
swapped, read back from the trace's metrics) per wall second and per CPU second (idle steps and
start-up count against both: lower bounds). The cases run one at a time (``--workers N`` for more):
on a shared machine the wall times still measure the load as much as the engine, the CPU seconds
do not; each row keeps the 1-minute load average at its start and end.

The baseline (default: commit 28d078f, the engine as issue 55 found it, checked out with ``git
worktree add``) runs the same whole logs with that commit's engine in the same session, each
right after this engine's like-for-like case (Azure and Mooncake, paged and Orca (Max)). That
engine leaves out the Azure rows longer than the context, so this engine's like-for-like case
does too (``--overlong leave-out``: engine ``this (rows that fit)``); ``--no-baseline`` skips
them. Issue 55's targets are judged on this engine's whole Azure log at the default context.

    python -m benchmarks replay-speed [--quick]
    python benchmarks/bench_replay_speed.py [--workers N] [--logs azure-conv,azure-conv-all,mooncake-conv] [--no-baseline]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "pagedkv_core" / "data"
POOL = 262_144
BASELINE_COMMIT = "28d078f"  # the engine as issue 55 found it
ALL_ROWS_CONTEXT = 16_384  # the Azure log's longest request (14,089 tokens) fits
LOGS = {
    "azure-conv": (DATA / "azure_conv_2023.csv", []),
    "azure-conv-all": (DATA / "azure_conv_2023.csv", ["--max-context", str(ALL_ROWS_CONTEXT)]),
    "mooncake-conv": (DATA / "mooncake_fast25" / "conversation_trace.jsonl", ["--length-scale", "1/16"]),
}
ALLOCATORS = {"paged": [], "orca-max": ["--allocator", "contiguous"]}
PAGED_BLOCK_SIZE = {"mooncake-conv": 32}  # where the paged engine runs a log at another than the CLI's block size
# A log's allocators when not all of them (above: why Orca (Max) does not run every Azure row), and
# the logs the older engine runs (whole, at the CLI's default context), and what this engine adds to run
# the same requests as it does (it left out the rows longer than the context).
ONLY = {"azure-conv-all": ("paged",)}
WITH_BASELINE = {"azure-conv": ["--overlong", "leave-out"], "mooncake-conv": []}
LIKE_FOR_LIKE = "this (rows that fit)"  # this engine's name in a pair whose flags differ from its default case
PARALLEL = 1  # cases at once: one, so that no case's wall time includes another's
PEAK_POLL_S = 0.2
TARGETS = {"wall_s": 15.0, "peak_rss_mb": 400.0, "trace_mb": 150.0, "busy_steps_per_s": 10_000.0}  # issues 55 and 25


def cpu_info() -> dict:
    """The CPU's model name and the vector-ISA flags that matter here (the engine's own readers of
    /proc/cpuinfo: ``PAGEDKV_CPU_FLAGS`` narrows the flags as it does for the engine)."""
    from pagedkv_core.sources.model import cpu_isa_flags, cpu_model_name

    return {"cpu_model": cpu_model_name(), "isa_flags": cpu_isa_flags() or [], "cores": os.cpu_count()}


def baseline_root(commit: str = BASELINE_COMMIT) -> Path | None:
    """A worktree of ``commit`` in the temporary directory (``base-COMMIT``, made once); None where
    git cannot make one. ``bench step-cost`` takes its older engine from here too."""
    where = Path(tempfile.gettempdir()) / f"base-{commit}"
    if (where / "pagedkv_core").is_dir():
        return where
    done = subprocess.run(["git", "worktree", "add", "--detach", str(where), commit], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return where if done.returncode == 0 else None


def _busy_steps(trace: Path) -> tuple[int, int]:
    """(steps, steps in which anything waited, ran or was swapped) from a trace's metrics (an idle
    run stands for its ``steps`` steps with its metrics; version 4's metrics are read out of its
    stream without decoding the records)."""
    from pagedkv_core.record.trace_file import metric_rows

    steps = busy = 0
    at = None
    for names, n, values in metric_rows(trace):
        if at is None:
            at = [names.index(m) for m in ("num_running", "num_waiting", "num_swapped", "step_tokens")]
        steps += n
        busy += n * any(float(values[j]) for j in at)
    return steps, busy


def case(root: Path, log: str, allocator: str, count: int | None, quick: bool, flags: tuple = ()) -> dict:
    """One ``simulate`` run in a child process under ``root``'s engine (``flags``: more of its flags)."""
    path, extra = LOGS[log]
    extra = [*extra, *flags]
    if allocator == "paged" and log in PAGED_BLOCK_SIZE:
        extra = [*extra, "--block-size", str(PAGED_BLOCK_SIZE[log])]
    if quick:
        count = min(count or 300, 300)
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "run.jsonl"
        cmd = [sys.executable, "-m", "pagedkv_core", "simulate", "--workload-file", str(path), "--pool-slots", str(POOL),
               *ALLOCATORS[allocator], *extra, "--trace-out", str(trace), "--json"]
        if count is not None:
            cmd += ["--trace-count", str(count)]  # the old engine's spelling; the new one takes it as an alias
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        run = measured(cmd, cwd=root, env=env)
        wall = time.perf_counter() - t0
        out, err, cpu = run.out, run.err, run.cpu_s
        if run.returncode != 0:
            raise RuntimeError(f"{log} {allocator} under {root}: {err.strip().splitlines()[-1:] or run.returncode}")
        summary = json.loads(out.strip().splitlines()[-1])
        steps, busy = _busy_steps(trace)
        size = trace.stat().st_size
    return {"log": log, "allocator": allocator, "count": count, "requests": summary["requests"],
            "finished": summary["finished"], "rejected": len(summary["rejected"]), "steps": summary["steps"],
            "trace_steps": steps, "busy_steps": busy, "wall_s": round(wall, 2),
            "peak_rss_mb": round(run.peak_rss_kb / 1024, 1), "processes": max(len(run.hwm_kb), 1),
            "peak_rss_sum_mb": round(max(sum(run.hwm_kb.values()), run.peak_rss_kb) / 1024, 1),
            "cpu_s": round(cpu, 2), "trace_mb": round(size / 1e6, 1), "busy_steps_per_s": round(busy / wall, 1),
            "busy_steps_per_cpu_s": round(busy / cpu, 1) if cpu else None,
            "trace_kb_per_step": round(size / 1e3 / max(steps, 1), 2),
            "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}  # at the case's start and end


class TreePeaks:
    """The peak RSS (VmHWM) of a process and of each process under it, read from /proc every
    :data:`PEAK_POLL_S` while it runs (a peak only grows, so the last look before a process ends
    is its peak, but for what it added in its last moments). The kernel's accounting of a child
    (``ru_maxrss``) gives the largest one process's peak; a run written by two processes (the
    trace writer's own, ``record/trace_process.py``) holds the sum of theirs at most."""

    def __init__(self, pid: int):
        import threading

        self.pid = pid
        self.hwm_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "TreePeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[int]:
        pids, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except OSError:  # gone meanwhile
                continue
        return pids

    def _watch(self) -> None:
        from benchmarks.bench_memory import vm_hwm_bytes

        while not self._stop.wait(PEAK_POLL_S):
            for pid in self._tree():
                try:
                    hwm = vm_hwm_bytes(pid) // 1024
                except (OSError, RuntimeError):  # gone meanwhile, or a process without memory of its own
                    continue
                self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), hwm)


# A process's ``ru_maxrss`` starts from its parent's peak: across fork or vfork and exec the kernel
# carries the replaced address space's high-water mark into the new program's. Started from this
# benchmark, which holds the traces it has read back by then, every later case would report at
# least the benchmark's own size. So a case runs under a fresh, small interpreter that starts it
# and reports what the kernel accounted for it (and for what it started: the trace writer).
_WRAPPER = """
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
report = {"peak_rss_kb": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime}
sys.stderr.write("\\n" + json.dumps(report) + "\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


class Measured(NamedTuple):
    out: str
    err: str
    returncode: int
    peak_rss_kb: int  # the kernel's: the larger of the command's processes' peaks
    cpu_s: float  # user + system of the command and what it started
    hwm_kb: dict  # pid -> peak RSS (VmHWM) of each process of the command, read while it ran


def measured(cmd: list[str], **popen) -> Measured:
    """Run ``cmd`` to its end (its output captured as text) and measure it by itself: see
    ``_WRAPPER``. The wrapper's own process is left out of ``hwm_kb``."""
    wrapper = subprocess.Popen([sys.executable, "-c", _WRAPPER, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, **popen)
    with TreePeaks(wrapper.pid) as peaks:
        out, err = wrapper.communicate()
    lines = err.rstrip("\n").split("\n")
    try:
        report = json.loads(lines[-1])
        err = "\n".join(lines[:-1])
    except (ValueError, IndexError):  # the wrapper itself failed
        report = {"peak_rss_kb": 0, "cpu_s": 0.0}
    hwm = {pid: kb for pid, kb in peaks.hwm_kb.items() if pid != wrapper.pid}
    return Measured(out, err, wrapper.returncode, int(report["peak_rss_kb"]), float(report["cpu_s"]), hwm)


def run(quick: bool = False, baseline: bool = True, workers: int = PARALLEL, partial: Path | None = None,
        logs: tuple[str, ...] = tuple(LOGS)) -> dict:
    """Every case of ``logs``, ``workers`` child processes at a time (each child's peak RSS and CPU
    seconds are its own; with more than one worker, wall times include the others' contention).
    The whole Azure log runs first, then each like-for-like pair (this engine, then the old one,
    back to back), then the rest. ``partial``: a JSON file rewritten after each case, so a run
    cut short keeps what it measured."""
    from concurrent.futures import ThreadPoolExecutor

    base = baseline_root() if baseline else None
    plan = []
    for log in logs:
        allocators = ONLY.get(log, tuple(ALLOCATORS))
        plan += [("this", ROOT, log, allocator, None, ()) for allocator in allocators]
        if base is not None and log in WITH_BASELINE:
            flags = tuple(WITH_BASELINE[log])
            for allocator in allocators:
                if flags:  # this engine's default differs from the old one's: the same requests first
                    plan.append((LIKE_FOR_LIKE, ROOT, log, allocator, None, flags))
                plan.append((BASELINE_COMMIT, base, log, allocator, None, ()))
    rows: list = [None] * len(plan)
    errors = []
    load_start = list(os.getloadavg())

    def one(i: int) -> None:
        engine, root, log, allocator, count, flags = plan[i]
        try:
            rows[i] = {"engine": engine, **case(root, log, allocator, count, quick, flags)}
            print(json.dumps(rows[i]), flush=True)
        except RuntimeError as exc:  # one case failing must not lose the others
            errors.append(f"{engine}: {exc}")
            print(f"error: {errors[-1]}", flush=True)
        if partial is not None:
            partial.write_text(json.dumps({"rows": [r for r in rows if r], "errors": errors,
                                           "load_average_start": load_start, "load_average_now": list(os.getloadavg())},
                                          indent=1) + "\n")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, range(len(plan))))
    rows = [r for r in rows if r]
    targets = [] if quick else targets_of(rows)
    pairs = side_by_side(rows)
    for r in pairs:
        print(f"side by side, {r['log']} {r['allocator']}: this engine {r['wall_speedup']}x faster in wall time, "
              f"{r['cpu_speedup']}x in CPU time than {BASELINE_COMMIT}", flush=True)
    return {"pool_slots": POOL, **cpu_info(), "baseline": BASELINE_COMMIT if base is not None else None,
            "parallel": workers, "load_average_start": load_start,
            "load_average_end": list(os.getloadavg()), "rows": rows, "side_by_side": pairs,
            "errors": errors, "targets": targets}


def side_by_side(rows: list[dict]) -> list[dict]:
    """Each old-engine row beside this engine's run of the same requests: how many times less
    wall and CPU time this engine took (above 1: faster)."""
    out = []
    for old in rows:
        if old["engine"] != BASELINE_COMMIT:
            continue
        name = LIKE_FOR_LIKE if WITH_BASELINE.get(old["log"]) else "this"
        new = next((r for r in rows if r["engine"] == name and r["log"] == old["log"]
                    and r["allocator"] == old["allocator"] and r["count"] == old["count"]), None)
        if new is not None and new["wall_s"] and new["cpu_s"]:
            out.append({"log": old["log"], "allocator": old["allocator"], "requests": new["requests"],
                        "wall_s": [new["wall_s"], old["wall_s"]], "cpu_s": [new["cpu_s"], old["cpu_s"]],
                        "wall_speedup": round(old["wall_s"] / new["wall_s"], 2),
                        "cpu_speedup": round(old["cpu_s"] / new["cpu_s"], 2)})
    return out


def targets_of(rows: list[dict]) -> list[dict]:
    """The issue's targets on the whole Azure log (this engine): at the CLI's default context, and
    with every row run (``azure-conv-all``). Times are judged on the child's CPU seconds as well as
    its wall time: on a shared machine the wall time measures the load."""
    targets = []
    for r in rows:
        if r["engine"] != "this" or r["log"] not in ("azure-conv", "azure-conv-all") or r["count"] is not None:
            continue
        a = r["allocator"] + (f", all {r['requests']:,} rows ({ALL_ROWS_CONTEXT:,}-token context)"
                              if r["log"] == "azure-conv-all" else "")
        targets += [
            {"name": f"whole Azure conv at 262,144 slots with --trace-out, {a}: wall time (s)", "value": r["wall_s"],
             "target": f"<= {TARGETS['wall_s']:.0f}", "pass": r["wall_s"] <= TARGETS["wall_s"]},
            {"name": f"whole Azure conv, {a}: CPU time of the run (s)", "value": r["cpu_s"],
             "target": f"<= {TARGETS['wall_s']:.0f}", "pass": r["cpu_s"] <= TARGETS["wall_s"]},
            {"name": f"whole Azure conv, {a}: peak RSS (MB; its processes' peaks summed)", "value": r["peak_rss_sum_mb"],
             "target": f"<= {TARGETS['peak_rss_mb']:.0f}", "pass": r["peak_rss_sum_mb"] <= TARGETS["peak_rss_mb"]},
            {"name": f"whole Azure conv, {a}: trace (MB)", "value": r["trace_mb"],
             "target": f"<= {TARGETS['trace_mb']:.0f}", "pass": r["trace_mb"] <= TARGETS["trace_mb"]},
            {"name": f"whole Azure conv, {a}: steps while sequences run per CPU second", "value": r["busy_steps_per_cpu_s"],
             "target": f">= {TARGETS['busy_steps_per_s']:,.0f}",
             "pass": (r["busy_steps_per_cpu_s"] or 0) >= TARGETS["busy_steps_per_s"]},
        ]
    return targets


COLUMNS = ["engine", "log", "allocator", "count", "requests", "steps", "busy_steps", "wall_s", "cpu_s", "peak_rss_mb",
           "peak_rss_sum_mb",
           "trace_mb", "busy_steps_per_s", "busy_steps_per_cpu_s", "trace_kb_per_step"]


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    print_table([{c: ("whole" if c == "count" and r.get(c) is None else r.get(c, "-")) for c in COLUMNS}
                 for r in result["rows"]], COLUMNS)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import write_result

    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-baseline", action="store_true", help=f"skip commit {BASELINE_COMMIT}'s engine")
    p.add_argument("--workers", type=int, default=PARALLEL, help=f"cases at once (default {PARALLEL})")
    p.add_argument("--logs", default=",".join(LOGS), help=f"comma-separated, of {', '.join(LOGS)} (default all)")
    args = p.parse_args()
    chosen = tuple(x for x in args.logs.split(",") if x)
    if not chosen or any(x not in LOGS for x in chosen):
        p.error(f"--logs: each must be one of {', '.join(LOGS)}, got {args.logs!r}")
    res = run(args.quick, baseline=not args.no_baseline, workers=max(1, args.workers), logs=chosen,
              partial=ROOT / "benchmarks" / "results" / "replay-speed.partial.json")
    print_result(res)
    command = " ".join(["python benchmarks/bench_replay_speed.py", *sys.argv[1:]])
    print("wrote", write_result("replay-speed", {"command": command, "quick": args.quick, **res}))
