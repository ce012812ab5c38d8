"""The real model, loaded once per process, and what the pages build on it: engines with their own
KV pools, chat prompts and token text.

This module caches resources and shows load progress; it never allocates KV memory itself. The
engine (``pagedkv_core``) does that, and the pages only read its snapshots.

Cores. Every engine made here runs its forwards on its share of the cores (:class:`CoreShare`):
torch's default is every core for every thread that runs a forward, so two sessions stepping at
once would run twice as many threads as there are cores, and each would wait on the other
mid-GEMM. The two engines of a live pair step in lockstep (:func:`step_together`): one forward
for both, on one engine's share.

Precision. The sidebar may ask for bf16 (:func:`runner_dtype`) where the CPU computes it natively
(AVX512-BF16 or AMX); fp32 stays the default, because the tests that compare with transformers
token for token do so in fp32. A GPU keeps its own default (bf16).
"""
from __future__ import annotations

import copy
import functools
import threading
import time
from dataclasses import dataclass, field

import streamlit as st

from pagedkv_core.kv.registry import allocator_kind
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sizing.kv_math import KVShape, format_bytes
from pagedkv_core.sizing.memory import check_fits, kv_pool_bytes, session_budget
from pagedkv_core.sources.model.loader import ModelLoadError, convert_once, gguf_cache_dir, open_model, resolve_source
from ui import live_kv_events


def model_path() -> str:
    """The sidebar's model path ("" = the bundled SmolLM2)."""
    return st.session_state.get("model_path", "") or ""


@st.cache_resource(show_spinner=False, max_entries=2)
def _load_cached(model_path: str):
    """The model, loaded once per process. Draws nothing: Streamlit replays the elements a cached
    function drew on every later hit, so the first run's conversion progress is drawn outside
    (:func:`loaded_model`)."""
    return open_model(model_path or None, progress=lambda f, what: None)


def loaded_model(path: str | None = None):
    """The real model (bundled SmolLM2 unless the sidebar names another), loaded once per process.
    Shows progress while a first run converts the GGUF file. Returns None after showing st.error."""
    path = model_path() if path is None else path
    try:
        source = resolve_source(path or None)
    except ModelLoadError as exc:
        st.error(str(exc))
        return None
    first_time = source.is_file() and not (gguf_cache_dir(source) / "config.json").is_file()
    try:
        if first_time:
            with st.status(f"Converting {source.name} to a local cache (first run only)…", expanded=True) as status:
                bar = st.progress(0.0)
                convert_once(source, progress=lambda f, what: bar.progress(min(1.0, f), text=what))
                lm = _load_cached(path)
                status.update(label=f"Loaded {lm.name} in {lm.load_seconds:.1f} s", state="complete", expanded=False)
        else:
            with st.spinner(f"Loading {source.name}…"):
                lm = _load_cached(path)
    except ModelLoadError as exc:
        st.error(str(exc))
        return None
    return lm


def model_kv_shape(lm) -> KVShape:
    return KVShape.from_config(lm.config, name=lm.name)


DTYPES = ("float32", "bfloat16")  # the precisions the sidebar may offer for the CPU model
ACTIVE_WINDOW_S = 2.0  # an engine that stepped this recently still counts as using the cores


@functools.lru_cache(maxsize=1)
def bf16_offered() -> bool:
    """Whether the sidebar offers bf16: the CPU computes it natively (read from its flags, without
    importing torch). On a GPU the model runs in bf16 whatever the sidebar says."""
    from pagedkv_core.sources.model import cpu_supports_bf16

    return cpu_supports_bf16()


def runner_dtype() -> str | None:
    """The dtype the sidebar asks of the model: "bfloat16" when it is offered and chosen, else
    None (the device's default: fp32 on the CPU, bf16 on a GPU). The choice is the session's
    ``dtype`` setting (ui.settings)."""
    chosen = st.session_state.get("dtype", DTYPES[0])
    return "bfloat16" if chosen == "bfloat16" and bf16_offered() else None


@st.cache_resource(show_spinner=False, max_entries=4)
def _base_runner(model_path: str, dtype: str | None = None):
    from pagedkv_core.sources.model.runner import ModelRunner

    lm = _load_cached(model_path)
    # The GPU when there is one (bf16, Triton kernels), else the CPU (fp32 unless ``dtype``).
    return ModelRunner(lm, device="auto", dtype=dtype)


class CoreShare:
    """How many torch threads one forward may use: the cores split evenly among the model
    engines that stepped in the last ``window_s`` seconds, in every session of this process
    (:func:`pagedkv_core.sources.model.runner.session_threads`; the cores are at most
    ``OMP_NUM_THREADS`` when that is set). One live pair alone on two cores: one
    thread each, the two forwards side by side; the Live engine page's single engine: both."""

    def __init__(self, window_s: float = ACTIVE_WINDOW_S, clock=time.monotonic, cores: int | None = None):
        self.window_s = window_s
        self._clock = clock
        self._cores = cores
        self._last: dict[int, float] = {}  # id of an engine's source -> when it last stepped
        self._lock = threading.Lock()

    def active(self) -> int:
        """Engines that stepped within the window."""
        now = self._clock()
        with self._lock:
            return sum(1 for t in self._last.values() if now - t <= self.window_s)

    def threads_for(self, who: object) -> int:
        """Threads for ``who``'s forward now; counts ``who`` as stepping."""
        from pagedkv_core.sources.model.runner import session_threads

        now = self._clock()
        with self._lock:
            self._last[id(who)] = now
            for k in [k for k, t in self._last.items() if now - t > self.window_s]:
                del self._last[k]
            engines = len(self._last)
        return session_threads(engines, cores=self._cores)


