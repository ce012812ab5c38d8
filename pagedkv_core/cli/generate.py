"""``python -m pagedkv_core generate``: run prompts through the real model on the paged engine.

    python -m pagedkv_core generate --prompt "What is the capital of France?" --chat --max-tokens 32
    python -m pagedkv_core generate --prompts-file prompts.json --allocator contiguous --json
    python -m pagedkv_core generate --request-log requests.csv --log-count 16 --length-scale 0.125

``--request-log`` replays a request log's lengths (a CSV such as Azure's, which publishes sizes, no
text) with prompts of real text (:mod:`pagedkv_core.workloads.log_prompts`); ``--trace-file``,
``--trace-start`` and ``--trace-count``, the former spellings of ``--request-log``, ``--log-start``
and ``--log-count``, still work. ``--trace-out`` records the run as a pagedkv trace.

The prompts file is a JSON list of strings, of ``{"prompt": str, "max_tokens": int}`` objects, or of
OpenAI-style chat items ``{"messages": [{"role": str, "content": str}, ...], "max_tokens": int}``,
which always go through the model's chat template with the generation prompt (as vLLM's chat
endpoint renders them), ``--chat`` or not. ``--sequential`` queues each request only when the previous
one has finished, as a chat client sends them. With ``--json`` stdout is one object
``{"outputs": [...], "summary": {...}}``; each output carries ``cached_tokens``, its prompt tokens
served from the prefix cache at its first admission (vLLM's ``prompt_tokens_details.cached_tokens``).
Bad input exits with code 2 and one line on stderr; a prompt too long for the model or the pool is
reported as rejected (with the reason) while the others run.

Every setting is checked before torch or the model loads (:func:`pagedkv_core.sizing.pool_plan.preflight`),
the KV pools included: a pool that would not fit the memory budget (``PAGEDKV_MEMORY_BUDGET``,
default half of RAM) is refused with its numbers before anything is allocated. When stderr is
not a terminal, or with ``--json``, nothing but that one error line ever reaches it (no loading bar).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..config import ConfigError
from ..events import ADMIT
from ..llm import DEFAULT_CPU_SLOTS, DEFAULT_MEMORY_FRACTION, HOST_SWAP_BUDGET  # no torch: the model loads in LLM()
from ..llm import check_max_tokens
from ..sizing.memory import parse_size
from ..sizing.pool_plan import model_kv_shape, preflight
from ..safe_io import check_writable, loads_json, read_text_capped
from ..sampling import SamplingParams
from ..workloads.log_prompts import log_requests
from ..workloads.scenarios import MAX_REQUESTS, read_log_rows
from .flags import add_engine_args, config_from_args, engine_settings
from .kv_events import add_kv_events_args, check_kv_events, open_kv_events
from .parsing import add_renamed, length_scale, trace_writer
from .summary import summary_table

POOL_DEFAULT = f"default: {DEFAULT_CPU_SLOTS} slots on the CPU, a profiled {DEFAULT_MEMORY_FRACTION:.0%} of the GPU on CUDA"
_SAMPLING = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with the real model through the paged KV engine",
        description="Generate with SmolLM2 (or --model) through our own paged KV pool and block tables.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeat for several)")
    src.add_argument("--prompts-file", metavar="PATH",
                     help='JSON list of strings, {"prompt", "max_tokens"} objects or OpenAI-style '
                          '{"messages": [{"role", "content"}, ...], "max_tokens"} chat items (always chat-templated)')
    add_renamed(src, "--request-log", "--trace-file", metavar="CSV",
                help="replay a request log's lengths (a CSV of TIMESTAMP, ContextTokens, GeneratedTokens): prompts "
                     "of real text of each row's scaled prompt length, answers of exactly its scaled answer length")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--sequential", action="store_true",
                   help="submit each request when the previous one has finished, as a chat client does")
    s = p.add_argument_group("sampling")
    d = _SAMPLING  # the defaults are SamplingParams' own
    s.add_argument("--max-tokens", type=int, default=d["max_tokens"], metavar="N", help=f"tokens per answer (default {d['max_tokens']})")
    s.add_argument("--temperature", type=float, default=d["temperature"], metavar="T", help=f"0 = greedy (default {d['temperature']:g})")
    s.add_argument("--top-p", type=float, default=d["top_p"], metavar="P", help=f"nucleus sampling mass (default {d['top_p']:g})")
    s.add_argument("--top-k", type=int, default=d["top_k"], metavar="K", help=f"keep the K most likely tokens (0 = off, default {d['top_k']})")
    s.add_argument("--ignore-eos", action="store_true", help="keep writing past the end-of-sequence token, to max-tokens")
    tr = p.add_argument_group("request-log replay (--request-log)")
    add_renamed(tr, "--log-start", "--trace-start", type=int, default=0, metavar="ROW", help="rows to skip (default 0)")
    add_renamed(tr, "--log-count", "--trace-count", type=int, default=16, metavar="N",
                help="requests to replay (default 16)")
    tr.add_argument("--length-scale", type=length_scale, default=0.125, metavar="F",
                    help="scale every length, e.g. 0.125 or 1/8, so the replay runs on a CPU (default 0.125)")
    s.add_argument("--n", type=int, default=d["n"], metavar="N", help=f"parallel samples per prompt (fork + copy-on-write, default {d['n']})")
    # The engine's --seed is the sampling seed here, and by default each request draws its own.
    add_engine_args(p, default_notes={
        "seed": "default: a random one per request",
        "swap_slots": f"generate caps the default at {HOST_SWAP_BUDGET / 2**30:g} GiB of K/V",
        "pool_slots": POOL_DEFAULT,
    })
    p.set_defaults(seed=d["seed"])
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="PATH", help="GGUF file or transformers directory (default: bundled SmolLM2-135M-Instruct)")
    m.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    m.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA)")
    m.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads, 1 to the CPU cores")
    m.add_argument("--pool-blocks", type=int, default=None, metavar="N", help="pool size in blocks (instead of --pool-slots)")
    m.add_argument("--kv-budget", default=None, metavar="BYTES",
                   help="size the pool from a memory budget, e.g. 64MiB (instead of --pool-slots); "
                        + POOL_DEFAULT.replace("%", "%%"))
    p.add_argument("--trace-out", metavar="PATH",
                   help="record the run as a pagedkv trace (every step; a JSON header line, then binary frames) for replay and the app")
    p.add_argument("--json", action="store_true", help="print one JSON object: outputs and summary")
    add_kv_events_args(p)
    p.set_defaults(func=cmd_generate)


MAX_PROMPTS_FILE_BYTES = 16 << 20  # checked before reading
MAX_PROMPTS = MAX_REQUESTS  # prompts per run: a workload's bound
MAX_PROMPT_CHARS = 1 << 20  # characters per prompt (tokenized before the engine sees its length)
MAX_MESSAGES = 4096  # messages per chat item
CHAT_ITEM = '{"messages": [{"role": str, "content": str}, ...], "max_tokens": int}'


def parse_bytes(text: str) -> int:
    """``--kv-budget``: a size such as 64MiB (:func:`pagedkv_core.sizing.memory.parse_size`)."""
    return parse_size(text, "--kv-budget")


def _messages(value, where: str) -> list[dict]:
    """A chat item's ``messages``, checked: a non-empty list of ``{"role": str, "content": str}``."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: messages must be a non-empty list of {{\"role\", \"content\"}} objects")
    if len(value) > MAX_MESSAGES:
        raise ConfigError(f"{where}: {len(value):,} messages, more than the {MAX_MESSAGES:,} allowed")
    chars = 0
    for j, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(f'{where}, message {j}: expected {{"role": str, "content": str}}')
        unknown = set(m) - {"role", "content"}
        if unknown:
            raise ConfigError(f"{where}, message {j}: unknown key(s) {', '.join(sorted(unknown))}")
        chars += len(m["content"])
    if chars > MAX_PROMPT_CHARS:
        raise ConfigError(f"{where}: {chars:,} characters, more than the {MAX_PROMPT_CHARS:,} allowed")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def load_prompts(path: str) -> list[tuple[str | list[dict], int | None]]:
    """(prompt, max_tokens or None) from a prompts file; a chat item's prompt is its list of
    messages. Raises ConfigError (one line)."""
    what = f"prompts file {path!r}"
    data = loads_json(read_text_capped(path, MAX_PROMPTS_FILE_BYTES, "prompts file"), what)
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{what} must hold a non-empty JSON list")
    if len(data) > MAX_PROMPTS:
        raise ConfigError(f"{what} holds {len(data):,} prompts, more than the {MAX_PROMPTS:,} allowed")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, dict) and ("prompt" in item or "messages" in item):
            key = "messages" if "messages" in item else "prompt"
            unknown = set(item) - {key, "max_tokens"}
            if unknown:
                raise ConfigError(f"{what}, item {i}: unknown key(s) {', '.join(sorted(unknown))}")
            mt = item.get("max_tokens")
            if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
                raise ConfigError(f"{what}, item {i}: max_tokens must be an integer >= 1, got {mt!r}")
            if key == "messages":
                out.append((_messages(item["messages"], f"{what}, item {i}"), mt))
                continue
            prompt = item["prompt"]
            if not isinstance(prompt, str):
                raise ConfigError(f"{what}, item {i}: prompt must be a string")
        elif isinstance(item, str):
            prompt, mt = item, None
        else:
            raise ConfigError(f'{what}, item {i}: expected a string, {{"prompt": str, "max_tokens": int}} or {CHAT_ITEM}')
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ConfigError(f"{what}, item {i}: {len(prompt):,} characters, more than the {MAX_PROMPT_CHARS:,} allowed")
        out.append((prompt, mt))
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
            ignore_eos=args.ignore_eos,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _pool_sizing(args) -> dict:
    """The one way the pool is sized (LLM's keyword), from --pool-slots, --pool-blocks or --kv-budget."""
    given = [(f, k, v) for f, k, v in (("--pool-slots", "pool_slots", args.pool_slots),
                                       ("--pool-blocks", "pool_blocks", args.pool_blocks),
                                       ("--kv-budget", "kv_budget_bytes", args.kv_budget)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give the pool size one way only, got {' and '.join(f for f, _, _ in given)}")
    if not given:
        return {}
    _flag, key, value = given[0]
    if key == "kv_budget_bytes":
        value = parse_bytes(value)
    elif key == "pool_blocks" and value < 1:
        raise ConfigError(f"--pool-blocks must be >= 1, got {value}")
    return {key: value}


def _log_rows(args) -> list:
    """The request-log rows to replay, checked before the model loads."""
    if not 0 < args.length_scale <= 1:
        raise ConfigError(f"--length-scale must be in (0, 1], got {args.length_scale}")
    if args.log_count < 1:
        raise ConfigError(f"--log-count must be >= 1, got {args.log_count}")
    rows = read_log_rows(args.request_log, args.log_start, args.log_count)
    if not rows:
        raise ConfigError(f"{args.request_log}: no rows after row {args.log_start}")
    return rows


def _check_context(model, items, params) -> None:
    """An answer longer than the model's context is refused before the model loads: its context
    is read from its ``config.json``, or from a GGUF's header before its first conversion (where
    neither can be read, LLM refuses it once loaded)."""
    shape = model_kv_shape(model)
    context = shape.max_position_embeddings if shape is not None else None
    if context:
        for i, ((_, mt), sp) in enumerate(zip(items, params)):
            check_max_tokens(sp.max_tokens, context, "--max-tokens" if mt is None else f"prompts file item {i}: max_tokens")


def cmd_generate(args: argparse.Namespace) -> int:
    from ..sources.model.loader import ModelLoadError  # no torch

    # Every check that needs neither torch nor the model first: a bad value fails at once.
    check_kv_events(args, config_from_args(args, pool_slots=args.pool_slots or DEFAULT_CPU_SLOTS).allocator)
    sizing = _pool_sizing(args)
    _sampling(args, None)
    if args.trace_out:
        check_writable(args.trace_out, "trace")
    model = dict(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads)
    try:
        preflight(**model, **engine_settings(args), **sizing)
        if args.request_log is not None:
            rows = _log_rows(args)
            items = params = None
        else:
            items = [(p, None) for p in args.prompt] if args.prompt is not None else load_prompts(args.prompts_file)
            params = [_sampling(args, mt) for _, mt in items]
            _check_context(args.model, items, params)
        from ..llm import LLM  # torch and the weights, only now

        llm = LLM(**model, quiet=args.json or not sys.stderr.isatty(), **engine_settings(args), **sizing)
        if args.request_log is not None:  # the tokenizer builds prompts of the log's exact lengths
            replay = log_requests(rows, llm.tokenizer, args.length_scale, seed=args.seed or 0,
                                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, n=args.n)
            items = [(ids, None) for ids, _ in replay]
            params = [sp for _, sp in replay]
            args.chat = False  # the replay's prompts carry the chat template already
        else:  # chat items: always the chat template, whatever --chat says (vLLM's chat endpoint)
            items = [(llm.encode_chat(p) if isinstance(p, list) else p, mt) for p, mt in items]
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    writer = engine = None
    if args.trace_out:
        writer = trace_writer(args.trace_out, {"model": llm.loaded.name, "prompts": [p for p, _ in items]})
    sink = open_kv_events(args, llm.config.block_size)  # closed at exit (cli.kv_events)
    if sink is not None:
        engine = llm.new_engine(recording=writer, kv_event_sink=sink)
    elif writer is not None:
        engine = llm.new_engine(recording=writer)
    cached: dict[str, int] = {}  # request id -> prompt tokens from the prefix cache, at its first admission

    def note_admissions(_outs, snap) -> None:
        for e in snap.events:
            if e.kind == ADMIT:
                cached.setdefault(e.request_id, int(e.detail.get("cached_tokens", 0)))

    try:
        outputs = llm.generate([p for p, _ in items], params, chat=args.chat, engine=engine, on_step=note_admissions,
                               on_submit=(lambda e: writer.set_header(e.trace_header())) if writer else None,
                               sequential=args.sequential)
    finally:
        if writer is not None:  # sequential: the header saw the first request only; the footer lists all
            writer.close({"requests": engine.trace_header()["requests"]} if args.sequential else None)
    summary = dict(llm.last_summary or {})
    summary["model"] = llm.loaded.name
    if sink is not None:
        summary["kv_events"] = sink.summary()
    rows = []
    for o in outputs:
        first = o.outputs[0] if o.outputs else None
        row = {
            "id": o.request_id,
            "prompt_token_ids": o.prompt_token_ids,
            "token_ids": first.token_ids if first else [],
            "text": first.text if first else "",
            "finish_reason": first.finish_reason if first else None,
            "cached_tokens": cached.get(o.request_id, 0),
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
    lines.append(summary_table(s, [
        ("model", f"{s.get('model')} on {s['device']} ({s['dtype']})"),
        "allocator",
        ("tokens generated", f"{s['tokens_generated']} in {s['elapsed_s']:.2f} s ({s['tokens_per_s']:.1f} tok/s)"),
        "steps",
        "running",
        "token utilization (mean)",
        "preemptions",
        "prefix-cache hit rate",
    ]))
    return "\n".join(lines)
