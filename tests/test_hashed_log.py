"""Request logs with prefix hashes (Mooncake's JSONL: hashed logs), pluggable eviction, and the ideal replay.

- token ids from hash ids: equal ids give equal tokens and equal engine block hashes at every
  block size that divides a hash block; distinct ids give distinct runs in the shipped log;
- the engine's prefix-cache hits equal an independent block-level replay of the hash ids, for
  LRU and for Belady, when the pool holds one request at a time;
- Belady's hits are at least LRU's and at most the unbounded cache's, on every run here;
- bad lines are refused with their line number and field, under the limits of every workload file;
- the CLI end to end, and a block size that does not divide the hash blocks refused in one line.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_core.workloads import hashed_log, scenarios as workloads
from pagedkv_core.kv.block_pool import BlockPool
from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.kv.eviction import BeladyEviction, NEVER
from pagedkv_core.workloads.hashed_log import (
    MOONCAKE_CONV_LOG,
    block_size_problem,
    dividing_block_sizes,
    hashed_log_options,
    hashed_log_workload,
    read_hashed_log,
    stream_hashed_log,
    token_run,
)
from pagedkv_core.kv.prefix_hash import extend_block_hashes
from pagedkv_core.workloads.prefix_replay import ReplayRequest, replay, requests_from_rows
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import load_workload_file, workload_from_bytes

ROOT = Path(__file__).resolve().parents[1]
SCALE = 1 / 16  # a hash block of 32 tokens


@pytest.fixture(scope="module")
def head_rows():
    return read_hashed_log(MOONCAKE_CONV_LOG, count=200)


def line(ts=0, input_length=600, output_length=5, hash_ids=(1, 2), **extra) -> str:
    return json.dumps({"timestamp": ts, "input_length": input_length, "output_length": output_length,
                       "hash_ids": list(hash_ids), **extra})


def run_engine(workload, check_every_step: bool = False, **config):
    engine = Engine(EngineConfig(**config), ScriptedSource())
    workload.submit(engine)
    while engine.has_unfinished():
        engine.step(snapshot=False)
        if check_every_step:
            engine.check_invariants()
    return engine.summary()


def one_at_a_time(workload):
    """The workload with request i arriving at step i: with one output token each, a request
    finishes in the step it arrives, so the pool never holds two at once."""
    reqs = tuple(dataclasses.replace(r, arrival_step=i) for i, r in enumerate(workload.requests))
    return dataclasses.replace(workload, requests=reqs)


# ---------------------------------------------------------------------------- the shipped log
def test_the_log_ships_with_its_license_and_citation():
    folder = MOONCAKE_CONV_LOG.parent
    assert folder.name == "mooncake_fast25" and MOONCAKE_CONV_LOG.stat().st_size < 4 << 20
    assert "Apache License" in (folder / "LICENSE").read_text()
    readme = (folder / "README.md").read_text()
    assert "FAST" in readme and "Qin" in readme and "Apache" in readme
    rows = read_hashed_log(MOONCAKE_CONV_LOG)
    assert len(rows) == 12_031 and rows[0].line == 1 and rows[-1].line == 12_031
    assert "data/mooncake_fast25/*" in (ROOT / "pyproject.toml").read_text()


# ---------------------------------------------------------------------------- tokens from hash ids
@pytest.mark.parametrize("scale", [SCALE, 1 / 4])
def test_equal_ids_give_equal_tokens_and_equal_block_hashes_at_every_dividing_block_size(head_rows, scale):
    rows = head_rows[:60]
    w = hashed_log_workload(rows, "head", hashed_log_options(length_scale=scale, max_tokens="answer"))
    size = w.hash_block
    assert size == round(512 * scale)
    runs = {}
    for r, req in zip(rows, w.requests):
        prompt = req.prompt
        assert len(prompt) == (len(r.hash_ids) - 1) * size + max(1, round((r.prompt_len - 512 * (len(r.hash_ids) - 1)) * scale))
        for j, h in enumerate(r.hash_ids):
            run = runs.setdefault(h, token_run(h, size))
            part = prompt[j * size:(j + 1) * size]
            assert part == run[:len(part)]  # the last, partial block: the first tokens of its run
    shared = sum(1 for h in runs if sum(h in r.hash_ids for r in rows) > 1)
    assert shared > 0  # the slice shares prefixes (the first id of every request, at least)
    for b in dividing_block_sizes(size):
        per = size // b
        at_end: dict[int, int] = {}  # hash id -> the engine hash of the last engine block of its hash block
        at_start: dict[int, int] = {}  # hash id -> the engine hash of its first engine block
        for r, req in zip(rows, w.requests):
            full = len(req.prompt) // size
            hashes = extend_block_hashes([], list(req.prompt), b, full * per)
            for j in range(full):
                h = r.hash_ids[j]
                assert at_end.setdefault(h, hashes[(j + 1) * per - 1]) == hashes[(j + 1) * per - 1]
                assert at_start.setdefault(h, hashes[j * per]) == hashes[j * per]
        assert len(set(at_end.values())) == len(at_end)  # distinct ids: distinct chained hashes
        if b >= 2:  # a run's first two tokens spell its id: distinct ids part in their first engine block
            assert len(set(at_start.values())) == len(at_start)


def test_distinct_ids_give_distinct_runs_in_the_shipped_log():
    ids = sorted({h for r in read_hashed_log(MOONCAKE_CONV_LOG) for h in r.hash_ids})
    assert len(ids) == 182_790
    # A run starts with its id spelled in two tokens, so distinct heads mean distinct runs at every
    # hash block of two tokens or more (length scale 1/256 and up).
    assert len({token_run(h, 2) for h in ids}) == len(ids)
    for h in ids[::997]:
        run = token_run(h, 512)
        assert run[:2] == token_run(h, 2) == token_run(h, 32)[:2] and all(3 <= t < 49_152 for t in run)
    assert token_run(7, 512)[:32] != token_run(8, 512)[:32] and token_run(7, 32) == token_run(7, 32)


def test_a_run_is_the_id_in_two_tokens_then_splitmix64_of_the_ids_mix_plus_the_position():
    from pagedkv_core.sources.scripted import splitmix64
    from pagedkv_core.workloads.hashed_log import token_runs

    def by_hand(h: int, n: int) -> tuple[int, ...]:  # the module docstring's definition, in plain ints
        key = splitmix64(h)
        body = [3 + splitmix64((key + j) % 2**64) % 49_149 for j in range(2, n)]
        return (3 + h % 49_149, 3 + h // 49_149 % 49_149, *body)[:n]

    for h in (0, 1, 49_148, 49_149, 123_456_789, 2**40 + 5):
        for n in (1, 2, 3, 32, 512):
            assert token_run(h, n) == by_hand(h, n)
    runs = token_runs([5, 0, 5], 16)
    assert runs.shape == (3, 16) and runs.dtype.name == "int64" and (runs[0] == runs[2]).all()
    assert tuple(runs[1].tolist()) == by_hand(0, 16)


def test_a_prompt_is_its_runs_cut_to_its_length_and_shares_them_through_the_cache():
    from pagedkv_core.workloads.hashed_log import STREAM_RUN_CACHE, _RecentRuns, prompt_tokens

    runs: dict = {}
    p = prompt_tokens([5, 9, 5, 11, 12], 100, 32, runs)  # 4 blocks cover 100 tokens: id 12 is not needed
    assert p == (token_run(5, 32) + token_run(9, 32) + token_run(5, 32) + token_run(11, 32))[:100]
    assert sorted(runs) == [5, 9, 11]
    again = prompt_tokens([5], 32, 32, runs)
    assert again is runs[5]  # a whole run: the cached tuple itself
    assert prompt_tokens([5, 9], 0, 32) == () == prompt_tokens([], 40, 32)
    assert prompt_tokens([7], 10, 32) == token_run(7, 32)[:10]
    recent = _RecentRuns()
    for i in range(STREAM_RUN_CACHE + 100):
        prompt_tokens([3 * i, 3 * i + 1, 3 * i + 2], 80, 32, recent)
    assert len(recent) == STREAM_RUN_CACHE  # bounded: the oldest runs dropped


def test_a_block_size_that_does_not_divide_the_hash_block_is_refused_with_the_sizes_that_work(head_rows):
    assert block_size_problem(32, 16) is None and block_size_problem(512, 128) is None
    msg = block_size_problem(32, 48)
    assert msg == ("block size 48 does not divide the log's 32-token hash blocks, so its shared prefixes would "
                   "not line up with the engine's blocks; use a block size of 1, 2, 4, 8, 16 or 32")
    w = hashed_log_workload(head_rows[:5], "head", hashed_log_options(length_scale=SCALE))
    engine = Engine(EngineConfig(block_size=48, pool_slots=48 * 100), ScriptedSource())
    with pytest.raises(ConfigError, match="block size 48 does not divide"):
        w.submit(engine)
    assert not engine.requests  # refused before anything was added
    contiguous = EngineConfig(block_size=48, pool_slots=1 << 16, allocator="contiguous")
    assert w.block_size_problem(contiguous) is None  # no blocks to line up: it runs


@pytest.mark.parametrize("scale", [0.1, 1 / 1024, 3 / 1000])
def test_a_length_scale_that_splits_a_hash_block_is_refused(scale):
    with pytest.raises(ConfigError, match="a hashed log needs a whole number"):
        load_workload_file(MOONCAKE_CONV_LOG, length_scale=scale, count=3)


# ---------------------------------------------------------------------------- options
def test_options_match_the_csv_logs(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([line(0, 600, 5, (1, 2)), "", line(1000, 100, 3000, (1,)),
                               line(2500, 1100, 7, (1, 2, 3)), line(5000, 512, 1, (9,))]) + "\n")
    w = load_workload_file(path, seconds_per_step=0.5, max_tokens="context")
    assert [r.id for r in w.requests] == ["r1", "r3", "r4", "r5"]  # request ids name the line
    assert [r.arrival_step for r in w.requests] == [0, 2, 5, 10]
    assert [r.max_tokens for r in w.requests] == [131_072 - 600, 131_072 - 100, 131_072 - 1100, 131_072 - 512]
    assert w.hash_block == 512 and "hash blocks of 512 tokens" in w.description
    run = token_run(1, 512)
    assert [r.prompt[:512] for r in w.requests[:3]] == [run, run[:100], run]  # r3: a partial block
    w = load_workload_file(path, start=1, count=2, rate=2, max_tokens="answer")
    assert [(r.id, r.arrival_step, r.output_len, r.max_tokens) for r in w.requests] == [("r3", 0, 3000, 3000),
                                                                                        ("r4", 60, 7, 7)]
    w = load_workload_file(path, max_tokens=8, length_scale=1 / 4)
    assert [len(r.prompt) for r in w.requests] == [128 + 22, 25, 256 + 19, 128]
    assert [(r.output_len, r.max_tokens) for r in w.requests] == [(1, 2), (2, 2), (2, 2), (1, 2)]  # 8 x 1/4 = 2
    # Context mode: the 3,100-token request (prompt 100) runs, its answer cut at the context.
    w = load_workload_file(path, max_context=2048)
    assert [(r.id, r.max_tokens, r.reject_reason) for r in w.requests] == [
        ("r1", 2048 - 600, None), ("r3", 2048 - 100, None), ("r4", 2048 - 1100, None), ("r5", 2048 - 512, None)]
    assert w.left_out is None and "1 longer than the 2,048-token context (cut at it" in w.description
    streamed = stream_hashed_log(path, max_context=2048)
    assert [(r.id, r.max_tokens) for r in streamed.requests()] == [(r.id, r.max_tokens) for r in w.requests]
    w = load_workload_file(path, max_context=2048, overlong="leave-out")  # or left out, and counted
    assert [r.id for r in w.requests] == ["r1", "r4", "r5"] and "1 left out" in w.description
    assert w.left_out.to_json() == {"rows": 1, "reason": "prompt + answer longer than the 2,048-token context"}
    assert stream_hashed_log(path, max_context=2048, overlong="leave-out").left_out == w.left_out  # streamed, the same
    assert load_workload_file(path).left_out is None
    assert load_workload_file(path).pool_slots == 65_536


def test_an_upload_reads_the_same_as_the_file(tmp_path):
    data = ("\n".join(line(i * 100, 700 + i, 4, (0, 10 + i)) for i in range(6)) + "\n").encode()
    path = tmp_path / "u.jsonl"
    path.write_bytes(data)
    a = load_workload_file(path, count=4, length_scale=1 / 8)
    b = workload_from_bytes(data, "u.jsonl", count=4, length_scale=1 / 8)
    c = workload_from_bytes(gzip.compress(data), "u.jsonl.gz", count=4, length_scale=1 / 8)
    assert a.requests == b.requests == c.requests and a.hash_block == b.hash_block == 64


# ---------------------------------------------------------------------------- bad input
BAD_LINES = [
    ("not json", "x.jsonl line 2 is not valid JSON"),
    ("[1, 2]", "x.jsonl line 2: must be a JSON object with timestamp, input_length, output_length, hash_ids, got list"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "x.jsonl line 2: missing 'hash_ids'"),
    (line(ts="soon"), "x.jsonl line 2: timestamp must be a number of milliseconds >= 0, got 'soon'"),
    (line(ts=-1), "x.jsonl line 2: timestamp must be a number of milliseconds >= 0, got -1"),
    (line(input_length=0), "x.jsonl line 2: input_length must be a whole number >= 1, got 0"),
    (line(input_length=5.5), "x.jsonl line 2: input_length must be a whole number >= 1, got 5.5"),
    (line(output_length=True), "x.jsonl line 2: output_length must be a whole number >= 1, got True"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "abc"}',
     "x.jsonl line 2: hash_ids must be a list of whole numbers, got str"),
    (line(hash_ids=(1, -2)), "x.jsonl line 2: hash_ids must hold whole numbers in [0, 2^63), got -2"),
    (line(hash_ids=(1, 2**63)), "x.jsonl line 2: hash_ids must hold whole numbers in [0, 2^63), got 9223372036854775808"),
    (line(hash_ids=(1, "2")), "x.jsonl line 2: hash_ids must hold whole numbers in [0, 2^63), got '2'"),
    (line(input_length=1025, hash_ids=(1, 2)),
     "x.jsonl line 2: hash_ids has 2 ids, but input_length 1,025 is 3 blocks of 512 tokens (one id each)"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [[[[1]]]]}',
     "x.jsonl line 2: JSON nested more than 3 deep"),
    ('{"timestamp": 1e400, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "x.jsonl line 2 is not valid JSON"),
]


@pytest.mark.parametrize("bad,message", BAD_LINES, ids=[m.split(": ", 1)[-1][:40] for _, m in BAD_LINES])
def test_a_bad_line_names_the_line_and_the_field(tmp_path, bad, message):
    data = (line() + "\n" + bad + "\n" + line() + "\n").encode()
    with pytest.raises(ConfigError) as exc:
        workload_from_bytes(data, "x.jsonl")
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as exc:
        load_workload_file(path)
    assert str(exc.value).startswith(message)


def test_line_numbers_count_blank_lines_and_skipped_requests_are_not_parsed():
    data = (line() + "\n\n" + "garbage\n" + line() + "\n").encode()
    with pytest.raises(ConfigError, match="x.jsonl line 3 is not valid JSON"):
        workload_from_bytes(data, "x.jsonl")
    w = workload_from_bytes(data, "x.jsonl", start=2)  # the garbage is the second request: skipped unread
    assert [r.id for r in w.requests] == ["r4"]


def test_the_limits_of_every_workload_file_hold(monkeypatch):
    data = ("\n".join(line(i, 600, 5, (1, 2)) for i in range(6)) + "\n").encode()
    with pytest.raises(ConfigError, match="not UTF-8"):
        workload_from_bytes(b"\xff\xfe" + data, "x.jsonl")
    with pytest.raises(ConfigError, match="cannot read the request log"):
        workload_from_bytes(b"not gzip", "x.jsonl.gz")
    with pytest.raises(ConfigError, match="no requests after request 6"):
        workload_from_bytes(data, "x.jsonl", start=6)
    monkeypatch.setattr(workloads, "MAX_WORKLOAD_FILE_BYTES", 100)
    with pytest.raises(ConfigError, match="bytes is more than the 100 a workload file may have"):
        workload_from_bytes(data, "x.jsonl")
    monkeypatch.undo()
    monkeypatch.setattr(hashed_log, "MAX_BUILT_LOG_REQUESTS", 4)
    with pytest.raises(ConfigError, match="more than 4 requests after request 0: give a count of at most 4"):
        workload_from_bytes(data, "x.jsonl")
    assert len(workload_from_bytes(data, "x.jsonl", count=4).requests) == 4
    monkeypatch.setattr(workloads, "MAX_WORKLOAD_TOKENS", 1000)
    with pytest.raises(ConfigError, match="the prompts add up to 3,600 tokens, more than the 1,000"):
        workload_from_bytes(data, "x.jsonl", count=6)
    lifted = hashed_log_workload(hashed_log.hashed_log_rows(workloads._open_bytes(data, "x.jsonl"), "x.jsonl"),
                                 "x.jsonl", hashed_log_options(), limits=False)  # a trusted caller (the benchmark)
    assert len(lifted.requests) == 6
    monkeypatch.setattr(hashed_log, "MAX_LOG_ROWS", 3)
    with pytest.raises(ConfigError, match="more than 3 requests; use a shorter request log"):
        workload_from_bytes(data, "x.jsonl", count=4)


def test_a_request_over_a_request_level_bound_is_rejected_while_the_others_run():
    big = 2_000_000
    data = (line() + "\n" + line(5, big, 5, range(-(-big // 512))) + "\n").encode()
    w = workload_from_bytes(data, "x.jsonl", max_tokens="answer")
    assert w.requests[0].reject_reason is None
    assert w.requests[1].reject_reason == "prompt of 2,000,000 tokens is longer than the 1,048,576 allowed"


# ---------------------------------------------------------------------------- eviction in the pool
def test_belady_evicts_the_block_used_furthest_ahead_and_never_used_first():
    pool = BlockPool(4, eviction=BeladyEviction())
    policy = pool.eviction
    # Requests in arrival order (index, hashes of their full blocks): 0 uses 11, 12, 13; 1 uses 12; 2 uses 11.
    policy.plan([(0, [11, 12, 13]), (1, [12]), (2, [11])])
    policy.admitting(0)
    blocks = [pool.allocate() for _ in range(4)]
    for b, h in zip(blocks, (11, 12, 13, 14)):
        pool.register(b, h)
    for b in reversed(blocks):
        pool.release(b)
    pool.check_invariants()
    assert policy.next_use(14) == NEVER == policy.next_use(13)
    assert policy.next_use(12) < policy.next_use(11) < NEVER
    evicted = []
    for _ in range(4):
        before = set(pool.cached)
        pool.allocate()
        evicted.append((before - set(pool.cached)).pop())
        pool.check_invariants()
    assert sorted(evicted[:2]) == [13, 14] and evicted[2:] == [11, 12]  # never used again first


def test_belady_victims_follow_the_next_use_and_the_clock():
    pool = BlockPool(3, eviction=BeladyEviction())
    policy = pool.eviction
    policy.plan([(0, [1, 2, 3]), (1, [3]), (2, [2]), (3, [1])])
    policy.admitting(0)
    blocks = [pool.allocate() for _ in range(3)]
    for b, h in zip(blocks, (1, 2, 3)):
        pool.register(b, h)
    for b in reversed(blocks):
        pool.release(b)
    victim = pool.allocate()  # next uses: 3 at request 1, 2 at request 2, 1 at request 3
    assert victim is blocks[0] and 1 not in pool.cached
    pool.release(victim)
    policy.admitting(2)  # requests 1 and 2 are past: 3 and 2 will never be used again
    assert policy.next_use(3) == NEVER == policy.next_use(2)
    assert pool.allocate() is blocks[0]  # the block that holds nothing goes first
    assert pool.allocate() in (blocks[1], blocks[2])
    pool.check_invariants()


def test_lru_is_the_default_and_evicts_the_least_recently_freed():
    pool = BlockPool(3)
    assert pool.eviction.name == "lru"
    blocks = [pool.allocate() for _ in range(3)]
    for b, h in zip(blocks, (1, 2, 3)):
        pool.register(b, h)
    for b in (blocks[1], blocks[0], blocks[2]):
        pool.release(b)
    assert pool.allocate() is blocks[1] and pool.allocate() is blocks[0]
    pool.check_invariants()


@pytest.mark.parametrize("eviction", ["lru", "belady"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_the_pools_invariants_hold_under_both_policies_under_pressure(head_rows, eviction, preemption):
    w = hashed_log_workload(head_rows[:40], "head", hashed_log_options(length_scale=SCALE, seconds_per_step=0.5,
                                                                          max_tokens="answer"))
    s = run_engine(w, check_every_step=True, block_size=16, pool_slots=2048, eviction=eviction,
                   preemption=preemption, watermark=0.0)
    assert s.finished + len(s.rejected) == 40 and s.finished > 30  # prompts over the pool are rejected
    assert s.eviction == eviction and s.prefix_cache_hit_tokens > 0 and s.preemptions > 0


# ---------------------------------------------------------------------------- the engine against the replay
@pytest.mark.parametrize("eviction", ["lru", "belady"])
@pytest.mark.parametrize("capacity", [100, 400, 2000])
def test_the_engines_hits_equal_an_independent_replay_of_the_hash_ids(head_rows, eviction, capacity):
    """One request at a time into a pool of ``capacity`` blocks, one engine block per hash block:
    the engine's hit and queried tokens are the replay's, exactly."""
    w = one_at_a_time(hashed_log_workload(head_rows, "head", hashed_log_options(length_scale=SCALE, max_tokens=1)))
    s = run_engine(w, block_size=32, pool_slots=capacity * 32, eviction=eviction)
    ideal = replay(requests_from_rows(head_rows, 32), 32, capacity, eviction)
    assert (s.prefix_cache_hit_tokens, s.prefix_cache_queried_tokens) == (ideal.hit_tokens, ideal.queried_tokens)
    assert s.preemptions == 0 and len(s.rejected) == ideal.rejected and s.finished == ideal.requests
    assert s.prefix_cache_hit_rate == pytest.approx(ideal.hit_rate)


def test_belady_is_at_least_lru_and_at_most_unbounded_on_every_run(head_rows):
    rows = head_rows
    w = hashed_log_workload(rows, "head", hashed_log_options(length_scale=SCALE))  # real arrivals: many at once
    reqs = requests_from_rows(rows, 32)
    unbounded = replay(reqs, 32, None, "unbounded")
    for pool in (8192, 32768):
        lru = run_engine(w, block_size=32, pool_slots=pool, eviction="lru")
        belady = run_engine(w, block_size=32, pool_slots=pool, eviction="belady")
        assert lru.prefix_cache_hit_tokens <= belady.prefix_cache_hit_tokens <= unbounded.hit_tokens, pool
    for capacity in (64, 256, 1024, 4096):
        lru, belady = replay(reqs, 32, capacity, "lru"), replay(reqs, 32, capacity, "belady")
        assert lru.hit_tokens <= belady.hit_tokens <= unbounded.hit_tokens, capacity
    assert replay(reqs, 32, 10**6, "lru").hit_tokens == unbounded.hit_tokens  # room for everything


def test_the_replay_follows_the_engines_rules():
    # Two blocks of 4 tokens: the second request may hit only its first block (one token is always computed).
    reqs = [ReplayRequest((1, 2), 8), ReplayRequest((1, 2), 8), ReplayRequest((1, 2, 3), 9),
            ReplayRequest((5, 6, 7), 12)]
    r = replay(reqs, 4, None, "unbounded")
    assert (r.hit_tokens, r.queried_tokens, r.rejected) == (4 + 8, 8 + 8 + 9 + 12, 0)
    small = replay(reqs, 4, 3, "lru")  # 12 tokens and one more need 4 blocks: rejected, and not queried
    assert (small.hit_tokens, small.queried_tokens, small.rejected) == (4 + 8, 8 + 8 + 9, 1)
    with pytest.raises(ValueError, match="policy must be one of"):
        replay(reqs, 4, 2, "fifo")


# ---------------------------------------------------------------------------- the command line
def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagedkv_core", "simulate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_cli_runs_a_jsonl_workload_and_reports_the_hit_rate():
    out = simulate("--workload-file", str(MOONCAKE_CONV_LOG), "--log-count", "120", "--length-scale", "1/16",
                   "--block-size", "32", "--pool-slots", "32768", "--eviction", "belady", "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["requests"] == s["finished"] == 120 and s["eviction"] == "belady"
    assert 0 < s["prefix_cache_hit_tokens"] < s["prefix_cache_queried_tokens"]
    assert s["prefix_cache_hit_rate"] == s["prefix_cache_hit_tokens"] / s["prefix_cache_queried_tokens"]
    rows = read_hashed_log(MOONCAKE_CONV_LOG, count=120)
    assert s["prefix_cache_queried_tokens"] == sum(len(r.prompt) for r in
                                                   hashed_log_workload(rows, "x", hashed_log_options(length_scale=SCALE)).requests)
    table = simulate("--workload-file", str(MOONCAKE_CONV_LOG), "--log-count", "20", "--length-scale", "0.0625",
                     "--block-size", "16")
    assert table.returncode == 0 and "prompt tokens; eviction lru" in table.stdout


@pytest.mark.parametrize("args,message", [
    (("--length-scale", "1/16", "--block-size", "48"),
     "error: block size 48 does not divide the log's 32-token hash blocks, so its shared prefixes would not line "
     "up with the engine's blocks; use a block size of 1, 2, 4, 8, 16 or 32"),
    (("--length-scale", "0.1"), "error: length_scale 0.1 makes a 512-token hash block 51.2 tokens"),
    (("--length-scale", "1/0"), "--length-scale: must be a number or a fraction such as 1/16, got '1/0'"),
    (("--eviction", "fifo"), "error: eviction must be one of lru, belady, got 'fifo'"),
])
def test_cli_refuses_bad_jsonl_options_in_one_line(args, message):
    out = simulate("--workload-file", str(MOONCAKE_CONV_LOG), "--log-count", "5", *args, "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_cli_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(line() + "\n" + line(input_length="many") + "\n")
    out = simulate("--workload-file", str(path))
    assert out.returncode == 2
    assert out.stderr.strip() == "error: bad.jsonl line 2: input_length must be a whole number >= 1, got 'many'"


# ---------------------------------------------------------------------------- the app
def test_the_app_runs_an_uploaded_jsonl_log_with_its_length_scale():
    from tests.apptest import open_page, uploader

    data = b"".join(MOONCAKE_CONV_LOG.read_bytes().splitlines(keepends=True)[:30])
    at = open_page("pages/reserve_or_page.py")
    uploader(at, "workload_upload").set_value(("conv.jsonl", data, "application/octet-stream")).run()
    at.select_slider(key="hash_length_scale").set_value("1/16").run()
    at.number_input(key="pool_slots").set_value(65536).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    _key, workload = at.session_state["_workload_upload"]
    assert workload.hash_block == 32 and len(workload.requests) == 30
    assert workload.requests[1].prompt[:32] == token_run(0, 32)  # the log's first id, shared by its requests


def test_belady_survives_a_reset_of_the_prefix_cache():
    pool = BlockPool(2, eviction=BeladyEviction())
    pool.eviction.plan([(0, [1, 2]), (1, [1]), (2, [3, 4])])
    pool.eviction.admitting(0)
    a, b = pool.allocate(), pool.allocate()
    pool.register(a, 1), pool.register(b, 2)
    pool.release(a), pool.release(b)
    assert pool.reset_prefix_cache()
    pool.check_invariants()
    pool.eviction.admitting(1)  # the forgotten hash 1 is not re-keyed
    c, d = pool.allocate(), pool.allocate()
    pool.register(c, 3), pool.register(d, 4)
    pool.release(d), pool.release(c)
    pool.check_invariants()
    pool.eviction.admitting(2)
    assert {pool.allocate().block_id, pool.allocate().block_id} == {0, 1}
    pool.check_invariants()
