"""A vLLM server in view: its KV-cache events and Prometheus signals, and ours in its format.

- :mod:`.wire`: vLLM's event batches (msgpack via msgspec), decoded and encoded.
- :mod:`.discovery`: a server's event endpoints, from ``GET /kv_event_sources``.
- :mod:`.subscriber`: ZMQ SUB per endpoint, gaps filled from the replay socket.
- :mod:`.cache_state`: the events folded into the cached blocks, a forest of prefix chains.
- :mod:`.server_metrics`: ``/metrics`` read with prometheus_client's parser.
- :mod:`.observer`: all of the above, polled; ``observe --json``'s summary.
- :mod:`.observation`: an observation recorded as a pagedkv trace, and read back.
- :mod:`.publisher`: pagedkv's engine publishing the same events (``--kv-events``).
"""
