"""``python -m pagedkv_core generate``: run prompts through the real model on the paged engine.

    python -m pagedkv_core generate --prompt "What is the capital of France?" --chat --max-tokens 32
    python -m pagedkv_core generate --prompts-file prompts.json --allocator contiguous --json

The prompts file is a JSON list of strings or of ``{"prompt": str, "max_tokens": int}`` objects.
With ``--json`` stdout is one object ``{"outputs": [...], "summary": {...}}``. Bad input exits
with code 2 and one line on stderr; a prompt too long for the model or the pool is reported as
rejected (with the reason) while the others run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import ConfigError
from .sampling import SamplingParams


def register(subparsers) -> None:
    from .cli import add_engine_args

    p = subparsers.add_parser(
        "generate",
        help="generate text with the real model through the paged KV engine",
        description="Generate with SmolLM2 (or --model) through our own paged KV pool and block tables.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeat for several)")
    src.add_argument("--prompts-file", metavar="PATH", help='JSON list of strings or {"prompt", "max_tokens"} objects')
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=64, metavar="N", help="tokens per answer (default 64)")
    s.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    s.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1)")
    s.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (0 = off)")
    s.add_argument("--n", type=int, default=1, metavar="N", help="parallel samples per prompt (fork + copy-on-write)")
    add_engine_args(p)
    p.set_defaults(seed=None)
    for action in p._actions:  # the engine's --seed is the sampling seed here
        if action.dest == "seed":
            action.help = "sampling seed (default: a random one per request)"
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="PATH", help="GGUF file or transformers directory (default: bundled SmolLM2-135M-Instruct)")
    m.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    m.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA)")
    m.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    m.add_argument("--pool-blocks", type=int, default=None, metavar="N", help="pool size in blocks (instead of --pool-slots)")
    m.add_argument("--kv-budget", default=None, metavar="BYTES",
                   help="size the pool from a memory budget, e.g. 64MiB (instead of --pool-slots); "
                        "default: 2048 slots on the CPU, a profiled 90%% of the GPU on CUDA")
    p.add_argument("--trace-out", metavar="PATH", help="write every step's snapshot as JSON lines")
    p.add_argument("--json", action="store_true", help="print one JSON object: outputs and summary")
    p.set_defaults(func=cmd_generate)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    t = str(text).strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1
    if unit not in _UNITS or value <= 0:
        raise ConfigError(f"--kv-budget must be a size such as 64MiB or 1GB, got {text!r}")
    return int(value * _UNITS[unit])


def load_prompts(path: str) -> list[tuple[str, int | None]]:
    """(prompt, max_tokens or None) from a prompts file. Raises ConfigError (one line)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read prompts file {path!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"prompts file {path!r} is not JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"prompts file {path!r} must hold a non-empty JSON list")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            unknown = set(item) - {"prompt", "max_tokens"}
            if unknown:
                raise ConfigError(f"prompts file {path!r}, item {i}: unknown key(s) {', '.join(sorted(unknown))}")
            mt = item.get("max_tokens")
            if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
                raise ConfigError(f"prompts file {path!r}, item {i}: max_tokens must be an integer >= 1, got {mt!r}")
            out.append((item["prompt"], mt))
        else:
            raise ConfigError(f'prompts file {path!r}, item {i}: expected a string or {{"prompt": str, "max_tokens": int}}')
    return out


def _sampling(args, max_tokens: int | None) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            n=args.n,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def cmd_generate(args: argparse.Namespace) -> int:
    from .model.loader import ModelLoadError

    if args.prompt is not None:
        items = [(p, None) for p in args.prompt]
    else:
        items = load_prompts(args.prompts_file)
    params = [_sampling(args, mt) for _, mt in items]
    from .cli import config_from_args, engine_settings

    config_from_args(args, pool_slots=args.pool_slots or 2048)  # fail before loading the model
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    given = [f for f, v in (("--pool-slots", args.pool_slots), ("--pool-blocks", args.pool_blocks),
                            ("--kv-budget", args.kv_budget)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give the pool size one way only, got {' and '.join(given)}")
    sizing = {}
    if args.kv_budget is not None:
        sizing["kv_budget_bytes"] = parse_bytes(args.kv_budget)
    elif args.pool_blocks is not None:
        if args.pool_blocks < 1:
            raise ConfigError(f"--pool-blocks must be >= 1, got {args.pool_blocks}")
        sizing["pool_blocks"] = args.pool_blocks
    elif args.pool_slots is not None:
        sizing["pool_slots"] = args.pool_slots
    from .llm import LLM

    quiet = args.json or not sys.stderr.isatty()
    try:
        llm = LLM(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            threads=args.threads,
            progress=(lambda f, m: None) if quiet else None,
            **engine_settings(args),
            **sizing,
        )
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    snapshots = []
    on_step = (lambda _o, snap: snapshots.append(snap)) if args.trace_out else None
    outputs = llm.generate([p for p, _ in items], params, chat=args.chat, on_step=on_step)
    summary = dict(llm.last_summary or {})
    summary["model"] = llm.loaded.name
    if args.trace_out:
        from .trace import write_trace

        header = {**llm.engine.trace_header(), "model": llm.loaded.name, "prompts": [p for p, _ in items]}
        try:
            write_trace(args.trace_out, snapshots, header)
        except OSError as exc:
            raise ConfigError(f"cannot write trace {args.trace_out!r}: {exc.strerror}") from None
    rows = []
    for o in outputs:
        first = o.outputs[0] if o.outputs else None
        row = {
            "id": o.request_id,
            "prompt_token_ids": o.prompt_token_ids,
            "token_ids": first.token_ids if first else [],
            "text": first.text if first else "",
            "finish_reason": first.finish_reason if first else None,
        }
        if o.reject_reason:
            row["reject_reason"] = o.reject_reason
        if len(o.outputs) > 1:
            row["samples"] = [{"index": c.index, "token_ids": c.token_ids, "text": c.text,
                               "finish_reason": c.finish_reason} for c in o.outputs]
        rows.append(row)
    if args.json:
        print(json.dumps({"outputs": rows, "summary": summary}))
    else:
        print(format_generate(outputs, summary))
    return 0


def format_generate(outputs, s: dict) -> str:
    lines = []
    for o in outputs:
        if o.reject_reason:
            lines.append(f"[{o.request_id}] rejected: {o.reject_reason}")
            continue
        for c in o.outputs:
            tag = f"[{o.request_id}]" if len(o.outputs) == 1 else f"[{o.request_id}.{c.index}]"
            lines.append(f"{tag} ({len(c.token_ids)} tokens, {c.finish_reason}) {c.text}")
    lines.append("")
    alloc = f"{s['allocator']}, {s['pool_slots']} slots"
    if s["allocator"] == "paged":
        alloc += f", block size {s['block_size']}"
    rows = [
        ("model", f"{s.get('model')} on {s['device']} ({s['dtype']})"),
        ("allocator", alloc),
        ("tokens generated", f"{s['tokens_generated']} in {s['elapsed_s']:.2f} s ({s['tokens_per_s']:.1f} tok/s)"),
        ("steps", s["steps"]),
        ("running", f"peak {s['peak_running']}, mean {s['mean_running']:.1f}"),
        ("token utilization (mean)", f"{s['mean_token_utilization']:.1%}"),
        ("preemptions", f"{s['preemptions']} (swap out {s['swaps_out']}, in {s['swaps_in']}; recompute {s['recomputes']})"),
        ("prefix-cache hit rate", f"{s['prefix_cache_hit_rate']:.1%}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)
