"""The README table: the latest result of every benchmark in ``benchmarks/results``, as markdown.

    .venv/bin/python benchmarks/report.py            # rewrites benchmarks/README_TABLE.md

``python -m pagedkv_core bench`` rewrites it after every run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TABLE = Path(__file__).resolve().parent / "README_TABLE.md"
ORDER = ("allocation", "throughput", "overhead", "prefix", "simulator", "memory", "playback", "scale", "replay-speed", "step-cost", "roofline",
         "live",
         "prefix-capacity", "peers", "quiet-steps", "decode-runs", "decode-runs-traced", "gpu_engine",
         "gpu_kernels")


def load_results(results_dir: Path = RESULTS) -> dict[str, dict]:
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            out[path.stem] = data
    return out


def _verdict(ok) -> str:
    return "pass" if ok else "**MISS**"


def _x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else str(v)


_STEP_COST_WAYS = {"plain": "no recording", "recorded": "in-memory recording",
                   "traced": "trace file, written in the engine's process"}


def _rows(name: str, r: dict) -> list[tuple[str, str, str, str]]:
    """(benchmark, measured, target, verdict) rows for one result."""
    rows = []
    if name == "allocation":
        for wl, s in r.get("summary_block16", {}).items():
            rows.append((f"allocation `{wl}`: paged (block 16) vs contiguous",
                         f"token utilization {s['paged16_token_utilization']:.1%} vs {s['contiguous_token_utilization']:.1%}; "
                         f"peak concurrency {s['paged16_peak_running']} vs {s['contiguous_peak_running']}; "
                         f"steps {s['paged16_steps']} vs {s['contiguous_steps']}", "reported", "-"))
        for t in r.get("trace_rows", []):
            rows.append((f"allocation `{t['workload']}` (Azure trace), {t['allocator']}",
                         f"token share {t['token_share']:.1%} (paper {t['paper_token_share']:.1%}); token {t['token']:.3f}, "
                         f"reservation {t['reservation']:.3f}, internal {t['internal']:.3f}, external {t['external']:.3f}, "
                         f"free {t['free']:.3f}; steps {t['steps']:,}; running peak {t['peak_running']}, mean {t['mean_running']}",
                         "reported", "-"))
        for t in r.get("targets", []):
            rows.append((f"allocation: {t['name']}", ", ".join(f"{v:.1%}" for v in t["value"]), t["target"], _verdict(t["pass"])))
        return rows
    if name == "scale":
        for row in r.get("rows", []):
            extra = (f"; scrub {row['scrub_ms_median']:.0f} ms median, {row.get('payload_kb', 0):.0f} KB a heatmap"
                     if "scrub_ms_median" in row else "")
            rows.append((f"scale: `{r['workload']}` into {row['pool_slots']:,} slots, {row['allocator']}, recording on",
                         f"{row['steps_per_s']:,.0f} steps/s over {row['steps']:,} steps; peak RSS {row['peak_rss_mb']:.0f} MB "
                         f"(recording {row['recording_mb']:.0f} MB); trace {row['trace_mb']:.1f} MB{extra}", "reported", "-"))
        for t in r.get("targets", []):
            rows.append((f"scale: {t['name']}", f"{t['value']:,}", t["target"].replace(">=", "≥").replace("<=", "≤"),
                         _verdict(t["pass"])))
        return rows
    if name == "replay-speed":
        for row in r.get("rows", []):
            which = "whole" if row.get("count") is None else f"first {row['count']:,}"
            rows.append((f"replay speed: `{row['log']}` ({which}), {row['allocator']}, 262,144 slots, --trace-out, "
                         f"engine {row['engine']}",
                         f"{row['wall_s']:,.1f} s, {row['requests']:,} requests, {row['steps']:,} steps "
                         f"({row['busy_steps']:,} busy: {row['busy_steps_per_s']:,.0f}/s); CPU {row['cpu_s']:,.1f} s; peak RSS "
                         f"{row['peak_rss_mb']:,.0f} MB" + (f" ({row['processes']} processes: {row['peak_rss_sum_mb']:,.0f} MB summed)"
                                                          if row.get("processes", 1) > 1 else "")
                         + f"; trace {row['trace_mb']:,.1f} MB "
                         f"({row['trace_kb_per_step']:.1f} KB a step)", "reported", "-"))
        for sb in r.get("side_by_side", []):
            (new_wall, old_wall), (new_cpu, old_cpu) = sb["wall_s"], sb["cpu_s"]
            rows.append((f"replay speed, side by side: `{sb['log']}` (whole, {sb['requests']:,} requests), {sb['allocator']}, "
                         f"this engine against {r.get('baseline')}'s",
                         f"{sb['wall_speedup']:.2f}x in wall time ({new_wall:,.1f} vs {old_wall:,.1f} s), "
                         f"{sb['cpu_speedup']:.2f}x in CPU time ({new_cpu:,.1f} vs {old_cpu:,.1f} s)", "reported", "-"))
        for t in r.get("targets", []):
            rows.append((f"replay speed: {t['name']}", f"{t['value']:,}", t["target"].replace(">=", "≥").replace("<=", "≤"),
                         _verdict(t["pass"])))
        return rows
    if name == "roofline":
        peak = r.get("peak_gflops", {})
        for v in r.get("variants", []):
            rows.append((f"roofline: {v['dtype']} decode step at batch {v['batch']}, one thread",
                         f"{v['tokens_per_s']:.0f} tok/s, {v['gflops']:.0f} GFLOP/s = {v['share_of_peak']:.0%} of the "
                         f"{peak.get(v['dtype'], 0):.0f} GFLOP/s matmul peak ({v['share_of_roofline']:.0%} of its memory roofline, "
                         f"{v['roofline_gflops']:.0f} GFLOP/s)", "reported", "-"))
        for t in r.get("targets", []):
            rows.append((f"roofline: {t['name']}", f"{t['value']:.0%}", t["target"].replace(">=", "≥"), _verdict(t["pass"])))
        return rows
    if name == "prefix-capacity":
        paper = dict((t, v) for t, v in r.get("paper_figure_9", []))
        for p in r.get("points", []):
            near = next((v for t, v in paper.items() if abs(t - p["capacity_tokens"]) / t < 0.05), None)
            engine = (f"engine LRU {p['engine_lru']:.3f}, Belady {p['engine_belady']:.3f} (running requests held "
                      f"{p['running_share']:.0%} of the pool; ideal replay on the rest: LRU {p['ideal_lru_at_left_over']:.3f}, "
                      f"Belady {p['ideal_belady_at_left_over']:.3f}); " if "engine_lru" in p else
                      "replay only (past the largest pool); ")
            rows.append((f"prefix-capacity: {p['capacity_tokens'] / 1e6:.1f}M-token cache, Mooncake conversation trace",
                         engine + f"ideal replay LRU {p['ideal_lru']:.3f}, Belady {p['ideal_belady']:.3f}"
                         + (f"; paper {near:.2f}" if near is not None else ""), "reported", "-"))
        wall = (f" ({r['engine_wall_seconds']:.0f} s wall on {r['engine_workers']} processes)"
                if "engine_wall_seconds" in r else "")
        rows.append(("prefix-capacity: unbounded cache (every block seen before is a hit)",
                     f"{r.get('unbounded', 0):.3f} (paper's cache ratio 0.40); {r.get('requests', 0):,} requests, engine runs "
                     f"{r.get('engine_seconds', 0):.0f} s in all{wall}", "reported", "-"))
        for t in r.get("targets", []):
            value = t["value"]
            shown = (", ".join(map(str, value)) if "issue" in t["name"] else "see result file") if isinstance(value, list) \
                else f"{value:,}"
            rows.append((f"prefix-capacity: {t['name']}", shown, t["target"].replace(">=", "≥").replace("<=", "≤"),
                         _verdict(t["pass"])))
        return rows
    if name == "peers":
        for peer in r.get("peers", []):
            sim = peer.get("simulated", {})
            what = f"{sim.get('requests_simulated') or sim.get('requests_in_trace', 0):,} requests"
            if peer.get("ran"):
                value = (f"{peer['wall_s']:,.1f} s wall, {peer['cpu_s']:,.1f} CPU s, {what}"
                         + ("; a synthetic workload matched to the log (no trace input)" if peer.get("replays_log") is False
                            else "; the log itself"))
            else:
                value = f"did not run: {peer.get('why', '?')} (after {peer.get('wall_s', 0):,.1f} s)"
            label = peer["name"] + (f" {peer['version']}" if peer.get("version") else "")
            rows.append((f"peers: {label} on the Azure conversation log ({r.get('requests_in_log', 0):,} rows)", value,
                         "reported", "-"))
        return rows
    if name == "quiet-steps":
        for q in r.get("rows", []):
            rows.append((f"steps without events in `{q['log']}` (whole, paged, block size {q['block_size']}): what "
                         "coalescing them into runs could save",
                         f"{q['steps_coalescing_could_save']:,} of {q['busy_steps']:,} busy steps "
                         f"({q['share_of_busy_steps_saved']:.1%}); {q['quiet_busy_steps']:,} quiet steps in "
                         f"{q['quiet_stretches']:,} stretches, the longest {q['longest_stretch']}", "reported", "-"))
        return rows
    if name in ("decode-runs", "decode-runs-traced"):
        for d in r.get("rows", []):
            same = "the same summary and waste split" if d["same_figures"] else "**figures differ**"
            traced = d.get("trace", False)
            trace = (f"; trace {d['trace_bytes_without'] / 1e6:.1f} MB without, {d['trace_bytes_with'] / 1e6:.1f} MB with"
                     if traced else "")
            rows.append((f"decode runs (`Engine(coalesce=True)`), `{d['log']}` (whole, paged), `simulate` "
                         f"{'`--trace-out` (a run one frame)' if traced else 'without a trace'}, side by side in one process",
                         f"{d['steps_in_runs']:,} of {d['steps']:,} steps in runs; wall s without "
                         f"{', '.join(f'{x:.1f}' for x in d['wall_s_without'])}, with "
                         f"{', '.join(f'{x:.1f}' for x in d['wall_s_with'])} ({_x(d['speedup_best_wall'])} best against "
                         f"best){trace}; {same}", "reported", "-"))
        return rows
    if name == "live":
        for t in r.get("targets", []):
            rows.append((f"live: {t['name']}", str(t["value"]), t["target"].replace(">=", "≥").replace("<=", "≤"),
                         _verdict(t["pass"])))
        return rows
    if name == "throughput":
        m = r["main"]
        v = m["variants"]
        p = v["pagedkv_paged"]
        cpu = m["ratios"]["cpu_time"]
        for key, other, label in (("paged_vs_generate_batch", "hf_generate_batch", "transformers `generate_batch`"),
                                  ("paged_vs_static_batch", "hf_static_batch", "transformers static batch")):
            t = next(t for t in r["targets"] if t["name"].startswith("paged / hf " + ("generate" if "generate" in key else "static")))
            rows.append((f"throughput: pagedkv paged vs {label}",
                         f"{_x(m['ratios'][key])} ({p['useful_tokens_per_s']:.1f} vs {v[other]['useful_tokens_per_s']:.1f} useful tok/s; "
                         f"per CPU second {_x(cpu[key])})", t["target"].replace(">=", "≥") + "x", _verdict(t["pass"])))
        if "hf_one_at_a_time" in v:
            rows.append(("throughput: pagedkv paged vs transformers one at a time",
                         f"{_x(m['ratios']['paged_vs_one_at_a_time'])} ({v['hf_one_at_a_time']['useful_tokens_per_s']:.1f} useful tok/s)",
                         "reported", "-"))
        rows.append(("throughput: pagedkv contiguous (same 2,048 slots)",
                     f"{v['pagedkv_contiguous']['useful_tokens_per_s']:.1f} useful tok/s (paged {_x(m['ratios']['paged_vs_contiguous'])})",
                     "reported", "-"))
        ident = m["token_identity_vs_hf_static_batch"]
        bad = {k: len(x["mismatches"]) for k, x in ident.items() if not x["identical"]}
        rows.append(("throughput: greedy outputs token-identical to transformers static batch",
                     "all 16 prompts, every variant" if not bad else
                     "; ".join(f"{k}: {n} of 16 differ" for k, n in bad.items()), "identical", _verdict(not bad)))
        if "tight" in r:
            t = r["tight"]
            tt = next(x for x in r["targets"] if x["name"].startswith("tight"))
            rows.append((f"throughput, tight budget ({t['setup']['requests']} requests, {t['setup']['pool_slots']:,} slots, "
                         f"max_tokens {t['setup']['max_tokens']}): paged vs contiguous",
                         f"{_x(t['paged_vs_contiguous'])} ({t['paged']['useful_tokens_per_s']:.1f} vs "
                         f"{t['contiguous']['useful_tokens_per_s']:.1f} useful tok/s; per CPU second "
                         f"{_x(t['paged_vs_contiguous_cpu_time'])}; mean running {t['paged']['mean_running']} vs "
                         f"{t['contiguous']['mean_running']})", tt["target"].replace(">=", "≥") + "x", _verdict(tt["pass"])))
        mem = v["pagedkv_paged"]["peak_rss_mb"]
        rows.append(("throughput: peak RSS of the shared benchmark process", f"{mem:.0f} MB (all variants, one process)",
                     "reported", "-"))
        rows += _vllm_rows(r)
        return rows
    if name == "overhead":
        for kind in ("decode", "prefill"):
            s = r.get(kind)
            if not s:
                continue
            for base, label in (("bare_pagedkv", "our bare forward"), ("bare_transformers", "transformers' bare forward")):
                t = next(x for x in r["targets"] if x["name"].startswith(kind) and base.replace("_", " ") in x["name"])
                rows.append((f"overhead: {kind} step vs {label}",
                             f"{_x(s['engine_vs_' + base])} ({s['engine_step_ms']:.1f} vs {s[base + '_forward_ms']:.1f} ms per step)",
                             "≤ 1.10x", _verdict(t["pass"])))
        return rows
    if name == "prefix":
        t = {x["name"]: x for x in r["targets"]}
        rows.append(("prefix: prefill tokens computed for B / its prompt",
                     f"{r['B_prefill_fraction']:.1%} ({r['B_prefill_tokens_computed']} of {r['B_prompt_tokens']})", "≤ 10%",
                     _verdict(t["prefill tokens computed for B / B's prompt"]["pass"])))
        rows.append(("prefix: TTFT(B) / TTFT(A), 600-token shared system prompt",
                     f"{_x(r['ttft_B_over_A'])} ({r['ttft_B_ms']:.0f} vs {r['ttft_A_ms']:.0f} ms)", "≤ 0.25x",
                     _verdict(t["TTFT(B) / TTFT(A)"]["pass"])))
        return rows
    if name == "simulator":
        t = r["targets"][0]
        rows.append(("simulator: steps/s, 2,048 slots, 40 live requests, snapshots on",
                     f"{r['paged_steps_per_s_median']:,.0f} (median of {r['setup']['repeats']}; best {r['paged_steps_per_s_best']:,.0f})",
                     t["target"].replace(">=", "≥"), _verdict(t["pass"])))
        return rows
    if name == "memory":
        t = r["targets"][0]
        rows.append(("memory: peak RSS of `generate`, 2,048-slot pool, fresh process",
                     f"{r['peak_rss_bytes'] / 1e9:.2f} GB ({r['peak_rss_bytes'] / 2**30:.2f} GiB)"
                     + (f"; {r['with_plain_linears']['peak_rss_bytes'] / 1e9:.2f} GB without the pre-packed weight copies"
                        if "with_plain_linears" in r else ""), "≤ 1.5 GB", _verdict(t["pass"])))
        return rows
    if name == "playback":
        t = r["targets"][0]
        rows.append(("playback: server time of one step's figures on *Reserve or page* (a 2,048-slot pair of heatmaps, "
                     "the event strip and the curves, as sent)",
                     f"{r['median_ms']:.0f} ms median (p90 {r['p90_ms']:.0f} ms)", "< 150 ms", _verdict(t["pass"])))
        return rows
    if name == "step-cost":
        sizes = r["setup"]["sizes"]
        lo, hi = r["setup"]["slope_between"]
        for engine, e in r["engines"].items():
            for way in e["us_per_step"]:
                steps = ", ".join(f"{e['us_per_step'][way][str(n)]:,.0f}" for n in sizes)
                rows.append((f"step cost, {way} ({_STEP_COST_WAYS[way]}), {engine}: "
                             f"µs per step at {', '.join(map(str, sizes))} decoding sequences; µs each sequence adds ({lo} to {hi})",
                             f"{steps}; **{e['us_per_sequence'][way]:.2f}**", "reported", "-"))
        for way, x in r.get("ratio_per_sequence", {}).items():
            rows.append((f"step cost, {way}: per-sequence cost, commit {r['setup']['baseline']} / this engine",
                         _x(x), "reported", "-"))
        return rows
    if name.startswith("gpu"):
        if r.get("skipped"):
            rows.append((f"GPU: {name}", f"skipped: {r.get('reason', '')}", "see issue", "skipped"))
        else:
            rows.append((f"GPU: {name}", f"see `benchmarks/results/{name}.json` ({r.get('device') or r.get('machine', {}).get('gpu', 'GPU')})",
                         "see issue", "reported"))
        return rows
    return rows


def _vllm_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """The vLLM peer of ``bench throughput`` (benchmarks/vllm_peer.py): one row per thread count."""
    v = r.get("vllm")
    if not v:
        return []
    if "skipped" in v:
        return [("throughput: pagedkv vs vLLM's CPU backend", f"skipped: {v['skipped']}", "≥ 1.25x", "skipped")]
    rows = []
    for n, x in v["by_threads"].items():
        t = next(t for t in r["targets"] if t["name"].startswith(f"pagedkv / vLLM CPU backend, {n} thread"))
        loads = x["load_average_1min"]
        d = x["first_divergence"]
        same = "token-identical" if d is None else (f"first divergence: request {d['request']}, position {d['position']} "
                                                    f"(pagedkv {d['pagedkv_token']}, vLLM {d['vllm_token']})")
        on = f" on {v['cpu']}" if v.get("cpu") else ""
        rows.append((f"throughput: pagedkv vs vLLM's CPU backend ({v['setup']['vllm'].split(',')[0]}, over HTTP), {n} thread(s){on}",
                     f"{_x(x['pagedkv_vs_vllm'])} ({x['pagedkv']['useful_tokens_per_s']:.1f} vs "
                     f"{x['vllm']['useful_tokens_per_s']:.1f} useful tok/s, medians of {v['setup']['repetitions']}"
                     + (f"; per CPU second {_x(x['pagedkv_vs_vllm_per_cpu_s'])}" if x.get("pagedkv_vs_vllm_per_cpu_s") else "")
                     + f"; {same}; "
                     + (f"measured {v['date'][:10]} with `{v['command']}`; " if v.get("command") else "")
                     + f"load average {min(loads):.1f}-{max(loads):.1f})", t["target"].replace(">=", "≥") + "x",
                     _verdict(t["pass"])))
    return rows


def _vllm_note(r: dict, missed: list[dict]) -> str | None:
    """The vLLM peer's misses: the figures per thread count, per CPU second, and the load."""
    v = r.get("vllm") or {}
    bad = [t for t in missed if t["name"].startswith("pagedkv / vLLM")]
    if not bad or "by_threads" not in v:
        return None
    parts = []
    for n, x in v["by_threads"].items():
        cpu = x.get("pagedkv_vs_vllm_per_cpu_s")
        loads = x["load_average_1min"]
        parts.append(f"{n} thread(s): {x['pagedkv_vs_vllm']:.2f}x ({x['pagedkv']['useful_tokens_per_s']:.1f} vs "
                     f"{x['vllm']['useful_tokens_per_s']:.1f} useful tok/s" + (f"; per CPU second {cpu:.2f}x" if cpu else "")
                     + f"; load average {min(loads):.1f}-{max(loads):.1f})")
    return (f"**throughput vs vLLM's CPU backend** (target 1.25x; {'; '.join(parts)}; {v.get('cpu', '')}): vLLM "
            "serves over HTTP, so its wall time includes its API server, but its engine core, worker and API server are "
            "separate processes that run beside the bound OpenMP threads (its figure at 1 thread uses more than one core "
            "when one is free, and more of a shared machine's time slices when it is not), while pagedkv's forward runs "
            "on its torch threads alone; the per-CPU-second ratio counts every process of each side. On a loaded machine "
            "(load average above the core count) neither figure is clean. What limits pagedkv (README, *Where vLLM's time "
            "goes*): both sides run the same oneDNN GEMM kernels; pagedkv's extra cost per token is its K/V gather before "
            "attention and its unfused elementwise ops, which vLLM's C++ paged attention and `torch.compile` avoid. "
            "See `benchmarks/results/throughput.json`")


