"""The model runner on its own: ScheduledBatch objects built by hand (no scheduler), the real
SmolLM2 on the CPU, compared with transformers."""
from __future__ import annotations

import os
import random

import pytest
import torch

from pagedkv_core.batch import ScheduledBatch, SeqWork
from pagedkv_core.sources.model.sampler import sample, uniform, Draw
from pagedkv_core.sampling import SamplingParams

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to code.",
    "Why is the sky blue?",
]
GREEDY = SamplingParams(max_tokens=16)


@pytest.fixture(scope="module")
def loaded():
    from pagedkv_core.sources.model.loader import load_model

    before = torch.get_num_threads()  # one thread: see tests/test_llm.py
    torch.set_num_threads(int(os.environ.get("PAGEDKV_TEST_THREADS", "1")))
    yield load_model(None, progress=lambda f, m: None)
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runner(loaded):
    from pagedkv_core.sources.model.runner import ModelRunner

    return ModelRunner(loaded, device="cpu")


def chat_ids(tokenizer, text: str) -> list[int]:
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    return [int(t) for t in ids]


@pytest.fixture(scope="module")
def prompts(loaded):
    return [chat_ids(loaded.tokenizer, c) for c in CHATS[:3]]


@pytest.fixture(scope="module")
def hf_reference(loaded, prompts):
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = loaded.model.generate(torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens, do_sample=False)
            out.append(gen[0, len(ids):].tolist())
    return out


