"""The vLLM observer (pagedkv_core.observe): wire decoding, fuzzing, replay of a gap, and our
engine's publisher watched by our observer over loopback, block for block.

Socket tests bind 127.0.0.1 on ephemeral ports, wait on progress (a bounded number of polls),
and close everything in ``finally``."""
from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.observe.cache_state import CacheState
from pagedkv_core.observe.discovery import EventSource, parse_sources
from pagedkv_core.observe.observer import Observer
from pagedkv_core.observe.publisher import EngineKVEvents, KVEventPublisher, binds
from pagedkv_core.observe.server_metrics import MetricsSample, hit_rate, parse_metrics
from pagedkv_core.observe.subscriber import Subscriber, split_frames
from pagedkv_core.observe.wire import (
    U64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_batch,
    encode_batch,
    seq_bytes,
    signed_hash,
)
from pagedkv_core.kv.prefix_hash import NO_HASH, hash_block
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import build_workload

MAX_POLLS = 400  # x 50 ms: a generous bound on waiting for a loopback message

pack = msgspec.msgpack.encode
H1, H2, H3 = 2**64 - 5, 1234567, 2**63 + 9  # unsigned 64-bit, as vLLM sends them


# ---------------------------------------------------------------------------- decoder fixtures
def tagged_array_batch(hash_type):
    h = (lambda v: v.to_bytes(32, "big")) if hash_type is bytes else (lambda v: v)
    return pack([
        1700000000.5,
        [
            ["BlockStored", [h(H1), h(H2)], None, list(range(64)), 32, None, "GPU"],
            ["BlockStored", [h(H3)], h(H2), list(range(100, 132)), 32, None, "GPU", None, None],
            ["BlockRemoved", [h(H1)], "GPU"],
        ],
        0,
    ])


def tagged_map_batch(hash_type):
    h = (lambda v: v.to_bytes(32, "big")) if hash_type is bytes else (lambda v: v)
    return pack([
        1700000000.5,
        [
            {"type": "BlockStored", "block_hashes": [h(H1), h(H2)], "parent_block_hash": None,
             "token_ids": list(range(64)), "block_size": 32, "lora_id": None, "medium": "GPU"},
            {"type": "BlockStored", "block_hashes": [h(H3)], "parent_block_hash": h(H2),
             "token_ids": list(range(100, 132)), "block_size": 32, "medium": "GPU", "lora_name": None},
            {"type": "BlockRemoved", "block_hashes": [h(H1)], "medium": "GPU"},
        ],
        0,
    ])


@pytest.mark.parametrize("encode", [tagged_array_batch, tagged_map_batch], ids=["tag-first arrays", "tagged maps"])
@pytest.mark.parametrize("hash_type", [int, bytes])
def test_decoder_reads_both_encodings_and_both_hash_types(encode, hash_type):
    batch = decode_batch(encode(hash_type))
    assert batch.ts == 1700000000.5 and batch.data_parallel_rank == 0
    assert [type(e) for e in batch.events] == [BlockStored, BlockStored, BlockRemoved]
    stored, child, removed = batch.events
    assert stored.block_hashes == [H1, H2] and stored.parent_block_hash is None
    assert stored.block_tokens(1) == list(range(32, 64)) and stored.block_size == 32 and stored.medium == "GPU"
    assert child.parent_block_hash == H2 and child.block_hashes == [H3]
    assert removed.block_hashes == [H1]
    assert batch.unknown_fields == 0 and batch.unknown_events == {} and batch.bad_events == 0

    state = CacheState()
    for event in batch.events:
        state.apply(event, batch.ts)
    assert state.hashes() == {H2, H3}
    assert state.cached()[H3].parent == H2 and state.cached()[H3].token_ids == tuple(range(100, 132))
    assert state.chain_tokens(H3) == list(range(32, 64)) + list(range(100, 132))
    assert [b.block_hash for b in state.removed] == [H1] and state.removed[0].removed_at == batch.ts
    assert state.counts.blocks_stored == 3 and state.counts.blocks_removed == 1


