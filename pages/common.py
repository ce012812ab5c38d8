"""What every page shares: the sidebar settings and the model, loaded once per process.

This module draws widgets and caches resources; it never allocates KV memory itself. The
engine (``pagedkv_core``) does that, and the pages only read its snapshots.
"""
from __future__ import annotations

import streamlit as st

from pagedkv_core.kv_math import KVShape
from pagedkv_core.model.loader import ModelLoadError, gguf_cache_dir, load_model, resolve_source

@st.cache_resource(show_spinner=False, max_entries=2)
def _load_cached(model_path: str, _progress=None):
    return load_model(model_path or None, progress=_progress)


def loaded_model(model_path: str | None = None):
    """The real model (bundled SmolLM2 unless the sidebar names another), loaded once per process.
    Shows progress while a first run converts the GGUF file. Returns None after showing st.error."""
    model_path = st.session_state.get("model_path", "") if model_path is None else model_path
    try:
        source = resolve_source(model_path or None)
    except ModelLoadError as exc:
        st.error(str(exc))
        return None
    first_time = source.is_file() and not (gguf_cache_dir(source) / "config.json").is_file()
    try:
        if first_time:
            with st.status(f"Converting {source.name} to a local cache (first run only)…", expanded=True) as status:
                bar = st.progress(0.0)
                lm = _load_cached(model_path, _progress=lambda f, what: bar.progress(min(1.0, f), text=what))
                status.update(label=f"Loaded {lm.name} in {lm.load_seconds:.1f} s", state="complete", expanded=False)
        else:
            with st.spinner(f"Loading {source.name}…"):
                lm = _load_cached(model_path, _progress=lambda f, what: None)
    except ModelLoadError as exc:
        st.error(str(exc))
        return None
    return lm


def model_kv_shape(lm) -> KVShape:
    return KVShape.from_config(lm.config, name=lm.name)


@st.cache_resource(show_spinner=False, max_entries=2)
def _base_runner(model_path: str):
    from pagedkv_core.model.runner import ModelRunner

    lm = _load_cached(model_path, _progress=lambda f, what: None)
    return ModelRunner(lm, device="auto")  # the GPU when there is one (bf16, Triton kernels), else the CPU


def real_engine(config):
    """A fresh Engine on the real model with its own KV pool. Engines made here share one copy of
    the weights (a shallow copy of a cached runner: ``bind`` gives each copy its own pools), so a
    page can run several side by side. Returns None after st.error when the model cannot load."""
    import copy

    from pagedkv_core.engine import Engine

    lm = loaded_model()
    if lm is None:
        return None
    runner = copy.copy(_base_runner(st.session_state.get("model_path", "") or ""))
    return Engine(config, runner)


def tokenizer():
    lm = loaded_model()
    return None if lm is None else lm.tokenizer


def chat_ids(text: str) -> list[int]:
    """Token ids of ``text`` as one user turn of the model's chat template, with the generation prompt."""
    enc = tokenizer().apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return [int(t) for t in (enc if isinstance(enc, list) else enc["input_ids"])]


def token_text_lookup():
    """A function token id -> readable text, cached per id (for hover labels)."""
    tok = tokenizer()
    cache: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = tok.decode([token_id])
        return cache[token_id]

    return text
