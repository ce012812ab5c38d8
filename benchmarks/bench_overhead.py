"""Overhead: the engine's step time against a bare batched forward of the same model on the same
token batch (no scheduling, allocation, metadata building, sampling or snapshots).

The 16 chat prompts run greedy through a paged engine (2,048 slots, block 16) on one torch thread.
Right after each ``engine.step()`` the same step is replayed, interleaved, so that both see the
same machine load:

* **bare pagedkv forward**: ``LlamaModel.forward`` called again with the very tensors the engine
  step built (token ids, positions, attention metadata, sampling rows); it re-writes the same K/V
  into the same slots, so the engine's state is unchanged;
* **bare transformers forward**: ``LlamaForCausalLM`` (the same weights) on the same token batch
  with a plain ``DynamicCache``: the prefill step as one left-padded batch, a decode step as one
  token per sequence over a (left-padded) cache of each sequence's context, logits of the last
  position only.

Per step kind (the prefill step, the decode steps) the ratio is sum(engine step times) /
sum(bare forward times), repeated ``rounds`` times with a fresh engine; the median is reported.
Target: engine step <= 1.10 x the bare forward.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 1.10


def _hf_decode_inputs(hf_model, ctx_lens, ids, device="cpu"):
    """A DynamicCache holding (random) K/V for each row's context minus the new token, left
    padded; returns (input_ids, attention_mask, position_ids, cache, past_len)."""
    import torch
    from transformers import DynamicCache

    cfg = hf_model.config
    n = len(ctx_lens)
    past = [c - 1 for c in ctx_lens]
    lp = max(past)
    hkv = cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    g = torch.Generator().manual_seed(0)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(n, hkv, lp, d, generator=g) * 0.5
        v = torch.randn(n, hkv, lp, d, generator=g) * 0.5
        cache.update(k, v, layer)
    mask = torch.zeros(n, lp + 1, dtype=torch.long)
    for i, p in enumerate(past):
        mask[i, lp - p:] = 1
    input_ids = torch.tensor(ids, dtype=torch.long).view(n, 1)
    position_ids = torch.tensor(past, dtype=torch.long).view(n, 1)
    return input_ids, mask, position_ids, cache, lp


def _hf_prefill_inputs(prompts, pad_id):
    import torch

    width = max(len(p) for p in prompts)
    x = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, p in enumerate(prompts):
        x[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return x, mask, pos


def run(quick: bool = False, rounds: int = 3, max_new_tokens: int = 32, llm=None) -> dict:
    import torch

    from benchmarks.common import chat_prompt_ids, cpu_llm
    from pagedkv_core.sampling import SamplingParams

    torch.set_num_threads(1)
    if quick:
        rounds, max_new_tokens = 1, 4
    llm = llm or cpu_llm(keep_transformers_model=True)
    runner, model, hf = llm.runner, llm.runner.model, llm.loaded.model
    prompts = chat_prompt_ids(llm.tokenizer)
    pad = llm.eos_token_id if llm.eos_token_id is not None else 0
    sp = SamplingParams(max_tokens=max_new_tokens)

    captured = {}
    real_forward = model.forward

    def capturing_forward(*args):
        captured["args"] = args
        return real_forward(*args)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    per_round = []
    for r in range(rounds):
        engine = llm.new_engine()
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, sp)
        sums = {k: {"engine": 0.0, "execute": 0.0, "bare": 0.0, "hf": 0.0, "steps": 0, "tokens": 0}
                for k in ("prefill", "decode")}
        step = 0
        while engine.has_unfinished():
            model.forward = capturing_forward
            try:
                t0 = time.perf_counter()
                _outs, snap = engine.step()
                t_engine = time.perf_counter() - t0
            finally:
                model.forward = real_forward
            args = captured.pop("args")
            ids, pos, meta = args[0], args[1], args[2]
            kind = "prefill" if meta.num_prefill_tokens else "decode"
            with torch.inference_mode():
                t_bare = timed(lambda: real_forward(*args))
                if kind == "prefill":
                    x, mask, hpos = _hf_prefill_inputs(
                        [list(s) for s in _split(ids.tolist(), snap, engine)], pad)
                    t_hf = timed(lambda: hf(input_ids=x, attention_mask=mask, position_ids=hpos,
                                            use_cache=True, logits_to_keep=1))
                else:
                    ctx = meta.decode_context_lens.tolist()
                    x, mask, hpos, cache, lp = _hf_decode_inputs(hf, ctx, ids.tolist())
                    t_hf = timed(lambda: hf(input_ids=x, attention_mask=mask, position_ids=hpos,
                                            past_key_values=cache, use_cache=True, logits_to_keep=1))
                    del cache
            s = sums[kind]
            s["engine"] += t_engine
            s["execute"] += runner.last_step_seconds
            s["bare"] += t_bare
            s["hf"] += t_hf
            s["steps"] += 1
            s["tokens"] += int(ids.shape[0])
            step += 1
        per_round.append(sums)

    def summarize(kind):
        rows = [p[kind] for p in per_round if p[kind]["steps"]]
        if not rows:
            return None
        ratio_bare = statistics.median(x["engine"] / x["bare"] for x in rows)
        ratio_hf = statistics.median(x["engine"] / x["hf"] for x in rows)
        ratio_exec = statistics.median(x["execute"] / x["bare"] for x in rows)
        med = lambda key: statistics.median(x[key] / x["steps"] for x in rows)  # noqa: E731
        return {
            "steps_per_round": rows[0]["steps"],
            "tokens_per_round": rows[0]["tokens"],
            "engine_step_ms": round(med("engine") * 1e3, 2),
            "runner_execute_ms": round(med("execute") * 1e3, 2),
            "bare_pagedkv_forward_ms": round(med("bare") * 1e3, 2),
            "bare_transformers_forward_ms": round(med("hf") * 1e3, 2),
            "engine_vs_bare_pagedkv": round(ratio_bare, 3),
            "engine_vs_bare_transformers": round(ratio_hf, 3),
            "execute_vs_bare_pagedkv": round(ratio_exec, 3),
            "rounds": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in x.items()} for x in rows],
        }

    result = {
        "setup": {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "pool_slots": 2048,
                  "block_size": 16, "rounds": rounds, "torch_threads": torch.get_num_threads(),
                  "dtype": runner.dtype_name},
        "prefill": summarize("prefill"),
        "decode": summarize("decode"),
    }
    targets = []
    for kind in ("decode", "prefill"):
        s = result[kind]
        if s is None:
            continue
        for base in ("bare_pagedkv", "bare_transformers"):
            v = s[f"engine_vs_{base}"]
            targets.append({"name": f"{kind} step / {base.replace('_', ' ')} forward", "value": v,
                            "target": f"<= {TARGET}", "pass": v <= TARGET})
    result["targets"] = targets
    return result


def _split(flat_ids, snap, engine):
    """The prefill step's per-sequence prompts (in the engine's order: prefill chunks first)."""
    # every request of this benchmark prefills whole in the first step, in request order
    out, o = [], 0
    for r in sorted(engine.requests.values(), key=lambda r: r.index):
        n = len(r.prompt_token_ids)
        out.append(flat_ids[o:o + n])
        o += n
    assert o == len(flat_ids), "prefill step is not the whole set of prompts"
    return out


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    rows = []
    for kind in ("prefill", "decode"):
        s = result[kind]
        if s:
            rows.append({"step": kind, "steps": s["steps_per_round"], "engine ms": s["engine_step_ms"],
                         "bare pagedkv ms": s["bare_pagedkv_forward_ms"],
                         "bare transformers ms": s["bare_transformers_forward_ms"],
                         "engine/bare pagedkv": s["engine_vs_bare_pagedkv"],
                         "engine/bare transformers": s["engine_vs_bare_transformers"]})
    print_table(rows, ["step", "steps", "engine ms", "bare pagedkv ms", "bare transformers ms",
                       "engine/bare pagedkv", "engine/bare transformers"])


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("overhead", {"command": "python benchmarks/bench_overhead.py", "quick": "--quick" in sys.argv, **res}))