def test_decoder_counts_unknown_fields_and_types_and_skips_bad_events():
    payload = pack([
        1.0,
        [
            ["BlockStored", [1], None, [5, 6], 2, None, "GPU", None, None, 0, "future", "more"],
            {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "new_field": 3},
            ["SomethingNew", 1, 2],
            {"type": "AlsoNew"},
            ["BlockStored", [1, 2], None, [5, 6, 7], 2],  # 3 tokens for 2 blocks of 2
            ["BlockRemoved", "not a list"],
            42,
            ["AllBlocksCleared"],
        ],
    ])
    batch = decode_batch(payload)
    assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
    assert batch.unknown_fields == 3
    assert batch.unknown_events == {"SomethingNew": 1, "AlsoNew": 1, "(not an event)": 1}
    assert batch.bad_events == 2
    assert batch.data_parallel_rank is None


def test_decoder_reads_signed_hashes_as_unsigned_and_refuses_non_batches():
    batch = decode_batch(pack([0, [["BlockRemoved", [-1, -(2**63)]]], 3]))
    assert batch.events[0].block_hashes == [U64, 2**63] and batch.data_parallel_rank == 3
    for bad in (b"", b"\xc1", pack({"a": 1}), pack([1]), pack(["x", []]), pack([1.0, "events"]), pack(None)):
        with pytest.raises(WireError):
            decode_batch(bad)


def test_encoder_round_trips_in_both_encodings():
    events = [BlockStored([H1, H2], None, list(range(8)), 4, None, "GPU"), BlockRemoved([H1], "GPU"), AllBlocksCleared()]
    for encoding in ("array", "map"):
        batch = decode_batch(encode_batch(5.0, events, 1, encoding))
        assert batch.events == events and batch.data_parallel_rank == 1 and batch.unknown_fields == 0
    raw = msgspec.msgpack.decode(encode_batch(5.0, events[:1]))
    assert raw[1][0][0] == "BlockStored" and raw[1][0][1] == [H1, H2]  # vLLM's tag-first array


def test_split_frames_with_and_without_topic():
    assert split_frames([b"kv", seq_bytes(7), b"p"]) == (7, b"p")
    assert split_frames([seq_bytes(7), b"p"]) == (7, b"p")
    assert split_frames([b"", seq_bytes(-1), b""]) == (-1, b"")
    assert split_frames([b"", b"kv", seq_bytes(2), b"p"]) == (2, b"p")
    for bad in ([], [b"x"], [b"a", b"b", b"c", b"d"], [b"kv", b"123", b"p"]):
        with pytest.raises(WireError):
            split_frames(bad)


def test_metrics_parse_sum_engines_and_hit_rate():
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.75\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 700\nvllm:prefix_cache_queries_total{engine="1"} 19\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 480\n'
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
        "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 1\n"
        '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="32",num_gpu_blocks="3640"} 1\n'
    )
    m = parse_metrics(text, t=10.0)
    assert m.values == {"kv_cache_usage_perc": 0.5, "prefix_cache_queries": 719, "prefix_cache_hits": 480,
                        "num_requests_running": 2, "num_preemptions": 1}
    assert m.num_gpu_blocks == 3640
    earlier = MetricsSample(0.0, {"prefix_cache_queries": 19, "prefix_cache_hits": 0})
    assert hit_rate(earlier, m) == 480 / 700
    assert hit_rate(m, m) is None


def test_discovery_makes_wildcard_endpoints_reachable():
    data = [{"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
             "replay_endpoint": "tcp://*:5558", "topic": "kv"},
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://0.0.0.0:5559",
             "replay_endpoint": None, "topic": ""}]
    assert parse_sources(data, "10.0.0.7") == [EventSource("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv", 0),
                                               EventSource("tcp://10.0.0.7:5559", None, "", 1)]
    assert parse_sources({"0": {"endpoint": "tcp://h:1", "data_parallel_rank": 4}}, "x") == [EventSource("tcp://h:1", None, "", 4)]
    assert parse_sources({"enable_kv_cache_events": False, "endpoint": "tcp://*:1"}, "x") == []
    assert binds("tcp://*:5557") and not binds("tcp://127.0.0.1:5557")


# ---------------------------------------------------------------------------- fuzz
_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=12), st.binary(max_size=40),
                    st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type"]))
