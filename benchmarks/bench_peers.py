"""Run two peer LLM-serving simulators on the Azure conversation log and time them.

Standalone: standard library only. Each peer lives in its own installation
outside this project; pass where it is:

    python benchmarks/bench_peers.py \
        --vidur-python /tmp/peers/vidur-venv/bin/python \
        --inference-lab-dir /tmp/peers/ilab \
        --pagedkv .venv/bin/python \
        --out benchmarks/results/epyc-avx512/peers.json

How the peers were installed (PyPI and npm only, nothing else reachable):

  vidur (Microsoft's simulator, PyPI "vidur", tested with 0.0.26):
      python3 -m venv /tmp/peers/vidur-venv
      /tmp/peers/vidur-venv/bin/pip install vidur

  inference-lab (Doubleword's WASM simulator; the npm name is scoped,
  plain "inference-lab" is a 404 on npm; tested with 0.2.1):
      mkdir -p /tmp/peers/ilab && cd /tmp/peers/ilab
      npm install @doublewordai/inference-lab

What each peer is given:

  vidur: the whole log as its trace_replay CSV (Date, Time, PromptTokenCount,
      CompletionTokenCount), scale factors 1, Llama-3-8B on one H100 (TP1, PP1),
      vLLM scheduler, block size 16.  vidur fetches its GPU profiling data
      (compute and network CSVs) from Hugging Face datasets at run time; no
      version on PyPI ships them, so offline it stops with
      LocalEntryNotFoundError and is reported as ran: false.

  inference-lab: the npm build (0.2.1) takes one JSON config and has no
      trace or dataset input: only synthetic arrivals (poisson, uniform,
      burst, fixed_rate, batched, closed_loop) and length distributions
      (fixed, uniform, normal, lognormal).  So it runs a synthetic workload
      matched to the log (same request count, Poisson at the log's mean rate,
      lognormal lengths fitted to the log's token counts), an analytic
      H100 roofline with Llama-3-8B, a KV cache of 262,144 tokens, block 16.
      The result says replays_log: false.

  pagedkv (``--pagedkv``): the same log on this engine, in the same run, as
      ``python -m pagedkv_core simulate --workload-file LOG --pool-slots 262144 --json``
      (paged, block size 16, scripted tokens, every row submitted), without a
      trace (as the peers write none) and with ``--trace-out`` (every step
      recorded for the app).

Timing: wall seconds around each peer's process, CPU seconds from
resource.getrusage(RUSAGE_CHILDREN) deltas (user + sys of the waited child
and what it started: pagedkv's trace writer is a second process).
"""

import argparse
import csv
import datetime
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LOG = os.path.join(HERE, "..", "pagedkv_core", "data", "azure_conv_2023.csv")

# Llama-3-8B: 32 layers, 8 KV heads of 128 dims, bf16 K and V.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
POOL_TOKENS = 262144
BLOCK_SIZE = 16


