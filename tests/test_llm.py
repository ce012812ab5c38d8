"""The real model through the engine: LLM.generate, both allocators, block sizes, preemption by
swap and by recompute, the prefix cache, forks with copy-on-write, streaming and the CLI.

Every run must give transformers' own greedy tokens. The model runs on the CPU with short
prompts and 32 tokens, so the whole file takes about a minute on two cores.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from pagedkv_core import events
from pagedkv_core.sampling import SamplingParams

pytestmark = pytest.mark.slow

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to code.",
    "Why is the sky blue?",
]
MAX_TOKENS = 32
GREEDY = SamplingParams(max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def loaded():
    from pagedkv_core.sources.model.loader import load_model

    # One torch thread: predictable on a 2-core CI runner, and immune to the oversubscription
    # slowdowns of several OpenMP threads sharing busy cores. PAGEDKV_TEST_THREADS overrides.
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("PAGEDKV_TEST_THREADS", "1")))
    yield load_model(None, progress=lambda f, m: None)
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llm(loaded):
    from pagedkv_core.llm import LLM

    return LLM(loaded=loaded, device="cpu", block_size=16, pool_slots=2048)


@pytest.fixture(scope="module")
def prompt_ids(llm):
    return [llm.encode(c, chat=True) for c in CHATS]


@pytest.fixture(scope="module")
def hf_tokens(loaded, prompt_ids):
    """transformers' own greedy generate, one prompt at a time (no padding)."""
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            gen = loaded.model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
            out.append(gen[0, len(ids):].tolist())
    return out


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def run_engine(llm, requests, **overrides):
    """Drive a fresh engine by hand; requests = [(ids, sampling, arrival_step)]. Returns
    (token ids per request, snapshots, summary)."""
    engine = llm.new_engine(**overrides)
    for i, (ids, sp, arrival) in enumerate(requests):
        engine.add_request(str(i), ids, sp, arrival_step=arrival)
    final, snaps = {}, []
    while engine.has_unfinished():
        outs, snap = engine.step()
        snaps.append(snap)
        for o in outs:
            if o.finished:
                final[o.request_id] = o
    return [final[str(i)] for i in range(len(requests))], snaps, engine.summary()


def test_greedy_matches_transformers(llm, hf_tokens):
    outs = llm.generate(CHATS, GREEDY, chat=True)
    assert [o.request_id for o in outs] == ["0", "1", "2", "3"]
    assert token_ids(outs) == hf_tokens
    for o, chat in zip(outs, CHATS):
        c = o.outputs[0]
        assert c.finish_reason in ("stop", "length")
        assert c.text == llm.decode(c.token_ids)
        assert o.prompt == chat and o.finish_reason == c.finish_reason and o.finished
    # the engine's output classes, with the text filled in (one pair for both)
    from pagedkv_core.outputs import CompletionOutput, RequestOutput

    assert type(outs[0]) is RequestOutput and type(outs[0].outputs[0]) is CompletionOutput
    s = llm.last_summary
    assert s["tokens_generated"] == sum(map(len, hf_tokens))
    assert s["peak_running"] == 4 and s["tokens_per_s"] > 0


def test_contiguous_allocator_same_tokens(llm, prompt_ids, hf_tokens):
    outs, snaps, summary = run_engine(llm, [(p, GREEDY, 0) for p in prompt_ids], allocator="contiguous")
    assert token_ids(outs) == hf_tokens
    assert snaps[0].allocator == "contiguous" and snaps[0].block_size == 1


@pytest.mark.parametrize("block_size", [1, 64])
def test_block_sizes_same_tokens(llm, prompt_ids, hf_tokens, block_size):
    outs, snaps, _ = run_engine(llm, [(p, GREEDY, 0) for p in prompt_ids], block_size=block_size)
    assert token_ids(outs) == hf_tokens
    assert snaps[-1].block_size == block_size


PRESSURE = dict(block_size=8, pool_slots=136, watermark=0.0, swap_slots=2048)  # 17 blocks of 8 for five ~70-token sequences