_values = st.recursive(_leaves, lambda inner: st.one_of(st.lists(inner, max_size=8),
                                                        st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(
                                                            ["type", "block_hashes", "token_ids", "block_size",
                                                             "parent_block_hash", "medium"])), inner, max_size=6)),
                       max_leaves=40)


def _mutations():
    good = [tagged_array_batch(int), tagged_map_batch(bytes)]
    return st.tuples(st.sampled_from(good), st.integers(0, 400), st.binary(min_size=1, max_size=8)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + len(t[2]):])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _values.map(pack), st.lists(_values, max_size=4).map(lambda v: pack([1.0, v, 0])),
                 _mutations()))
def test_fuzz_payloads_never_raise_out_of_the_observer(payload):
    observer = Observer(None)
    observer.handle(payload)
    observer.handle(payload)
    s = observer.summary()
    assert s["batches"] + s["malformed"] == 2
    assert s["cached_blocks"] >= 0


@pytest.fixture(scope="module")
def frame_subscriber():
    sub = Subscriber([EventSource("tcp://127.0.0.1:9", None)], catch_up=False)  # connects lazily: nothing listens
    try:
        yield sub
    finally:
        sub.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=12), max_size=5))
def test_fuzz_frames_never_raise_out_of_the_subscriber(frame_subscriber, frames):
    observer = Observer(None)
    for got in frame_subscriber.take(0, frames):
        observer.handle(got.payload)


# ---------------------------------------------------------------------------- loopback
class LossyPublisher(KVEventPublisher):
    """Buffers every batch for replay but does not send the ones in ``drop``: a forced gap."""

    drop: set[int] = set()

    def _send(self, seq, payload):
        if seq not in self.drop:
            super()._send(seq, payload)


def _wait(observer: Observer, publisher: KVEventPublisher, stream: int = 0) -> None:
    for _ in range(MAX_POLLS):
        if observer.subscriber.next_seq(stream) == publisher.next_seq:
            return
        observer.poll(0.05)
    raise AssertionError(f"observer stuck at seq {observer.subscriber.next_seq(stream)}, publisher at {publisher.next_seq}")


def _connect(publisher: KVEventPublisher, **kw) -> Observer:
    """An observer subscribed to ``publisher``, once a first batch has gone through (the slow
    joiner: a SUB socket sees nothing sent before its subscription reached the PUB)."""
    observer = Observer(Subscriber([EventSource(publisher.endpoint, publisher.replay_endpoint)], replay_timeout=5.0, **kw))
    for _ in range(MAX_POLLS):
        publisher.publish([])
        if observer.poll(0.05):
            return observer
    observer.close()
    raise AssertionError("no batch reached the subscriber")


def test_forced_gap_is_replayed():
    pub = LossyPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    observer = None
    try:
        observer = _connect(pub, catch_up=False)
        first = pub.next_seq
        pub.drop = {first + 1, first + 2}
        for i in range(4):  # stored at seq first..first+3; the middle two never go out live
            pub.publish([BlockStored([100 + i], 99 + i if i else None, [i, i], 2, None, "GPU")])
        _wait(observer, pub)
        sub = observer.subscriber.stats
        assert sub.gaps == 1 and sub.replayed == 2 and sub.missed == 0
        assert observer.state().hashes() == {100, 101, 102, 103}
        assert observer.state().chain_tokens(103) == [0, 0, 1, 1, 2, 2, 3, 3]
        assert observer.counts.events["BlockStored"] == 4
    finally:
        if observer is not None:
            observer.close()
        pub.close()


def test_late_subscriber_catches_up_from_the_replay_buffer():
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    observer = None
    try:
        for i in range(3):  # before anyone listens
            pub.publish([BlockStored([10 + i], 9 + i if i else None, [i], 1, None, "GPU")])
        observer = _connect(pub)
        _wait(observer, pub)
        assert observer.state().hashes() == {10, 11, 12}
        assert observer.subscriber.stats.gaps == 0 and observer.subscriber.stats.replayed >= 3
    finally:
        if observer is not None:
            observer.close()
        pub.close()


