"""The "Your vLLM server" page: a recorded observation replayed with the player, a live connection
to a stand-in server, and the workshop rule (only the servers the operator lists)."""
from __future__ import annotations

import pytest

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.observe.discovery import EventSource
from pagedkv_core.observe.observation import ObservationRecorder, load_observation
from pagedkv_core.observe.observer import Observer
from pagedkv_core.observe.publisher import EngineKVEvents, KVEventPublisher
from pagedkv_core.observe.server_metrics import MetricsSample
from pagedkv_core.observe.subscriber import Subscriber
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.trace_file import TraceWriter
from pagedkv_core.workloads.scenarios import build_workload
from tests.apptest import figure, open_page, plotly_array, uploader
from tests.test_observe import MAX_POLLS, _connect, _wait
from tests.test_observe_cli import fake_vllm
from ui import vllm_view

PAGE = "pages/vllm_server.py"


def record_observation(path, pool_slots: int = 1536) -> dict:
    """shared_preamble published by our engine, observed over loopback, one tick a step, into ``path``.
    Returns the engine's prefix-cache index at the end (unsigned hashes)."""
    config = EngineConfig(pool_slots=pool_slots, block_size=16)
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    observer = None
    try:
        observer = _connect(pub)
        recorder = ObservationRecorder(TraceWriter(path), header={"server": "loopback test"})
        observer.on_batch.append(recorder.on_batch)
        clock = [1000.0]  # four steps a second of "wall time", for the batches and the ticks alike
        sink = EngineKVEvents(pub, config.block_size, clock=lambda: clock[0])
        engine = Engine(config, ScriptedSource(), kv_event_sink=sink)
        build_workload("shared_preamble", 0).submit(engine)
        while engine.has_unfinished():
            clock[0] += 0.25
            _, snap = engine.step()
            _wait(observer, pub)
            recorder.on_metrics(engine_metrics(snap.metrics, clock[0]))
            recorder.tick(clock[0])
        recorder.close()
        return {h & (2**64 - 1) for h in engine.allocator.pool.cached}
    finally:
        if observer is not None:
            observer.close()
        pub.close()


def engine_metrics(m, t: float) -> MetricsSample:
    """Our engine's step signals under vLLM's names, as its /metrics would read."""
    return MetricsSample(t, {"kv_cache_usage_perc": m.kv_usage, "num_requests_running": m.num_running,
                             "num_requests_waiting": m.num_waiting, "num_preemptions": m.num_preemptions,
                             "prefix_cache_hits": m.prefix_hit_tokens, "prefix_cache_queries": m.prefix_queried_tokens})


@pytest.fixture(scope="module")
def observation_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("obs") / "observation.jsonl"
    cached = record_observation(path)
    return path, cached


def test_recorded_observation_folds_back_to_the_engines_cache(observation_file):
    path, cached = observation_file
    obs = load_observation(path)
    assert obs.state_at(obs.recording.last_step).hashes() == cached
    # scrubbing back and forth gives the same states as folding from the start
    mid = obs.num_steps // 2
    forward = obs.state_at(mid).hashes()
    obs.state_at(obs.recording.last_step)
    assert obs.state_at(mid).hashes() == forward
    snap = obs.recording.at(obs.recording.last_step)
    assert int((snap.block_state == 3).sum()) == len(cached)


def test_page_replays_a_recorded_observation(observation_file):
    path, cached = observation_file
    at = open_page(PAGE)
    at.segmented_control(key="vllm_mode").set_value("Recorded observation").run()
    assert any("Open a recording" in i.value for i in at.info)
    uploader(at, "vllm_upload").set_value(("observation.jsonl", path.read_bytes(), "application/jsonl")).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    last = load_observation(path).num_steps - 1
    at.slider(key="vllm_step").set_value(last).run()
    forest = figure(at, "vllm_forest")["data"][0]
    assert forest["type"] == "icicle"
    assert sum(plotly_array(forest["values"]).tolist()) == len(cached)  # every cached block, in stretches
    assert {int(i, 16) for i in forest["ids"]} <= cached
    assert sum(1 for p in forest["parents"] if p == "") == len(load_observation(path).state_at(last).roots())
    assert any(f"{len(cached):,} cached blocks" in c.value for c in at.caption)
    for name in ("kv_cache_usage_perc", "num_requests_running", "num_preemptions", "prefix_cache_hits"):
        figure(at, f"vllm_sig_{name}")
    usage = figure(at, "vllm_sig_kv_cache_usage_perc")["data"][0]
    assert max(plotly_array(usage["y"])) > 0.5  # the engine's pool filled up
    rates = figure(at, "vllm_rates")["data"]
    assert [t["name"] for t in rates] == ["stored (BlockStored)", "evicted (BlockRemoved)"]


