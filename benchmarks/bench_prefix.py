"""Prefix caching: a 600-token shared system prompt, request B after request A.

Real SmolLM2 on the CPU (fp32, one torch thread), paged pool of 2,048 slots, block 16. A and B
are chat prompts with the same 600-token system message and different user questions. A runs
alone to completion in a fresh engine (its full prompt blocks stay in the prefix cache once it
finishes); then B arrives in the same engine. For each, time to first token (TTFT) = wall time
of the engine steps from its arrival to the step that samples its first token, and the prefill
tokens computed = the steps' prefill tokens (each request is alone in the engine). As a control,
B also runs in a fresh engine with prefix caching off (its cold TTFT).

Repeated ``rounds`` times; medians. Targets: prefill tokens computed for B <= 10% of its prompt;
TTFT(B) <= 0.25 x TTFT(A).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM_TOKENS = 600
QUESTION_A = "A customer asks: can I return a kettle I bought three weeks ago?"
QUESTION_B = "A customer asks: how long does delivery to Scotland take?"
TARGET_PREFILL_FRACTION = 0.10
TARGET_TTFT_RATIO = 0.25

_POLICY = [
    "You are the support assistant of Larkspur Home, a shop that sells kitchen appliances and furniture.",
    "Always greet the customer politely and answer in plain, friendly English.",
    "Returns are accepted within thirty days of delivery when the item is unused and in its original box.",
    "Refunds go back to the original payment method within five working days of the return arriving.",
    "Standard delivery takes three to five working days on the mainland and up to eight days to the islands.",
    "Express delivery costs six pounds and arrives the next working day when ordered before two o'clock.",
    "Large furniture is delivered by a two-person team who will place it in the room of the customer's choice.",
    "Never promise a delivery date that the tracking page does not show.",
    "Electrical items carry a two-year guarantee that covers faults but not accidental damage.",
    "If a customer reports a fault, ask for the order number, a short description and, if possible, a photo.",
    "Do not ask for card numbers, passwords or security codes under any circumstances.",
    "Gift cards are valid for two years and cannot be exchanged for cash.",
    "Price matching applies to identical items sold by major high-street retailers within seven days of purchase.",
    "Customers can change the delivery address until the order has been handed to the courier.",
    "Keep every answer short: at most four sentences unless the customer asks for detail.",
    "When you do not know the answer, say so and offer to pass the question to a human colleague.",
]


def system_prompt(tokenizer, n_tokens: int = SYSTEM_TOKENS) -> str:
    """A policy text of exactly ``n_tokens`` tokens (tokenized on its own)."""
    text, i = "", 0
    while len(tokenizer(text)["input_ids"]) < n_tokens + 8:
        text += ("" if not text else " ") + f"Rule {i + 1}: " + _POLICY[i % len(_POLICY)]
        i += 1
    ids = tokenizer(text)["input_ids"]
    for n in range(n_tokens, n_tokens + 8):  # trim to a cut that re-tokenizes to the same length
        cand = tokenizer.decode(ids[:n])
        if len(tokenizer(cand)["input_ids"]) == n_tokens:
            return cand
    return tokenizer.decode(ids[:n_tokens])


def chat_ids(tokenizer, system: str, question: str) -> list[int]:
    enc = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}], add_generation_prompt=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def _serve(engine, rid, prompt, sp) -> dict:
    """Add ``rid`` now and step until it finishes; TTFT and prefill tokens up to its first token."""
    hit0 = engine.allocator.hit_tokens
    engine.add_request(rid, prompt, sp)
    ttft = None
    prefill = 0
    elapsed = 0.0
    while engine.has_unfinished():
        t0 = time.perf_counter()
        outs, snap = engine.step()
        elapsed += time.perf_counter() - t0
        if ttft is None:
            prefill += snap.metrics.step_prefill_tokens
            if any(o.request_id == rid and o.outputs and o.outputs[0].token_ids for o in outs):
                ttft = elapsed
    return {"ttft_s": ttft, "prefill_tokens": prefill, "prompt_tokens": len(prompt),
            "prefix_hit_tokens": engine.allocator.hit_tokens - hit0}


def run(quick: bool = False, rounds: int = 3, llm=None) -> dict:
    import torch

    from benchmarks.common import cpu_llm
    from pagedkv_core.sampling import SamplingParams

    torch.set_num_threads(1)
    if quick:
        rounds = 1
    llm = llm or cpu_llm(keep_transformers_model=False)
    tok = llm.tokenizer
    system = system_prompt(tok)
    a_ids, b_ids = chat_ids(tok, system, QUESTION_A), chat_ids(tok, system, QUESTION_B)
    shared = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
    sp = llm._sampling_for(SamplingParams(max_tokens=2 if quick else 8))
    per_round = []
    for _ in range(rounds):
        engine = llm.new_engine(prefix_caching=True)
        a = _serve(engine, "A", a_ids, sp)
        b = _serve(engine, "B", b_ids, sp)
        cold = _serve(llm.new_engine(prefix_caching=False), "B-cold", b_ids, sp)
        per_round.append({"A": a, "B": b, "B_cold": cold})
    med = lambda k, f: statistics.median(r[k][f] for r in per_round)  # noqa: E731
    ttft_a, ttft_b, ttft_cold = med("A", "ttft_s"), med("B", "ttft_s"), med("B_cold", "ttft_s")
    b0 = per_round[0]["B"]
    frac = b0["prefill_tokens"] / b0["prompt_tokens"]
    ratio = statistics.median(r["B"]["ttft_s"] / r["A"]["ttft_s"] for r in per_round)
    return {
        "setup": {"system_prompt_tokens": len(tok(system)["input_ids"]), "prompt_A_tokens": len(a_ids),
                  "prompt_B_tokens": len(b_ids), "shared_prefix_tokens": shared, "block_size": 16,
                  "pool_slots": 2048, "rounds": rounds, "max_tokens": sp.max_tokens,
                  "torch_threads": torch.get_num_threads(), "order": "A runs to completion, then B arrives"},
        "ttft_A_ms": round(ttft_a * 1e3, 1),
        "ttft_B_ms": round(ttft_b * 1e3, 1),
        "ttft_B_without_prefix_cache_ms": round(ttft_cold * 1e3, 1),
        "ttft_B_over_A": round(ratio, 4),
        "B_prefill_tokens_computed": b0["prefill_tokens"],
        "B_prefix_hit_tokens": b0["prefix_hit_tokens"],
        "B_prompt_tokens": b0["prompt_tokens"],
        "B_prefill_fraction": round(frac, 4),
        "rounds": [{k: {f: (round(v, 4) if isinstance(v, float) else v) for f, v in x.items()} for k, x in r.items()}
                   for r in per_round],
        "targets": [
            {"name": "prefill tokens computed for B / B's prompt", "value": round(frac, 4),
             "target": f"<= {TARGET_PREFILL_FRACTION}", "pass": frac <= TARGET_PREFILL_FRACTION},
            {"name": "TTFT(B) / TTFT(A)", "value": round(ratio, 4), "target": f"<= {TARGET_TTFT_RATIO}",
             "pass": ratio <= TARGET_TTFT_RATIO},
        ],
    }


def print_result(result: dict) -> None:
    from benchmarks.common import print_table

    print_table([
        {"request": "A (cold)", "prompt tokens": result["setup"]["prompt_A_tokens"], "TTFT ms": result["ttft_A_ms"],
         "prefill tokens": result["rounds"][0]["A"]["prefill_tokens"]},
        {"request": "B (after A)", "prompt tokens": result["B_prompt_tokens"], "TTFT ms": result["ttft_B_ms"],
         "prefill tokens": result["B_prefill_tokens_computed"]},
        {"request": "B, cache off", "prompt tokens": result["B_prompt_tokens"],
         "TTFT ms": result["ttft_B_without_prefix_cache_ms"], "prefill tokens": result["rounds"][0]["B_cold"]["prefill_tokens"]},
    ], ["request", "prompt tokens", "TTFT ms", "prefill tokens"])


if __name__ == "__main__":
    from benchmarks.common import write_result

    res = run("--quick" in sys.argv)
    print_result(res)
    print("wrote", write_result("prefix", {"command": "python benchmarks/bench_prefix.py", "quick": "--quick" in sys.argv, **res}))