CORE_SHARE = CoreShare()  # one per process: every session's engines share the cores


class CoreSharingSource:
    """A model runner whose every step first sets torch's thread count, in the thread that runs
    the step, to its engine's share of the cores (``share.threads_for``); everything else is the
    runner's (its KV pools, its dtype, what the pages read of it)."""

    def __init__(self, runner, share: CoreShare):
        self._runner = runner
        self._share = share
        self.threads_used = 0  # the count of the last step

    def execute(self, batch):
        import torch

        self.threads_used = self._share.threads_for(self)
        torch.set_num_threads(self.threads_used)
        return self._runner.execute(batch)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_runner", "_share"):
            raise AttributeError(name)
        return getattr(self._runner, name)

    @staticmethod
    def execute_together(sources: list["CoreSharingSource"], batches: list) -> list[dict]:
        """The batches of ``sources`` (engines made from one model) as one forward
        (:meth:`~pagedkv_core.sources.model.runner.ModelRunner.execute_together`), on one engine's
        share of the cores (each still counts as an engine stepping): a live pair alone on two
        cores runs its forward on one thread and leaves the other core to the page's drawing. Two
        threads there ran slower, each waiting at the GEMMs' barriers while the browser held the
        other core (measured: README, *live*)."""
        import torch

        threads = min(s._share.threads_for(s) for s in sources)
        torch.set_num_threads(threads)
        for source in sources:
            source.threads_used = threads
        return type(sources[0]._runner).execute_together([(s._runner, b) for s, b in zip(sources, batches)])


def step_together(engines: list[Engine]) -> None:
    """One step of each of ``engines`` (a live group, on the stepping thread): where every source
    is a :class:`CoreSharingSource` over runners of one model, their forwards run as one
    (:func:`pagedkv_core.lockstep.step_together`: the weights read once a step, each engine's
    tokens the same); otherwise each steps in turn."""
    sources = [e.source for e in engines]
    models = [getattr(s._runner, "model", None) if isinstance(s, CoreSharingSource) else None for s in sources]
    if len(engines) > 1 and models[0] is not None and all(m is models[0] for m in models):
        from pagedkv_core.lockstep import step_together as lockstep

        lockstep(engines, CoreSharingSource.execute_together)
        return
    for engine in engines:
        engine.step(snapshot=False)


@dataclass(frozen=True)
class EngineFactory:
    """``factory(config)``: a fresh Engine on the real model with its own KV pool. Every engine made
    by one factory shares one copy of the weights (a shallow copy of the cached runner: ``bind``
    gives each copy its own pools), so a page can run several side by side.

    A pool is sized before it is allocated (:meth:`kv_bytes`: device slots plus the host slots
    of the swap pool, at the model's bytes per token), and an engine whose pools would not fit the
    session's memory budget is refused with the numbers (BudgetError, a ConfigError)."""

    runner: object  # pagedkv_core.sources.model.runner.ModelRunner
    tokenizer: object
    cores: CoreShare | None = field(default=None, compare=False)  # None: torch's own thread count

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token slot, in the runner's element type."""
        return int(self.runner.bytes_per_slot)

    def kv_bytes(self, config: EngineConfig) -> int:
        """The device pool and the host swap pool an engine of ``config`` allocates."""
        host = config.num_host_blocks * config.block_size if allocator_kind(config.allocator) == "paged" else 0
        return kv_pool_bytes(config.pool_slots, host, self.bytes_per_token)

    def __call__(self, config: EngineConfig, recording=None) -> Engine:
        check_fits(self.kv_bytes(config), session_budget(),
                   f"a real-model KV pool of {config.pool_slots:,} slots (plus its swap pool) at "
                   f"{format_bytes(self.bytes_per_token)} a token",
                   hint="pick a smaller pool or swap pool, or raise PAGEDKV_SESSION_BUDGET")
        source = copy.copy(self.runner)
        if self.cores is not None:
            source = CoreSharingSource(source, self.cores)
        return Engine(config, source, recording=recording, kv_event_sink=live_kv_events.sink_for(config))


def engine_factory() -> EngineFactory | None:
    """Engines on the sidebar's model, after :func:`loaded_model` has shown its progress on first
    use. None (after st.error) when the model cannot load."""
    lm = loaded_model()
    if lm is None:
        return None
    return EngineFactory(_base_runner(model_path(), runner_dtype()), lm.tokenizer, cores=CORE_SHARE)


def tokenizer():
    lm = loaded_model()
    return None if lm is None else lm.tokenizer


def chat_prompt(tok, question: str, system: str | None = None) -> list[int]:
    """Token ids of ``question`` as one user turn of the model's chat template (after an optional
    system turn), with the generation prompt."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True)
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