def test_page_connects_to_a_server_and_draws_its_cache():
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    port, replay = pub.endpoint.rsplit(":", 1)[1], pub.replay_endpoint.rsplit(":", 1)[1]
    server = fake_vllm([{"endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}", "topic": ""}])
    at = None
    try:
        from pagedkv_core.observe.wire import BlockStored

        pub.publish([BlockStored([21, 22], None, list(range(8)), 4, None, "GPU")])
        at = open_page(PAGE)
        at.text_input(key="vllm_url").set_value(f"http://127.0.0.1:{server.server_address[1]}").run()
        at.button(key="vllm_connect").click().run()
        assert not at.exception, at.exception
        assert not at.error, [e.value for e in at.error]
        forest = figure(at, "vllm_forest")["data"][0]
        assert [int(i, 16) for i in forest["ids"]] == [21]  # one stretch of two blocks
        assert plotly_array(forest["values"]).tolist() == [2] and "(2 blocks)" in forest["labels"][0]
        at.button(key="vllm_disconnect").click().run()
        assert "vllm_live" not in at.session_state
    finally:
        if at is not None and "vllm_live" in at.session_state:
            at.session_state["vllm_live"].close()
        server.shutdown()
        server.server_close()
        pub.close()


def test_workshop_mode_connects_only_to_listed_servers(monkeypatch):
    monkeypatch.setenv("PAGEDKV_WORKSHOP", "1")
    monkeypatch.delenv(vllm_view.ENV_SERVERS, raising=False)
    assert vllm_view.server_choices("127.0.0.1") == []
    with pytest.raises(ConfigError, match="PAGEDKV_VLLM_SERVERS"):
        vllm_view.check_server("http://127.0.0.1:8000", "127.0.0.1")
    at = open_page(PAGE)
    assert not at.text_input, "no free-form URL in workshop mode"
    assert any("PAGEDKV_VLLM_SERVERS" in i.value for i in at.info)

    monkeypatch.setenv(vllm_view.ENV_SERVERS, "http://10.0.0.5:8000, http://10.0.0.6:8000/")
    assert vllm_view.server_choices("0.0.0.0") == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert vllm_view.check_server("http://10.0.0.6:8000", "0.0.0.0") == "http://10.0.0.6:8000"
    for other in ("http://169.254.169.254", "http://10.0.0.5:8001", "http://127.0.0.1:8000"):
        with pytest.raises(ConfigError):
            vllm_view.check_server(other, "0.0.0.0")
    at = open_page(PAGE)
    assert not at.text_input
    assert at.selectbox(key="vllm_server").options == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]

    monkeypatch.delenv("PAGEDKV_WORKSHOP")  # not workshop, but listening on every interface: the list still rules
    assert vllm_view.server_choices("0.0.0.0") == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert vllm_view.server_choices("127.0.0.1") is None  # one person on loopback: any URL


def test_hit_rate_is_taken_over_intervals():
    x, rate = vllm_view.interval_hit_rate([0, 0.5, 1, 2.5, 3, 4.1], [0, 0, 10, 10, 10, 30], [0, 10, 20, 20, 20, 40])
    assert x.tolist() == [2.0, 4.0, 6.0]
    assert rate[0] == 0.5 and rate[2] == 1.0 and rate[1] != rate[1]  # nothing queried in [2, 4): NaN


def test_live_runs_publish_on_the_operators_endpoint(monkeypatch):
    """PAGEDKV_KV_EVENTS: every live engine publishes on one socket, under a rank of its own."""
    from tests.browser import free_port
    from ui import live_kv_events

    port = free_port()
    monkeypatch.setenv(live_kv_events.ENV_KV_EVENTS, f"tcp://*:{port}")
    config = EngineConfig(pool_slots=1024, block_size=16)
    sinks = [live_kv_events.sink_for(config), live_kv_events.sink_for(config)]
    pub = sinks[0].publisher
    assert sinks[1].publisher is pub and sinks[0].data_parallel_rank != sinks[1].data_parallel_rank
    assert live_kv_events.sink_for(EngineConfig(allocator="contiguous")) is None
    observer = Observer(Subscriber([EventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")]))
    try:
        engines = [Engine(config, ScriptedSource(), kv_event_sink=s) for s in sinks]
        for i, engine in enumerate(engines):
            engine.add_request(f"r{i}", list(range(100 + i, 164 + i)), output_len=4)
            engine.run(snapshot=False)
        for _ in range(MAX_POLLS):
            if observer.subscriber.next_seq(0) == pub.next_seq:
                break
            if not observer.poll(0.05):
                observer.catch_up()  # the first batches went out before the subscription: the replay has them
        for sink, engine in zip(sinks, engines):
            seen = observer.state(sink.data_parallel_rank).hashes()
            assert seen == {h & (2**64 - 1) for h in engine.allocator.pool.cached} and seen
    finally:
        observer.close()
