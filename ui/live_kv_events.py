"""The app's live runs publishing vLLM's KV events: an operator's option, ``PAGEDKV_KV_EVENTS``.

With ``PAGEDKV_KV_EVENTS=tcp://*:5557`` in the app's environment (``tcp://*:PORT`` binds, the replay
socket on the next port; ``tcp://HOST:PORT`` connects to a relay), every live real-model engine the
app builds publishes its prefix cache's BlockStored / BlockRemoved / AllBlocksCleared in vLLM's wire
format, so that ``python -m pagedkv_core observe --kv-events tcp://127.0.0.1:5557`` (or Dynamo's
router, or llm-d) watches the room's engines. One socket for the whole app: each engine's batches
carry a rank of their own (``data_parallel_rank``), so an observer keeps one cache per engine. A
visitor cannot turn it on or point it anywhere: only the environment does.
"""
from __future__ import annotations

import itertools
import os
import threading

import streamlit as st

ENV_KV_EVENTS = "PAGEDKV_KV_EVENTS"
_ranks = itertools.count()
_rank_lock = threading.Lock()


@st.cache_resource(show_spinner=False)
def _publisher(endpoint: str):
    from pagedkv_core.observe.publisher import KVEventPublisher, binds, default_replay

    return KVEventPublisher(endpoint, default_replay(endpoint) if binds(endpoint) else None)


def endpoint() -> str | None:
    text = os.environ.get(ENV_KV_EVENTS, "").strip()
    return text or None


def sink_for(config):
    """A kv_event_sink for a live engine of ``config``, or None (option off, or not a paged pool)."""
    ep = endpoint()
    if ep is None:
        return None
    from pagedkv_core.kv.registry import allocator_kind
    from pagedkv_core.config import ConfigError
    from pagedkv_core.observe.publisher import EngineKVEvents

    if allocator_kind(config.allocator) != "paged":
        return None
    try:
        publisher = _publisher(ep)
    except ValueError as exc:
        raise ConfigError(f"{ENV_KV_EVENTS}: {exc}") from None
    with _rank_lock:
        rank = next(_ranks)
    return EngineKVEvents(publisher, config.block_size, data_parallel_rank=rank)