@pytest.fixture(scope="module")
def swap_run(llm, prompt_ids):
    """The pressured run preempting by swap, once for the two tests that read it: (outputs,
    summary, host blocks checked on their way back, those that came back changed). Every block
    swapped out is compared with what comes back to the device pool, between the block copies and
    the forward of the step that swaps it back in."""
    runner = llm.runner
    saved: dict[int, list[torch.Tensor]] = {}
    checked, changed = [], []
    original = runner._block_ops

    def spy(batch):
        bs = batch.block_size
        views = runner.block_views(runner.k_pools, bs) + runner.block_views(runner.v_pools, bs)
        for dev, host in batch.swap_out:
            saved[host] = [v[dev].clone() for v in views]
        original(batch)
        for host, dev in batch.swap_in:
            if not all(torch.equal(v[dev], s) for v, s in zip(views, saved[host])):
                changed.append(host)
            checked.append(host)

    runner._block_ops = spy
    try:
        outs, _, summary = run_engine(llm, [(p, GREEDY, 0) for p in prompt_ids + prompt_ids[:1]], preemption="swap", **PRESSURE)
    finally:
        del runner._block_ops
    return outs, summary, checked, changed


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_same_tokens(llm, prompt_ids, hf_tokens, mode, request):
    # the first prompt comes twice (its second copy also hits the prefix cache); the youngest
    # running sequence keeps getting evicted
    if mode == "swap":
        outs, summary, _, _ = request.getfixturevalue("swap_run")
    else:
        reqs = [(p, GREEDY, 0) for p in prompt_ids + prompt_ids[:1]]
        outs, snaps, summary = run_engine(llm, reqs, preemption=mode, **PRESSURE)
    assert token_ids(outs) == hf_tokens + hf_tokens[:1]
    if mode == "swap":
        assert summary.swaps_out >= 3 and summary.swaps_in >= 3
    else:
        assert summary.recomputes >= 3


def test_swap_round_trip_is_bit_identical(swap_run):
    """Every block swapped out comes back to the device pool bit for bit (checked between the
    block copies and the forward of the step that swaps it back in)."""
    _, summary, checked, changed = swap_run
    assert not changed, f"host blocks {changed} came back changed"
    assert summary.swaps_in >= 1 and len(checked) >= 3


def test_prefix_cache_on_off_same_tokens(llm):
    preamble = (
        "You are a careful assistant for a museum of natural history. Answer in plain words, in one or two "
        "sentences, and never make up facts about the exhibits, the opening hours or the tickets."
    )

    def ids(q):
        enc = llm.tokenizer.apply_chat_template(
            [{"role": "system", "content": preamble}, {"role": "user", "content": q}], add_generation_prompt=True
        )
        return list(enc if isinstance(enc, list) else enc["input_ids"])

    sp = SamplingParams(max_tokens=16)
    reqs = [(ids(q), sp, 2 * i) for i, q in enumerate(CHATS[:3])]
    on, _, s_on = run_engine(llm, reqs, prefix_caching=True)
    off, _, s_off = run_engine(llm, reqs, prefix_caching=False)
    assert token_ids(on) == token_ids(off)
    assert s_on.prefix_cache_hit_rate > 0
    assert s_off.prefix_cache_hit_rate == 0


def test_fork_n3_copy_on_write(llm, prompt_ids):
    sp = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=7, n=3)
    outs, snaps, _ = run_engine(llm, [(prompt_ids[1], sp, 0)])
    kinds = [e.kind for s in snaps for e in s.events]
    assert events.FORK in kinds and kinds.count(events.COW) >= 1
    samples = outs[0].outputs
    assert [c.index for c in samples] == [0, 1, 2]
    assert all(1 <= len(c.token_ids) <= 8 for c in samples)
    # reproducible: the same seed draws the same tokens, also on the contiguous baseline
    again, _, _ = run_engine(llm, [(prompt_ids[1], sp, 0)], allocator="contiguous")
    assert [c.token_ids for c in again[0].outputs] == [c.token_ids for c in samples]


def test_snapshots_carry_token_ids(llm, prompt_ids):
    _, snaps, _ = run_engine(llm, [(prompt_ids[0], SamplingParams(max_tokens=4), 0)])
    snap = snaps[0]  # after the prefill: the prompt's K/V is in the pool, slot by slot
    assert sorted(snap.slot_token[snap.slot_token >= 0].tolist()) == sorted(prompt_ids[0])
    table = snap.block_table(snap.running[0])
    text = llm.decode([t for b in table for t in snap.slot_token[b * 16 : (b + 1) * 16].tolist() if t >= 0],
                      skip_special_tokens=False)
    assert "capital of France" in text


def test_stream_deltas_add_up(llm):
    deltas = list(llm.stream(CHATS[:2], SamplingParams(max_tokens=12), chat=True))
    outs = llm.generate(CHATS[:2], SamplingParams(max_tokens=12), chat=True)
    for o in outs:
        mine = [d for d in deltas if d.request_id == o.request_id]
        assert "".join(d.text for d in mine) == o.outputs[0].text
        assert [t for d in mine for t in d.token_ids] == o.outputs[0].token_ids
        assert mine[-1].finished and sum(d.finished for d in mine) == 1