def test_engine_publisher_to_observer_block_for_block():
    """shared_preamble through a pool small enough to evict: after every step the observer's
    cached hashes are the engine's prefix-cache index, and its counts are the engine's."""
    workload = build_workload("shared_preamble", 0)
    config = EngineConfig(pool_slots=1536, block_size=16)
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    observer = None
    try:
        observer = _connect(pub)
        sink = EngineKVEvents(pub, config.block_size)
        engine = Engine(config, ScriptedSource(), kv_event_sink=sink)
        workload.submit(engine)
        pool = engine.allocator.pool
        steps = 0
        while engine.has_unfinished():
            engine.step(snapshot=False)
            steps += 1
            _wait(observer, pub)
            assert observer.state().hashes("GPU") == {h & U64 for h in pool.cached}, f"step {steps}"
        assert observer.counts.events == sink.counts
        summary = observer.summary()
        assert summary["blocks_stored"] == sink.blocks_stored and summary["blocks_removed"] == sink.blocks_removed
        assert summary["cached_blocks"] == len(pool.cached) and summary["block_size"] == 16
        assert summary["blocks_stored"] - summary["blocks_removed"] == len(pool.cached)
        assert sink.blocks_removed > 0, "the pool should have evicted cached blocks"
        assert summary["gaps"] == 0 and summary["malformed"] == 0 and summary["unknown_fields"] == 0
        # each cached block's tokens are the ones in the engine's slots, and (parent, tokens) hash to it
        state = observer.state()
        bs = config.block_size
        for h, block in pool.cached.items():
            seen = state.cached()[h & U64]
            assert list(seen.token_ids) == engine.view.slot_token[block.block_id * bs:(block.block_id + 1) * bs].tolist()
            parent = NO_HASH if seen.parent is None else signed_hash(seen.parent)
            assert hash_block(parent, seen.token_ids) == h
        assert any(b.parent is None for b in state.cached().values()), "the shared preamble's first block is cached"
        # reset: AllBlocksCleared empties the observer's view
        assert engine.reset_prefix_cache()
        _wait(observer, pub)
        assert observer.state().hashes() == set() and observer.counts.events["AllBlocksCleared"] == 1
        engine.check_invariants()
    finally:
        if observer is not None:
            observer.close()
        pub.close()


def test_an_observation_records_only_what_its_ticks_changed():
    """The recorder stores each tick as a delta of the ranges the view's folds touched (no full
    snapshot diffed), and every recorded step equals the display pool at that tick."""
    import random

    from pagedkv_core.observe.observation import ObservationRecorder
    from pagedkv_core.observe.observer import ObservedBatch
    from pagedkv_core.observe.wire import AllBlocksCleared, BlockRemoved, BlockStored
    from pagedkv_core.record.recording import Recording
    from pagedkv_core.record.snapshot import BLOCK_ARRAYS, SLOT_ARRAYS

    rng = random.Random(7)
    rec = Recording()
    recorder = ObservationRecorder(rec, num_blocks=64, block_size=4)
    live: list[int] = []
    seen = []
    for tick in range(60):
        events = []
        for _ in range(rng.randrange(4)):
            if live and rng.random() < 0.4:
                gone = rng.sample(live, rng.randrange(1, min(3, len(live)) + 1))
                live = [h for h in live if h not in gone]
                events.append(BlockRemoved(gone))
            else:
                hashes = [rng.getrandbits(63) for _ in range(rng.randrange(1, 4))]
                live += hashes
                events.append(BlockStored(hashes, None, [rng.randrange(100) for _ in range(4 * len(hashes))], 4))
        if tick == 40:
            events.append(AllBlocksCleared())
            live = []
        recorder.on_batch(ObservedBatch(t=float(tick), received=float(tick), rank=0, seq=tick, events=events, replayed=False))
        step = recorder.tick(float(tick))
        seen.append((step, {k: v.copy() for k, v in recorder._cache.view.arrays.items()}))
    for step, arrays in seen:
        snap = rec.at(step)
        for name in (*SLOT_ARRAYS, *BLOCK_ARRAYS):
            assert (getattr(snap, name) == arrays[name]).all(), (step, name)