def _notes(name: str, r: dict) -> str | None:
    """One line on what limits each missed target (from the measured figures)."""
    missed = [t for t in r.get("targets", []) if not t.get("pass")]
    if not missed:
        return None
    vllm_note = _vllm_note(r, missed) if name == "throughput" else None
    if name == "throughput" and all(t["name"].startswith("pagedkv / vLLM") for t in missed):
        return vllm_note
    if name == "throughput" and "tight" in r and any(t["name"].startswith("tight") for t in missed):
        t = r["tight"]
        p, c = t["paged"], t["contiguous"]
        # step time = fixed + per_seq x running, fitted to the two runs
        per_seq = (p["ms_per_step"] - c["ms_per_step"]) / max(1e-9, p["mean_running"] - c["mean_running"])
        fixed = c["ms_per_step"] - per_seq * c["mean_running"]
        return (f"**throughput, tight budget** ({t['paged_vs_contiguous']:.2f}x, target 2.5x): paged runs "
                f"{p['mean_running'] / c['mean_running']:.1f}x as many sequences per step on average (peak {p['peak_running']} vs "
                f"{c['peak_running']}) and needs {c['steps'] / p['steps']:.1f}x fewer steps, but its steps cost more: "
                f"{p['ms_per_step']:.0f} ms at {p['mean_running']:.1f} sequences vs {c['ms_per_step']:.0f} ms at "
                f"{c['mean_running']:.1f}, i.e. about {fixed:.0f} ms per step + {per_seq:.1f} ms per sequence. On this CPU the "
                f"per-sequence part (fp32 matmul FLOPs, attention) outweighs the fixed part (reading the weights) at these "
                f"batch sizes, so running more sequences at once gains little; the 2.5x assumes a memory-bound decode, as on "
                f"a GPU. Paged also "
                f"recomputed {p['prefill_tokens_computed'] - p['prompt_tokens']:,} prefill tokens after {p['recomputes']} "
                f"recompute preemptions." + (f"\n- {vllm_note}" if vllm_note else ""))
    if name == "prefix-capacity" and any("issue" in t["name"] for t in missed):
        t = next(t for t in missed if "issue" in t["name"])
        return (f"**prefix-capacity, the issue's replay** (ours {', '.join(f'{v:.3f}' for v in t['value'])}; the issue's "
                f"{t['target']}): our replay follows the engine's and vLLM's rules, which cache only full blocks, so a "
                "prompt's partial last block never takes a cache slot (nor is it ever a hit); the issue's replay cached it "
                "too, one block per request, and so had about 4% less room for the blocks that come back. Caching the "
                "partial block as well reproduces 0.054, 0.142 and 0.291. See `benchmarks/results/prefix-capacity.json`")
    if name == "memory":
        plain = r.get("with_plain_linears", {}).get("peak_rss_bytes")
        ph = r.get("rss_by_phase_bytes", {})
        return (f"**memory** ({r['peak_rss_bytes'] / 1e9:.3f} GB, target 1.5 GB): the peak comes while the model loads, "
                f"not while it generates ({r.get('peak_rss_sampled_during_generate_bytes', 0) / 1e9:.2f} GB during generate). "
                f"`LLM` reads the 538 MB safetensors cache into memory of its own (not memory-mapped) so that the runner can "
                f"free each layer's transformers weights as soon as it has packed its own copy (before that change both copies "
                f"stayed resident: 1.81 GB); but transformers reads the file's bytes and builds the tensors from them, so the "
                f"two briefly coexist, on top of {ph.get('imports', 0) / 1e6:.0f} MB of torch and transformers. Loading the "
                f"weights tensor by tensor straight from the file would remove that transient.")
    if name == "scale":
        speed = [t for t in missed if t["name"].startswith("recording speed")]
        other = [t for t in missed if t not in speed]
        out = []
        if speed:
            out.append("**scale, recording speed** (" + ", ".join(f"{t['value']:,.0f}" for t in speed) +
                       " steps/s at 262,144 slots, target 2,000): the recording is not what limits it (it stores only what "
                       "changed, and a step without a snapshot hands it only the block tables that changed); the engine's "
                       "Python bookkeeping does. `azure-conv` keeps 40 to 70 sequences running: their plain decodes go "
                       "through the decode lane (one write, one change-log entry, their tokens drawn at once), but each still "
                       "costs a few Python calls a step, and every other sequence (prefill, a block that fills up) goes through "
                       "the per-sequence paths, block by block. The 2,000 target "
                       "was set from the 2,048-slot simulator with 40 short requests. Meeting it needs the sequence state "
                       "itself in numpy arrays across steps. The host's speed moves these figures: the README's engine-step "
                       "section compares engines side by side. Measured on a 2-core machine (load average in the result file)")
        if other:
            out.append("; ".join(f"**scale**: {t['name']} = {t['value']} (target {t['target']})" for t in other))
        return "; ".join(out) + " (see `benchmarks/results/scale.json`)"
    if name == "roofline":
        got = {t["name"].split()[0]: t["value"] for t in missed}
        return ("**roofline** (at batch 32: fp32 " + f"{got.get('float32', 0):.0%}" + ", bf16 " + f"{got.get('bfloat16', 0):.0%}"
                + " of the matmul peak; targets 75% and 50%): a decode step at batch 32 streams all 538 MB of fp32 weights "
                "(269 MB in bf16) for 32 tokens, about 6-12 FLOP a byte, and this core reads about 11 GB/s, so memory, "
                "not arithmetic, bounds it: the memory roofline is about 133 GFLOP/s in fp32 (87% of the fp32 peak, so "
                "75% is possible in principle) and about 267 GFLOP/s in bf16 (27% of the AMX bf16 peak, so 50% is not "
                "reachable at batch 32 on this machine). The engine reaches 39% (fp32) and 44% (bf16) of that roofline; "
                "the matmuls alone, with nothing else, take 65% of the fp32 step at 51% of the peak, and the rest is "
                "attention (21-30%) and about 40 small elementwise ops a layer, which a fused native decode-attention "
                "kernel would cut. See `benchmarks/results/roofline.json`")
    if name == "live" and "cpu" in r.get("single", {}):
        one, c = r["single"], r["single"]["cpu"]
        multi = r.get("multi", {})
        return (f"**live** ({one['steps_per_s']} steps/s in one session, target 4; first frame {one['first_frame_s']} s): "
                f"the cores, shared by the server and the one Chromium drawing the page, are {c['cpu_share_of_cores']:.0%} busy. "
                f"A step costs the server {c['server_cpu_s_per_step']} CPU-s (the two engines' forwards side by side, one "
                f"thread each, and the figures) and the browser {c['browser_cpu_s_per_step']} CPU-s, because the browser "
                f"draws about {one['frames_per_s']} frames a second (two pool heatmaps, the side charts, the utilization "
                f"curves and the answers table, rasterized in software: no GPU) at about "
                f"{c['browser_cpu_s_per_step'] * one['steps_per_s'] / max(1e-9, one['frames_per_s']):.1f} CPU-s a frame. "
                f"With the browser on another machine, as in a workshop where each visitor has a laptop, the same server "
                f"CPU cost gives {c['steps_per_s_if_cores_idle_browser_elsewhere']} steps/s on these two cores"
                + (f" ({multi['cpu']['steps_per_s_if_cores_idle_browser_elsewhere']} steps/s in all with {multi['sessions']} sessions; "
                   f"{multi['steps_per_s_min']} each with their browsers here)" if multi.get("cpu") else "")
                + ". The figures a frame builds cost the server about a quarter of what they did (2026-12-04: built "
                  "without plotly's validation); what is left is the two forwards a step and the browser's drawing, "
                  "which share the two cores. See `benchmarks/results/live.json`")
    if name == "simulator":
        paged = next((c for c in r.get("closed_loop", []) if c.get("allocator") == "paged"), {})
        runs = paged.get("repeats_steps_per_s") or []
        spread = f"; its runs spread {min(runs):,}-{max(runs):,} steps/s on this shared machine" if runs else ""
        return (f"**simulator** (median {r.get('paged_steps_per_s_median', 0):,.0f} steps/s, best "
                f"{r.get('paged_steps_per_s_best', 0):,.0f}, target "
                f"{(r.get('targets') or [{}])[0].get('target', '>= 2000').replace('>= ', '')}{spread}): the engine's Python per-sequence "
                "bookkeeping limits it, as for scale's recording speed: 40 live sequences scheduled, written and checked "
                "each step (plain decodes in the decode lane, a few Python calls each), and a `RequestOutput` built for "
                "every request every step (the bench reads them). The host's speed moves this figure by more than a "
                "change to the engine does: the README's engine-step section compares engines side by side, in "
                "instructions a step. See `benchmarks/results/simulator.json`")
    return "; ".join(f"**{name}**: {t['name']} = {t['value']} (target {t['target']})" for t in missed) + \
        f" (see `benchmarks/results/{name}.json`)"