def test_too_long_prompt_rejected_others_run(llm, prompt_ids):
    from pagedkv_core.llm import LLM

    small = LLM(loaded=llm.loaded, device="cpu", block_size=16, pool_slots=256)
    outs = small.generate([list(range(5, 405)), prompt_ids[0]], SamplingParams(max_tokens=4))
    assert outs[0].reject_reason and outs[0].outputs[0].finish_reason == "rejected"
    assert outs[1].reject_reason is None and len(outs[1].outputs[0].token_ids) >= 1


def test_an_answer_longer_than_the_context_is_refused_at_once(llm, prompt_ids):
    from pagedkv_core.config import ConfigError

    before = llm.engine
    assert llm.runner.max_model_len == 8192
    with pytest.raises(ConfigError, match=r"^max_tokens must be below the model's context of 8,192 tokens "
                                          r"\(max_model_len, prompt \+ answer\), got 1,000,000,000$"):
        llm.generate([prompt_ids[0]], SamplingParams(max_tokens=10**9))
    assert llm.engine is before  # refused before an engine was made or stepped
    # An engine's own (smaller) context is the bound; a prompt and an answer that only overflow
    # it together still run, and end at it.
    short = llm.new_engine(max_model_len=64)
    with pytest.raises(ConfigError, match=r"context of 64 tokens .*got 64$"):
        llm.generate([prompt_ids[0]], SamplingParams(max_tokens=64, ignore_eos=True), engine=short)
    out = llm.generate([prompt_ids[0]], SamplingParams(max_tokens=63, ignore_eos=True), engine=short)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 64


def test_pool_sized_from_memory_budget(llm):
    from pagedkv_core.llm import LLM

    per_block = llm.runner.bytes_per_block(16)
    assert per_block == 2 * 30 * 3 * 64 * 4 * 16
    sized = LLM(loaded=llm.loaded, device="cpu", block_size=16, kv_budget_bytes=10 * per_block + 5)
    assert sized.config.pool_slots == 160 and sized.pool_info["sized_by"] == "kv_budget_bytes"
    shared = LLM(runner=llm.runner, block_size=16, pool_blocks=7)
    assert shared.config.pool_slots == 112 and shared.runner is llm.runner


def test_cli_generate_json(tmp_path, capsys):
    from pagedkv_core.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["What is the capital of France?", {"prompt": "Why is the sky blue?", "max_tokens": 5}]))
    rc = main(["generate", "--prompts-file", str(prompts), "--chat", "--max-tokens", "8", "--device", "cpu",
               "--block-size", "16", "--pool-slots", "512", "--json", "--trace-out", str(tmp_path / "t.jsonl")])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [o["id"] for o in data["outputs"]] == ["0", "1"]
    assert data["outputs"][0]["text"].startswith("The capital of France is Paris")
    assert len(data["outputs"][1]["token_ids"]) == 5 and data["outputs"][1]["finish_reason"] == "length"
    for key in ("tokens_generated", "elapsed_s", "tokens_per_s", "steps", "preemptions", "peak_running",
                "mean_token_utilization", "prefix_cache_hit_rate"):
        assert key in data["summary"]
    from pagedkv_core.record.trace_file import read_trace

    header, snaps = read_trace(tmp_path / "t.jsonl")
    assert len(snaps) == data["summary"]["steps"]


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--prompt", "hi", "--temperature", "-1"],
        ["generate", "--prompt", "hi", "--allocator", "buddy"],
        ["generate", "--prompts-file", "/no/such/file.json"],
        ["generate", "--prompt", "hi", "--model", "/no/such/model"],
        ["generate", "--prompt", "hi", "--kv-budget", "lots"],
        ["generate", "--prompt", "hi", "--pool-slots", "64", "--kv-budget", "1MiB"],
        ["generate", "--prompt", "hi", "--n", "0"],
    ],
)
def test_cli_generate_bad_input(argv, capsys):
    from pagedkv_core.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_stop_token_ids_and_max_tokens(llm, prompt_ids, hf_tokens):
    stop = hf_tokens[1][3]
    outs = llm.generate([prompt_ids[1]], SamplingParams(max_tokens=10, stop_token_ids=(stop,)))
    c = outs[0].outputs[0]
    assert c.token_ids == hf_tokens[1][: hf_tokens[1].index(stop) + 1] and c.finish_reason == "stop"
    outs = llm.generate([prompt_ids[1]], SamplingParams(max_tokens=3))
    assert outs[0].outputs[0].token_ids == hf_tokens[1][:3] and outs[0].outputs[0].finish_reason == "length"