def read_log(path):
    """Return [(date, seconds since first arrival, prompt tokens, output tokens)]."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            stamp = r["TIMESTAMP"][:26]  # trim to microseconds for strptime
            when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
            rows.append((when, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    t0 = rows[0][0]
    return [(w.date().isoformat(), (w - t0).total_seconds(), p, d) for w, p, d in rows]


def run_timed(cmd, timeout, cwd=None, env=None):
    """Run cmd; return (returncode or None on timeout, stdout, stderr, wall_s, cpu_s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    except OSError as e:  # the executable itself is missing or not runnable
        rc, out, err = 127, "", "%s: %s" % (type(e).__name__, e)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rc, out, err, wall, cpu


def error_line(text):
    """The last 'SomeError: message' line of a traceback, else the last line."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception)\b.*:", line) or "error:" in line.lower():
            return line
    return lines[-1] if lines else "no output"


# ---------------------------------------------------------------- vidur

VIDUR_MODEL = "meta-llama/Llama-3-8B"
VIDUR_DEVICE = "h100"
VIDUR_NETWORK = "h100_dgx"
VIDUR_MAX_TOKENS = 4096  # vidur's max_model_len for Llama-3-8B


def bench_vidur(python, log, tmp, timeout):
    result = {"name": "vidur", "ran": False}
    rc, out, err, _, _ = run_timed(
        [python, "-c", "import importlib.metadata as m; print(m.version('vidur'))"], 60)
    if rc != 0:
        result["why"] = "vidur not importable: " + error_line(err)
        return result
    result["version"] = out.strip()

    trace = os.path.join(tmp, "vidur_trace.csv")
    with open(trace, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for date, t, p, d in log:
            w.writerow([date, "%.6f" % t, p, d])
    clipped = sum(1 for _, _, p, d in log if p + d > VIDUR_MAX_TOKENS)

    outdir = os.path.join(tmp, "vidur_out")
    cmd = [python, "-m", "vidur.main",
           "--replica_config_model_name", VIDUR_MODEL,
           "--replica_config_device", VIDUR_DEVICE,
           "--replica_config_network_device", VIDUR_NETWORK,
           "--replica_config_tensor_parallel_size", "1",
           "--replica_config_num_pipeline_stages", "1",
           "--cluster_config_num_replicas", "1",
           "--cache_config_block_size", str(BLOCK_SIZE),
           "--replica_scheduler_config_type", "vllm",
           "--request_generator_config_type", "trace_replay",
           "--trace_request_generator_config_trace_file", trace,
           "--trace_request_generator_config_date", log[0][0],
           "--trace_request_generator_config_prefill_scale_factor", "1",
           "--trace_request_generator_config_decode_scale_factor", "1",
           "--trace_request_generator_config_time_scale_factor", "1",
           "--trace_request_generator_config_max_tokens", str(VIDUR_MAX_TOKENS),
           "--metrics_config_output_dir", outdir,
           "--no-metrics_config_store_plots",
           "--no-metrics_config_enable_chrome_trace"]
    env = dict(os.environ, WANDB_MODE="disabled")
    rc, out, err, wall, cpu = run_timed(cmd, timeout, cwd=tmp, env=env)
    result.update({
        "command": " ".join(cmd),
        "simulated": {
            "model": VIDUR_MODEL, "device": VIDUR_DEVICE, "network": VIDUR_NETWORK,
            "tp": 1, "pp": 1, "scheduler": "vllm", "block_size": BLOCK_SIZE,
            "input": "whole log via trace_replay",
            "requests_in_trace": len(log),
            "requests_prompt_clipped_to_%d_tokens" % VIDUR_MAX_TOKENS: clipped,
        },
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
    })
    if rc is None:
        result["why"] = "timed out after %d s" % timeout
        return result
    if rc != 0:
        result["why"] = "exit %d: %s" % (rc, error_line(out + "\n" + err))
        return result
    done = None
    for root, _, files in os.walk(outdir):
        if "request_metrics.csv" in files:
            with open(os.path.join(root, "request_metrics.csv")) as f:
                done = sum(1 for _ in f) - 1
    result["ran"] = True
    result["simulated"]["requests_simulated"] = done
    return result


# ---------------------------------------------------------- inference-lab

ILAB_PACKAGE = os.path.join("node_modules", "@doublewordai", "inference-lab")

ILAB_RUNNER = r"""
import fs from 'node:fs';
import path from 'node:path';
const pkg = process.argv[2];
const lab = await import(path.join(pkg, 'inference_lab.js'));
lab.initSync({module: fs.readFileSync(path.join(pkg, 'inference_lab_bg.wasm'))});
const config = fs.readFileSync(process.argv[3], 'utf8');
const t0 = process.hrtime.bigint();
const r = lab.run_simulation(config);
const t1 = process.hrtime.bigint();
const plain = (x) => x instanceof Map ? Object.fromEntries([...x].map(([k, v]) => [k, plain(v)])) : x;
const m = plain(r).metrics;
console.log(JSON.stringify({run_simulation_s: Number(t1 - t0) / 1e9, metrics: m}));
"""


def lognormal_fit(values):
    logs = [math.log(v) for v in values]
    return statistics.mean(logs), statistics.pstdev(logs)


def bench_inference_lab(lab_dir, log, tmp, timeout):
    result = {"name": "inference-lab", "ran": False}
    pkg = os.path.join(os.path.abspath(lab_dir), ILAB_PACKAGE)
    try:
        with open(os.path.join(pkg, "package.json")) as f:
            meta = json.load(f)
    except OSError as e:
        result["why"] = "package not found: %s" % e
        return result
    result["version"] = meta.get("version")

    span = log[-1][1] - log[0][1]
    in_mu, in_sigma = lognormal_fit([p for _, _, p, _ in log])
    out_mu, out_sigma = lognormal_fit([d for _, _, _, d in log])
    config = {
        "hardware": {"name": "H100", "compute_flops": 9.89e14, "memory_bandwidth": 3.35e12,
                     "memory_capacity": 80 * 10**9, "bytes_per_param": 2,
                     "kv_cache_capacity": POOL_TOKENS * LLAMA3_8B_KV_BYTES_PER_TOKEN},
        "model": {"name": "Llama-3-8B", "num_parameters": 8_030_000_000, "num_layers": 32,
                  "hidden_dim": 4096, "num_heads": 32, "num_kv_heads": 8,
                  # a request longer than max_seq_len made 0.2.1 spin forever here
                  "max_seq_len": 131072},
        "scheduler": {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "policy": "fcfs",
                      "enable_chunked_prefill": True, "block_size": BLOCK_SIZE},
        "workload": {"arrival_pattern": "poisson", "arrival_rate": len(log) / span,
                     "num_requests": len(log), "seed": 42,
                     "input_len_dist": {"type": "lognormal", "mean": in_mu, "std_dev": in_sigma},
                     "output_len_dist": {"type": "lognormal", "mean": out_mu, "std_dev": out_sigma}},
        "simulation": {"log_interval": 1000},
    }
    cfg_path = os.path.join(tmp, "ilab_config.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=1)
    runner = os.path.join(tmp, "ilab_runner.mjs")
    with open(runner, "w") as f:
        f.write(ILAB_RUNNER)

    cmd = ["node", runner, pkg, cfg_path]
    rc, out, err, wall, cpu = run_timed(cmd, timeout, cwd=tmp)
    result.update({
        "command": " ".join(cmd),
        "replays_log": False,
        "why_not_replay": "npm build has no trace/dataset input; synthetic workload matched to the log",
        "simulated": {
            "model": "Llama-3-8B (analytic roofline)", "hardware": "H100 (989 TFLOPS, 3.35 TB/s)",
            "kv_cache_tokens": POOL_TOKENS, "block_size": BLOCK_SIZE, "scheduler": "fcfs, chunked prefill",
            "workload": config["workload"],
        },
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
    })
    if rc is None:
        result["why"] = "timed out after %d s" % timeout
        return result
    if rc != 0:
        result["why"] = "exit %d: %s" % (rc, error_line(err or out))
        return result
    report = json.loads(out.strip().splitlines()[-1])
    m = report["metrics"]
    result["ran"] = True
    result["run_simulation_s"] = round(report["run_simulation_s"], 3)
    result["simulated"]["requests_simulated"] = m.get("completed_requests")
    result["simulated"]["simulated_seconds"] = m.get("total_time")
    return result


# ---------------------------------------------------------------- pagedkv

ROOT = os.path.dirname(HERE)


def bench_pagedkv(python, log_path, tmp, timeout, trace):
    """This engine on the same log: ``simulate`` without a trace, or with ``--trace-out``."""
    name = "pagedkv" + (" --trace-out" if trace else "")
    result = {"name": name, "ran": False}
    cmd = [python, "-m", "pagedkv_core", "simulate", "--workload-file", os.path.abspath(log_path),
           "--pool-slots", str(POOL_TOKENS), "--block-size", str(BLOCK_SIZE), "--json"]
    if trace:
        cmd += ["--trace-out", os.path.join(tmp, "pagedkv_trace.jsonl")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc, out, err, wall, cpu = run_timed(cmd, timeout, cwd=ROOT, env=env)
    result.update({"command": " ".join(cmd), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)})
    if rc != 0:
        result["why"] = "timed out after %d s" % timeout if rc is None else "exit %d: %s" % (rc, error_line(err or out))
        return result
    summary = json.loads(out.strip().splitlines()[-1])
    result["ran"] = True
    result["simulated"] = {"model": "scripted tokens (no timing model)", "kv_cache_tokens": POOL_TOKENS,
                           "block_size": BLOCK_SIZE, "input": "whole log, every row (replayed at its arrival times)",
                           "requests_simulated": summary["requests"], "finished": summary["finished"],
                           "rejected": len(summary["rejected"]), "steps": summary["steps"]}
    return result


def cpu_model():
    """The CPU's model name and its vector flags that matter here, from /proc/cpuinfo ("" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return ""
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    wanted = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if flags and x in flags.group(1).split()]
    return ((name.group(1).strip() if name else "") + (" (" + " ".join(wanted) + ")" if wanted else "")).strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur-python", help="python of the venv where vidur is installed")
    ap.add_argument("--inference-lab-dir", help="folder where @doublewordai/inference-lab was npm-installed")
    ap.add_argument("--pagedkv", nargs="?", const=sys.executable, metavar="PYTHON",
                    help="also time this engine on the same log (with this project's python; default: this one)")
    ap.add_argument("--log", default=DEFAULT_LOG, help="Azure trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed per peer")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    log = read_log(args.log)
    peers = []
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        if args.vidur_python:
            peers.append(bench_vidur(args.vidur_python, log, tmp, args.timeout))
        if args.inference_lab_dir:
            peers.append(bench_inference_lab(args.inference_lab_dir, log, tmp, args.timeout))
        if args.pagedkv:
            for trace in (False, True):
                peers.append(bench_pagedkv(args.pagedkv, args.log, tmp, args.timeout, trace))

    command = " ".join(["python benchmarks/bench_peers.py", *(sys.argv[1:] if argv is None else argv)])
    report = {"date": started, "cpu": cpu_model(), "cores": os.cpu_count(), "command": command,
              "log": os.path.abspath(args.log), "requests_in_log": len(log),
              "log_span_s": round(log[-1][1], 3), "peers": peers}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