def build_table(results: dict[str, dict], skipped: dict[str, str] | None = None, command: str = "python -m pagedkv_core bench",
                where: str = "benchmarks/results") -> str:
    """The table and its notes; ``where``: the folder the results are in, as the text names it."""
    skipped = dict(skipped or {})
    names = [n for n in ORDER if n in results]  # other files in results/ are not benchmarks of this table
    dates = {n: str(results[n].get("date", "?")) for n in names}
    machines = [results[n]["machine"] for n in names if isinstance(results[n].get("machine"), dict)]
    machine = next((m for m in machines if m.get("torch_threads")), machines[0] if machines else {})
    lines = ["| Benchmark | Measured | Target | Result |", "|---|---|---|---|"]
    for n in names:
        for b, m, t, v in _rows(n, results[n]):
            lines.append(f"| {b} | {m} | {t} | {v} |")
    if not any(n.startswith("gpu") for n in names):
        why = skipped.get("gpu", "no CUDA device on the machine that ran the benchmarks")
        lines.append(f"| GPU: `throughput` on CUDA in bf16 with the Triton kernels (256 requests) and the kernel figures "
                     f"| not measured: {why} | see issue | skipped |")
    latest = max(dates.values()) if dates else "?"
    head = [
        f"Latest benchmark figures ({latest[:10]}), measured with `{command}` "
        f"(results in `benchmarks/results/*.json`).",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
        + (f" (flags {' '.join(machine['isa_flags']) or 'none of the fast paths'})" if machine.get("isa_flags") is not None else "")
        + f" (shared with other jobs while measuring; "
        f"1-minute load average {machine.get('load_average_1min', '?')}), {machine.get('platform', '?')}, "
        f"Python {machine.get('python', '?')}, torch {machine.get('torch', '?')} on **one torch thread** "
        f"(`torch.set_num_threads(1)`, for stable figures). Model: SmolLM2-135M-Instruct, fp32, CPU. "
        "Figures that compare engines are ratios of variants measured side by side, interleaved, in one process.",
        "",
    ]
    notes = [n for n in (_notes(name, results[name]) for name in names) if n]
    foot = [""]
    if notes:
        foot += ["Missed targets, and what limits them:", ""] + [f"- {n}" for n in notes] + [""]
    foot += ["Measured at: " + ", ".join(f"{n} {d}" for n, d in dates.items()) + "."]
    return ("\n".join(head + lines + foot) + "\n").replace("`benchmarks/results/", f"`{where}/")


def write_table(results_dir: Path = RESULTS, out: Path = TABLE, skipped: dict[str, str] | None = None,
                command: str = "python -m pagedkv_core bench") -> Path:
    try:
        where = Path(results_dir).resolve().relative_to(RESULTS.parent.parent).as_posix()
    except ValueError:  # a folder outside the project: named as given
        where = str(results_dir)
    text = build_table(load_results(results_dir), skipped, command, where)
    out.write_text(text)
    return out


if __name__ == "__main__":
    print(write_table().read_text())
    sys.exit(0)