class Driver:
    """A throwaway scheduler: fixed requests, blocks handed out at random from a free list."""

    def __init__(self, runner, block_size: int, num_blocks: int, seed: int = 0):
        self.runner = runner
        self.bs = block_size
        runner.bind(num_blocks * block_size, num_blocks * block_size)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.step = 0

    def table_for(self, table: list[int], n_tokens: int) -> list[int]:
        while len(table) * self.bs < n_tokens:
            table.append(self.free.pop())
        return table

    def slots(self, table, start, n):
        return [table[p // self.bs] * self.bs + p % self.bs for p in range(start, start + n)]

    def generate(self, prompts, sampling=GREEDY, start_steps=None, chunk=None):
        """Greedy-decode every prompt; prompt i joins at step start_steps[i] (mixed steps);
        prompts are prefilled in chunks of ``chunk`` tokens when given."""
        n = len(prompts)
        start_steps = start_steps or [0] * n
        state = [dict(table=[], done=0, out=[], finished=False) for _ in prompts]
        eos = self.runner.eos_token_id
        while not all(s["finished"] for s in state):
            work = []
            for i, (ids, st) in enumerate(zip(prompts, state)):
                if st["finished"] or self.step < start_steps[i]:
                    continue
                full = ids + st["out"]
                if st["done"] < len(ids):
                    take = len(ids) - st["done"] if chunk is None else min(chunk, len(ids) - st["done"])
                    toks = ids[st["done"] : st["done"] + take]
                else:
                    toks = [full[-1]]
                start = st["done"]
                table = self.table_for(st["table"], start + len(toks))
                samples = 1 if start + len(toks) >= len(ids) else 0
                work.append(SeqWork(i, f"r{i}", 0, toks, start, self.slots(table, start, len(toks)), list(table),
                                    samples, sampling, len(st["out"])))
            res = self.runner.execute(ScheduledBatch(self.step, self.bs, work))
            for w in work:
                st = state[w.seq_id]
                st["done"] += len(w.token_ids)
                if w.num_samples:
                    t = res[w.seq_id][0]
                    st["out"].append(t)
                    if t == eos or len(st["out"]) >= sampling.max_tokens:
                        st["finished"] = True
            self.step += 1
        return [st["out"] for st in state]


@pytest.mark.slow
def test_logits_match_transformers(loaded, runner, prompts):
    ids = prompts[0]
    d = Driver(runner, 16, 16)
    table = d.table_for([], len(ids))
    work = SeqWork(0, "r0", 0, ids, 0, d.slots(table, 0, len(ids)), table, 1, GREEDY, 0)
    ours = runner.logits(ScheduledBatch(0, 16, [work]))[0]
    with torch.no_grad():
        theirs = loaded.model(torch.tensor([ids])).logits[0, -1].float()
    assert torch.allclose(ours, theirs, atol=2e-3, rtol=1e-4), (ours - theirs).abs().max()
    assert int(ours.argmax()) == int(theirs.argmax())


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 12, 16, 64])
def test_greedy_matches_transformers_mixed_steps(runner, prompts, hf_reference, block_size):
    num_blocks = -(-(max(map(len, prompts)) + GREEDY.max_tokens) // block_size) * len(prompts) + 2
    d = Driver(runner, block_size, num_blocks, seed=block_size)
    # the first two prefill together (one padded attention call); the third joins while they
    # decode: a mixed prefill/decode step
    got = d.generate(prompts, start_steps=[0, 0, 3])
    assert got == hf_reference


@pytest.mark.slow
def test_chunked_prefill_matches(runner, prompts, hf_reference):
    d = Driver(runner, 16, 40, seed=3)
    got = d.generate(prompts[:2], chunk=10, start_steps=[0, 1])
    assert got == hf_reference[:2]


@pytest.mark.slow
def test_cached_prefix_gives_same_next_token(runner, prompts):
    bs = 16
    ids = prompts[1]
    d = Driver(runner, bs, 16, seed=5)
    table = d.table_for([], len(ids))
    full = SeqWork(0, "a", 0, ids, 0, d.slots(table, 0, len(ids)), list(table), 1, GREEDY, 0)
    ref = runner.logits(ScheduledBatch(0, bs, [full]))[0]
    # a second request shares the first two full blocks (a prefix-cache hit) and computes only the rest
    hit = 2 * bs
    table2 = list(table[:2])
    table2 = d.table_for(table2, len(ids))
    rest = SeqWork(1, "b", 0, ids[hit:], hit, d.slots(table2, hit, len(ids) - hit), table2, 1, GREEDY, 0)
    got = runner.logits(ScheduledBatch(1, bs, [rest]))[1]
    assert int(got.argmax()) == int(ref.argmax())
    assert torch.allclose(got, ref, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_swap_out_and_in_is_bit_identical(runner, prompts):
    bs = 16
    ids = prompts[0]
    d = Driver(runner, bs, 12, seed=7)
    table = d.table_for([], len(ids))
    runner.execute(ScheduledBatch(0, bs, [SeqWork(0, "a", 0, ids, 0, d.slots(table, 0, len(ids)), table, 1, GREEDY, 0)]))
    before_k = [runner.k_pools[l].view(-1, bs, *runner.k_pools[l].shape[1:])[table].clone() for l in range(3)]
    before_v = [runner.v_pools[l].view(-1, bs, *runner.v_pools[l].shape[1:])[table].clone() for l in range(3)]
    host = list(range(len(table)))[::-1]
    runner.execute(ScheduledBatch(1, bs, swap_out=list(zip(table, host))))
    for p in runner.k_pools + runner.v_pools:  # the device blocks get reused by someone else
        p.view(-1, bs, *p.shape[1:])[table] = -1.0
    new_table = [d.free.pop() for _ in table]
    runner.execute(ScheduledBatch(2, bs, swap_in=list(zip(host, new_table))))
    for l in range(3):
        assert torch.equal(runner.k_pools[l].view(-1, bs, *runner.k_pools[l].shape[1:])[new_table], before_k[l])
        assert torch.equal(runner.v_pools[l].view(-1, bs, *runner.v_pools[l].shape[1:])[new_table], before_v[l])


@pytest.mark.slow
def test_fork_samples_and_copy_on_write(runner, prompts):
    bs = 16
    ids = prompts[2]
    d = Driver(runner, bs, 20, seed=9)
    sp = SamplingParams(max_tokens=4, temperature=1.0, top_p=0.95, seed=123, n=3)
    table = d.table_for([], len(ids))
    w = SeqWork(0, "f", 0, ids, 0, d.slots(table, 0, len(ids)), list(table), 3, sp, 0)
    first = runner.execute(ScheduledBatch(0, bs, [w]))[0]
    assert len(first) == 3
    again = runner.execute(ScheduledBatch(1, bs, [w]))[0]  # recompute draws the same tokens
    assert again == first
    # the three children share the prompt's blocks; the partially filled tail is copied on write
    pos = len(ids)
    filled = pos % bs
    assert filled, "pick a prompt whose last block is partly filled"
    children = [list(table)] + [table[:-1] + [d.free.pop()] for _ in range(2)]
    copies = [(table[-1], c[-1]) for c in children[1:]]
    works = [SeqWork(10 + i, "f", i, [first[i]], pos, d.slots(children[i], pos, 1), children[i], 1, sp, 1)
             for i in range(3)]
    out = runner.execute(ScheduledBatch(2, bs, seqs=works, copies=copies))
    assert set(out) == {10, 11, 12}
    k0 = runner.k_pools[0].view(-1, bs, *runner.k_pools[0].shape[1:])
    for src, dst in copies:
        assert torch.equal(k0[dst, :filled], k0[src, :filled])


def test_sampler_draws_depend_only_on_seed_index_position():
    assert uniform(1, 0, 5) == uniform(1, 0, 5)
    assert uniform(1, 0, 5) != uniform(1, 1, 5) != uniform(2, 0, 5)
    logits = torch.randn(2, 50)
    sp = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=4)
    a = sample(logits, [Draw(0, sp, 4, 0, 3), Draw(1, sp, 4, 0, 3)])
    b = sample(logits[[1, 0]], [Draw(1, sp, 4, 0, 3), Draw(0, sp, 4, 0, 3)])
    assert a == b
    top10 = set(logits[0].topk(10).indices.tolist())
    for p in range(200):
        assert sample(logits, [Draw(0, sp, 4, 0, p)])[0] in top10
    greedy = sample(logits, [Draw(0, SamplingParams(), 0, 0, 0)])
    assert greedy == [int(logits[0].argmax())]
    # top_p small enough keeps only the most likely token
    assert sample(logits, [Draw(0, SamplingParams(temperature=1.0, top_p=1e-6), 9, 0, 1)]) == greedy


def test_greedy_tokens_equal_argmax_ties_and_nan_included():
    from pagedkv_core.sources.model.sampler import greedy_tokens

    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        x = torch.randn((1 + trial % 7, 49152), generator=g)
        if trial % 3 == 0:
            x = x.round()  # many exact ties: the first maximal index must win
        if trial % 5 == 0:
            x[0] = 0.0
        assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    x = torch.randn((4, 49152), generator=g)
    x[1, 100], x[2, 7], x[3, 5] = float("nan"), float("inf"), float("-inf")
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    odd = torch.randn((3, 1000), generator=g)  # not a multiple of the slice width: plain argmax
    assert torch.equal(greedy_tokens(odd), odd.argmax(dim=-1))


def _paged_case(lens, block_size=8, num_heads=9, num_kv_heads=3, head_dim=16, seed=0):
    """A shuffled pool with NaN in every slot no context covers."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 2
    k = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v = k.clone()
    table = torch.zeros((len(lens), max(need) + 1), dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=g).tolist()
    for i, n in enumerate(lens):
        for j in range(need[i]):
            b = free.pop()
            table[i, j] = b
            filled = min(block_size, n - j * block_size)
            k[b, :filled] = torch.randn((filled, num_kv_heads, head_dim), generator=g)
            v[b, :filled] = torch.randn((filled, num_kv_heads, head_dim), generator=g)
    return k, v, table, torch.tensor(lens, dtype=torch.int32)


def test_decode_attention_plan_serves_every_layer_like_the_per_call_kernel():
    """The forward builds the step's decode attention once and runs it per layer: each layer's
    result must equal the one-shot kernel on that layer's pools, padding and empty contexts
    included, and a layer with another shape is refused."""
    import kernels
    from kernels import reference

    lens = [0, 1, 13, 40, 9]
    k0, v0, table, ctx = _paged_case(lens)
    g = torch.Generator().manual_seed(1)
    # every layer: its own K/V in the same blocks (one block table per step), NaN elsewhere
    layers = [(torch.where(k0.isnan(), k0, torch.randn(k0.shape, generator=g)),
               torch.where(v0.isnan(), v0, torch.randn(v0.shape, generator=g))) for _ in range(3)]
    attend = kernels.decode_attention(table, ctx)
    for k, v in layers:
        q = torch.randn((len(lens), 9, 16), generator=g)
        out = attend(q, k, v, 0.25)
        assert not torch.isnan(out).any()
        assert torch.count_nonzero(out[0]) == 0  # context 0
        for i, n in enumerate(lens[1:], start=1):
            kk, vv = reference.gather_kv(k, v, table[i], n)
            s = torch.einsum("hd,thd->ht", q[i], kk.repeat_interleave(3, dim=1)) * 0.25
            want = torch.einsum("ht,thd->hd", s.softmax(-1), vv.repeat_interleave(3, dim=1))
            torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, reference.paged_attention_decode(q, k, v, table, ctx, 0.25))
    with pytest.raises(ValueError, match="shape, dtype and device of the first call"):
        attend(torch.zeros((len(lens), 9, 16)), layers[0][0][:-1], layers[0][1][:-1], 0.25)


def test_cache_writer_plan_skips_minus_one_in_every_layer():
    import kernels

    slots = torch.tensor([5, -1, 0, 17])
    write = kernels.cache_writer(slots)
    for layer in range(3):
        kc, vc = torch.zeros((4, 8, 2, 4)), torch.zeros((4, 8, 2, 4))
        key = torch.full((4, 2, 4), float(layer + 1))
        key[1] = 99.0  # the skipped token
        write(key, -key, kc, vc)
        flat = kc.view(-1, 2, 4)
        assert [int(i) for i in flat[:, 0, 0].nonzero().squeeze(1)] == [0, 5, 17]
        assert float(flat.max()) == layer + 1 and torch.equal(vc, -kc)
    with pytest.raises(ValueError, match="shape, dtype and device of the first call"):
        write(key[:2], key[:2], kc, vc)


def test_threads_must_fit_the_machine():
    from pagedkv_core.sources.model.runner import ModelRunner

    before = torch.get_num_threads()
    cores = os.cpu_count() or 1
    for bad in (0, -1, cores + 1, 1_000_000, True, 1.5, "2"):
        with pytest.raises(ValueError, match=rf"threads must be an integer in \[1, {cores}\]") as exc:
            ModelRunner(None, device="cpu", threads=bad)  # refused before the model is touched
        assert "\n" not in str(exc.value)
    assert torch.get_num_threads() == before


def test_session_threads_split_the_cores_without_oversubscribing():
    from pagedkv_core.sources.model.runner import available_cores, session_threads

    assert session_threads(1, cores=16) == 16
    assert session_threads(3, cores=16) == 5
    assert session_threads(32, cores=16) == 1
    assert 1 <= session_threads(2) <= available_cores() <= (os.cpu_count() or 1)
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match="expected_sessions must be a positive integer"):
            session_threads(bad)


def test_omp_num_threads_caps_the_apps_split_of_the_cores(monkeypatch):
    """OMP_NUM_THREADS=1 means one thread: the app's split never raises a forward above it (under
    make test the split gave a lone engine both cores while the other worker ran, and its two
    OpenMP threads spun at their barriers: these pages took 52.6 s against 41.7 with the cap)."""
    from pagedkv_core.sources.model.runner import available_cores, session_threads, thread_cap
    from ui.models import CoreShare

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = available_cores()
    assert thread_cap() is None and cores == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert thread_cap() == 1 and available_cores() == 1
    assert session_threads(1) == 1 and CoreShare().threads_for(object()) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 7))  # a cap above the cores leaves the cores
    assert available_cores() == cores
    for ignored in ("", "0", "-1", "two", "1.5"):
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert thread_cap() is None and available_cores() == cores
