"""``python -m pagedkv_core observe`` against a stand-in vLLM (an HTTP server for /metrics and
/kv_event_sources, and our publisher for the events), and the ``--kv-events`` flags' checks.
Sockets are on 127.0.0.1, ephemeral ports, closed in ``finally``."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pagedkv_core.cli import main
from pagedkv_core.observe.observation import load_observation
from pagedkv_core.observe.publisher import KVEventPublisher
from pagedkv_core.observe.wire import BlockRemoved, BlockStored

METRICS = (
    "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.125\n"
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0\n"
    "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{engine=\"0\"} 0\n"
    "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{engine=\"0\"} 719\n"
    "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 480\n"
    "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"4\",num_gpu_blocks=\"64\"} 1\n"
)


def fake_vllm(sources: list[dict]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/metrics":
                body, kind = METRICS.encode(), "text/plain"
            elif self.path == "/kv_event_sources":
                body, kind = json.dumps(sources).encode(), "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_observe_a_server_through_discovery(tmp_path, capsys):
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", bind=True)
    port = pub.endpoint.rsplit(":", 1)[1]
    replay_port = pub.replay_endpoint.rsplit(":", 1)[1]
    server = fake_vllm([{"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
                         "replay_endpoint": f"tcp://*:{replay_port}", "topic": ""}])
    try:
        # sent before the observer starts: it gets them from the replay buffer
        pub.publish([BlockStored([11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU")])
        pub.publish([BlockStored([13], 12, [9, 10, 11, 12], 4, None, "GPU")])
        pub.publish([BlockRemoved([13], "GPU")])
        trace = tmp_path / "observed.jsonl"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc = main(["observe", "--server", url, "--duration", "1", "--json", "--trace-out", str(trace)])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0
        assert out["batches"] == 3 and out["replayed"] == 3 and out["gaps"] == 0
        assert out["events"] == {"BlockStored": 2, "BlockRemoved": 1, "AllBlocksCleared": 0}
        assert out["blocks_stored"] == 3 and out["blocks_removed"] == 1 and out["cached_blocks"] == 2
        assert out["block_size"] == 4
        assert out["metrics"] == {"kv_cache_usage_perc": 0.125, "prefix_cache_hits": 480, "prefix_cache_queries": 719,
                                  "num_preemptions": 0, "num_requests_running": 1, "num_requests_waiting": 0}
        obs = load_observation(trace)
        assert obs.recording.scalars["num_blocks"] == 64 and obs.recording.scalars["block_size"] == 4
        last = obs.recording.last_step
        state = obs.state_at(last)
        assert state.hashes() == {11, 12} and state.chain_tokens(12) == [1, 2, 3, 4, 5, 6, 7, 8]
        snap = obs.recording.at(last)
        assert int((snap.block_state == 3).sum()) == 2  # two cached blocks drawn
        assert sorted(snap.slot_token[snap.slot_token >= 0].tolist()) == [1, 2, 3, 4, 5, 6, 7, 8]
        assert snap.metrics.kv_usage == 0.125 and snap.metrics.prefix_hit_tokens == 480
        assert obs.header["observation"]["unknown"], "the view says what it does not know"
        assert main(["replay", str(trace), "--json"]) == 0  # a trace like any other
        assert json.loads(capsys.readouterr().out)["step"] == last
    finally:
        server.shutdown()
        server.server_close()
        pub.close()


def test_observe_refuses_what_it_cannot_watch(capsys):
    assert main(["observe"]) == 2
    assert "give --server" in capsys.readouterr().err
    assert main(["observe", "--server", "http://127.0.0.1:9"]) == 2  # nothing listens on port 9
    err = capsys.readouterr().err
    assert "does not answer" in err and err.count("\n") == 1
    assert main(["observe", "--server", "ftp://x"]) == 2
    assert main(["observe", "--kv-events", "tcp://nowhere"]) == 2
    assert main(["observe", "--kv-events", "tcp://127.0.0.1:9", "--duration", "-1"]) == 2


def test_observe_a_server_without_discovery_says_what_to_give(capsys):
    server = fake_vllm([])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["observe", "--server", url]) == 2  # /kv_event_sources answers [] here
        assert "publishes no KV events" in capsys.readouterr().err
        assert main(["observe", "--server", url + "/nothing-here"]) == 2  # /metrics 404
        assert "HTTP 404" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


def test_observe_an_endpoint_that_never_sends_ends_with_one_line(capsys):
    rc = main(["observe", "--kv-events", "tcp://127.0.0.1:9", "--first-event-timeout", "0.3", "--json"])
    captured = capsys.readouterr()
    assert rc == 2
    assert json.loads(captured.out)["batches"] == 0
    assert captured.err.startswith("error: no KV events from tcp://127.0.0.1:9") and captured.err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["--kv-events", "tcp://127.0.0.1:x"], "--kv-events must be"),
    (["--kv-events", "tcp://*:5999", "--allocator", "contiguous"], "needs a paged allocator"),
    (["--kv-events-replay", "tcp://*:5998"], "needs --kv-events"),
])
def test_kv_events_flags_are_checked_before_the_run(argv, message, capsys):
    assert main(["simulate", "--workload", "shared_preamble", *argv]) == 2
    assert message in capsys.readouterr().err
