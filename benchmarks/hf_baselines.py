"""transformers' own ways to serve the same prompts: the peers pagedkv is measured against.

Each function returns the generated token ids per prompt (greedy) and the wall time of the
generation alone (model already loaded).
"""
from __future__ import annotations

import time

import torch


def generate_one_at_a_time(model, prompt_ids: list[list[int]], max_new_tokens: int):
    outs = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False)
            outs.append(y[0, len(ids):].tolist())
    return outs, time.perf_counter() - t0


def generate_static_batch(model, prompt_ids: list[list[int]], max_new_tokens: int, pad_id: int):
    """One left-padded batch: every row runs until the longest answer is done."""
    width = max(len(p) for p in prompt_ids)
    x = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, p in enumerate(prompt_ids):
        x[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = model.generate(x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=pad_id)
    elapsed = time.perf_counter() - t0
    return [row[width:].tolist() for row in y], elapsed


def generate_continuous_batch(model, prompt_ids: list[list[int]], max_new_tokens: int,
                              num_blocks: int = 64, block_size: int = 256, max_batch_tokens: int = 1024):
    """transformers' own continuous-batching engine with explicit sizes (its default sizes the
    cache to a share of all RAM)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=model.config.eos_token_id,
                           pad_token_id=model.config.eos_token_id)
    cb = ContinuousBatchingConfig(num_blocks=num_blocks, page_size=block_size, max_batch_tokens=max_batch_tokens)
    t0 = time.perf_counter()
    with torch.inference_mode():
        res = model.generate_batch(inputs=prompt_ids, generation_config=gen, continuous_batching_config=cb,
                                   progress_bar=False)
    elapsed = time.perf_counter() - t0
    by_id = sorted(res.values(), key=lambda r: int(str(r.request_id).split("_")[-1]))
    return [list(r.generated_tokens) for r in by_id], elapsed
