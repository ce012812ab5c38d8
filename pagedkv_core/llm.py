"""``LLM``: the offline API over the real model and the paged engine (vLLM's ``LLM``, in small).

    from pagedkv_core.llm import LLM
    from pagedkv_core.sampling import SamplingParams

    llm = LLM(device="cpu", block_size=16, pool_slots=4096)
    outs = llm.generate(["What is the capital of France?"], SamplingParams(max_tokens=32), chat=True)
    print(outs[0].outputs[0].text)

The model is loaded once (:func:`pagedkv_core.sources.model.loader.load_model`) and wrapped in one
:class:`~pagedkv_core.sources.model.runner.ModelRunner`. Each ``generate`` / ``stream`` call runs a fresh
:class:`~pagedkv_core.engine.Engine` on that runner (its pool is re-bound, so every call starts from
an empty pool at step 0 and has its own summary). For step-by-step driving (the pages),
:meth:`LLM.new_engine` returns such an engine; ``LLM.tokenizer`` decodes the token ids that the
snapshots carry per slot.

Pool size, in order of precedence: ``pool_slots``; ``pool_blocks`` (x ``block_size``);
``kv_budget_bytes`` (bytes per block = 2 x layers x kv_heads x head_dim x dtype bytes x block_size);
``memory_fraction`` (CUDA: a profiling pass measures the activation peak, and that peak, the weights
and everything else on the GPU are subtracted from this fraction of its memory); by default 2,048
slots on the CPU and a profiled 90 % of the GPU (capped at ``MAX_DEFAULT_SLOTS``) on CUDA.

Nothing big happens before the settings are known to be sane: :func:`~pagedkv_core.sizing.pool_plan.preflight`
checks the device, threads, dtype, model path and the planned pools against the memory budget
(:mod:`pagedkv_core.sizing.memory`) before torch or the weights load, and the pools are planned again
from the loaded model's exact bytes per token before the engine allocates them. A pool that
does not fit is refused with its numbers (BudgetError, a ConfigError).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import time
from collections.abc import Callable, Iterator

from .config import ConfigError, EngineConfig, setting_spec
from .engine import Engine
from .sizing.kv_math import KVShape
from .outputs import CompletionOutput, RequestOutput, StreamDelta
from .sizing.pool_plan import DEFAULT_CPU_SLOTS, ENGINE_SETTINGS, HOST_SWAP_BUDGET, PoolPlan, plan_pool, preflight
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "CompletionOutput", "StreamDelta", "ENGINE_SETTINGS", "DEFAULT_CPU_SLOTS",
           "HOST_SWAP_BUDGET"]

MAX_DEFAULT_SLOTS = 1 << 18  # a profiled default pool stops here (snapshots copy per-slot arrays)
DEFAULT_MEMORY_FRACTION = 0.9


def check_max_tokens(max_tokens: int, max_model_len: int, what: str = "max_tokens") -> None:
    """ConfigError (one line, with the bound) for an answer longer than the model's context:
    no prompt (of at least one token) leaves room for it, and it would only run until the
    context or the pool ran out. A prompt and an answer that merely overflow the context
    together still run, and end at it (finish_reason "length"), as in the engine."""
    if max_tokens >= max_model_len:
        raise ConfigError(f"{what} must be below the model's context of {max_model_len:,} tokens "
                          f"(max_model_len, prompt + answer), got {max_tokens:,}")


@contextlib.contextmanager
def _loading_output(quiet: bool):
    """``quiet``: nothing at all reaches stderr while the model loads (the GGUF conversion's bar is
    a plain tqdm that no switch reaches; transformers' own bar the loader turns off itself). That
    swaps ``sys.stderr`` for the whole process, so it is for a command line, not for a server's
    threads."""
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
        yield


class _Detokenizer:
    """Incremental text of one sample: decodes everything so far and hands out the new suffix,
    holding back a trailing partial UTF-8 character until it is complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text = ""

    def update(self, token_ids: list[int], final: bool) -> str:
        full = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if not final and full.endswith("\ufffd"):
            return ""
        if full.startswith(self.text):
            delta = full[len(self.text):]
        else:  # a merge changed earlier characters: hand out the whole new tail
            common = 0
            for a, b in zip(full, self.text):
                if a != b:
                    break
                common += 1
            delta = full[common:]
        self.text = full
        return delta


def _silent(_fraction: float, _what: str) -> None:
    """A loading progress callback that shows nothing."""


class LLM:
    """The real model behind the paged engine.

    ``model``: None (bundled SmolLM2-135M-Instruct), a GGUF file or a transformers directory.
    ``device``: "auto" | "cpu" | "cuda". ``dtype``: None (fp32 on CPU, bf16 on CUDA) or a name.
    ``threads``: torch CPU threads. Pool size: ``pool_slots`` | ``pool_blocks`` |
    ``kv_budget_bytes`` | ``memory_fraction`` (see the module docstring). Everything else in
    ``engine_settings`` goes to :class:`~pagedkv_core.config.EngineConfig`: any of its fields
    but the pool size (:data:`ENGINE_SETTINGS`), with the config's own defaults and bounds.
    ``loaded``: an already loaded model to reuse (skips loading); ``runner``: an existing
    :class:`~pagedkv_core.sources.model.runner.ModelRunner` to share (its device, dtype and weights; each
    engine re-binds its pool, so only the latest engine on a runner may step). ``progress``: the
    loader's callback (None: a bar on stderr); ``quiet``: nothing on stderr while loading (a
    command whose stderr is not a terminal). Raises ConfigError (one line) for bad settings,
    BudgetError (a ConfigError) for pools over the memory budget and ModelLoadError for a model
    that cannot be loaded.
    """

    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str | None = None,
        threads: int | None = None,
        *,
        pool_slots: int | None = None,
        pool_blocks: int | None = None,
        kv_budget_bytes: int | None = None,
        memory_fraction: float | None = None,
        loaded=None,
        runner=None,
        progress: Callable[[float, str], None] | None = None,
        quiet: bool = False,
        **engine_settings,
    ):
        # Everything that needs neither torch nor the weights, before either.
        sizing = dict(pool_slots=pool_slots, pool_blocks=pool_blocks, kv_budget_bytes=kv_budget_bytes,
                      memory_fraction=memory_fraction)
        if runner is not None:
            preflight(device=runner.device, dtype=runner.dtype_name, kv_shape=runner.kv_shape, **sizing, **engine_settings)
        else:
            shape = KVShape.from_config(loaded.config) if loaded is not None else None
            preflight(model, device, dtype, threads, kv_shape=shape, **sizing, **engine_settings)
        from .sources.model.loader import open_model
        from .sources.model.runner import ModelRunner, check_threads, resolve_device, resolve_dtype

        block_size = setting_spec("block_size").check(engine_settings.get("block_size", setting_spec("block_size").default))
        try:
            if runner is None:  # torch's own word on the device and dtype, still before loading
                resolve_dtype(dtype, resolve_device(device))
                if threads is not None:
                    check_threads(threads)
            else:  # share a runner (its weights) with another LLM or a page
                loaded = runner.loaded
            own = loaded is None  # loaded here, for this LLM alone: the runner may take over its weights
            if own:
                # Read directly where the model allows (each weight from the file as the runner
                # copies it); else through transformers into memory of its own (not memory-mapped),
                # so the runner can free each layer's weights as it copies them: the two copies
                # never coexist.
                with _loading_output(quiet):
                    loaded = open_model(model, progress=progress or (_silent if quiet else None), mmap=False)
            self.loaded = loaded
            self.tokenizer = loaded.tokenizer
            self.runner = runner if runner is not None else ModelRunner(loaded, device=device, dtype=dtype,
                                                                         threads=threads, release_source=own)
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(str(exc)) from None
        plan = self._plan(block_size, pool_slots, pool_blocks, kv_budget_bytes, memory_fraction,
                          engine_settings.get("swap_slots"))
        self.config = EngineConfig(**{**engine_settings, "pool_slots": plan.slots, "swap_slots": plan.swap_slots})
        self.pool_info = {
            "slots": self.config.pool_slots,
            "blocks": self.config.num_blocks,
            "bytes": self.config.pool_slots * self.runner.bytes_per_slot,
            "bytes_per_block": self.runner.bytes_per_block(self.config.block_size),
            "swap_slots": self.config.swap_slots,
            "sized_by": plan.sized_by,
        }
        self.engine: Engine | None = None
        self.last_summary: dict | None = None

    # ------------------------------------------------------------------ sizing
    def _plan(self, block_size, pool_slots, pool_blocks, kv_budget_bytes, memory_fraction, swap_slots) -> PoolPlan:
        """The pools from the loaded model's exact bytes per token (profiled on CUDA when no size
        is given), checked against the memory budget before the engine allocates them."""
        bpt = self.runner.bytes_per_slot
        device_type = self.runner.device.type
        plan = plan_pool(bpt, block_size, device_type, pool_slots=pool_slots, pool_blocks=pool_blocks,
                         kv_budget_bytes=kv_budget_bytes, memory_fraction=memory_fraction, swap_slots=swap_slots)
        if plan is None:  # profiled on the GPU
            fraction = DEFAULT_MEMORY_FRACTION if memory_fraction is None else memory_fraction
            if device_type != "cuda":
                raise ConfigError("memory_fraction needs CUDA; on the CPU give pool_slots, pool_blocks or kv_budget_bytes")
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
                raise ConfigError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
            slots = self.runner.slots_for_budget(self.runner.profile_kv_budget(float(fraction)), block_size)
            if memory_fraction is None:
                slots = min(slots, (MAX_DEFAULT_SLOTS // block_size) * block_size)
            slots = min(slots, (setting_spec("pool_slots").hi // block_size) * block_size)
            if slots < block_size:
                raise ConfigError(f"no GPU memory left for the KV pool at memory_fraction={fraction}")
            plan = plan_pool(bpt, block_size, device_type, pool_slots=slots, swap_slots=swap_slots)
            plan = dataclasses.replace(plan, sized_by=f"profiled at memory_fraction={fraction}")
        self._check_budget(plan)
        return plan

    def _check_budget(self, plan: PoolPlan) -> None:
        free = None
        if self.runner.device.type == "cuda":
            import torch

            free = torch.cuda.mem_get_info(self.runner.device)[0] + self._bound_bytes()
        plan.check_budget(self.runner.device.type, device_free=free)

    def _bound_bytes(self) -> int:
        """Device bytes of the pool the runner holds now: a new engine re-binds (frees) it."""
        return int(self.runner.num_slots) * self.runner.bytes_per_slot

    # ------------------------------------------------------------------ engines
    def new_engine(self, recording=None, kv_event_sink=None, **overrides) -> Engine:
        """A fresh engine on this model (the pool is re-bound: earlier engines of this LLM must
        not step again). ``overrides`` replace fields of ``self.config`` (a bigger pool is
        checked against the memory budget first); ``recording``: a Recording or TraceWriter
        that every step is recorded into; ``kv_event_sink``: publishes the prefix cache's
        events (pagedkv_core.observe.publisher.EngineKVEvents)."""
        cfg = dataclasses.replace(self.config, **overrides) if overrides else self.config
        if (cfg.pool_slots, cfg.swap_slots) != (self.config.pool_slots, self.config.swap_slots):
            self._check_budget(PoolPlan(cfg.pool_slots, cfg.swap_slots, self.runner.bytes_per_slot, "new_engine"))
        self.engine = Engine(cfg, self.runner, recording=recording, kv_event_sink=kv_event_sink)
        return self.engine

    @property
    def eos_token_id(self) -> int | None:
        return self.runner.eos_token_id

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt: ids pass through; text is tokenized, or with ``chat`` wrapped
        in the model's chat template as one user turn with the generation prompt."""
        if isinstance(prompt, str):
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise ConfigError("this model's tokenizer has no chat template: drop --chat")
                return self.encode_chat([{"role": "user", "content": prompt}])
            return [int(t) for t in self.tokenizer(prompt)["input_ids"]]
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise ConfigError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation (``[{"role", "content"}, ...]``) in the model's chat
        template with the generation prompt, as vLLM's chat endpoint renders it."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("this model's tokenizer has no chat template: it cannot render chat messages")
        enc = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        ids = enc if isinstance(enc, list) else enc["input_ids"]
        return [int(t) for t in ids]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def _sampling_for(self, sp: SamplingParams) -> SamplingParams:
        extra = [t for t in self.runner.extra_eos_token_ids if t not in sp.stop_token_ids]
        if extra and not sp.ignore_eos:
            return dataclasses.replace(sp, stop_token_ids=tuple(sp.stop_token_ids) + tuple(extra))
        return sp

    def _prepare(self, prompts, sampling_params, chat):
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ConfigError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        items = []
        for p, sp in zip(prompts, params):
            items.append((p if isinstance(p, str) else None, self.encode(p, chat), self._sampling_for(sp)))
        return items

    # ------------------------------------------------------------------ running
    def run(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
        *,
        on_step: Callable | None = None,
        use_tqdm: bool = False,
        engine: Engine | None = None,
        on_submit: Callable[[Engine], None] | None = None,
        sequential: bool = False,
    ) -> Iterator[tuple[list[RequestOutput], object, list]]:
        """Step a fresh engine (or ``engine``) through ``prompts``; yields, per step, (request
        outputs that changed, the StepSnapshot, the engine's raw outputs). ``on_submit(engine)``
        is called once every request is queued, before the first step (a trace writer names
        the requests in its header there). ``sequential``: each request is queued only when
        the previous one has finished, as a chat client sends them (``on_submit`` then sees
        the first one). The last step leaves a run summary in ``self.last_summary``. A
        ``max_tokens`` the model's context cannot hold raises ConfigError
        (:func:`check_max_tokens`) before the first step."""
        items = self._prepare(prompts, sampling_params, chat)
        context = engine.max_model_len if engine is not None else min(self.config.max_model_len, self.runner.max_model_len)
        for _text, _ids, sp in items:  # before any step: an answer the context cannot hold is refused
            check_max_tokens(sp.max_tokens, context)
        engine = engine or self.new_engine()
        base = len(engine.requests)
        ids = [str(base + i) for i in range(len(items))]
        later = list(zip(ids, items))[::-1]  # not queued yet, the next one last

        def feed() -> None:
            while later and not (sequential and engine.has_unfinished()):
                rid, (_text, ids_, sp) = later.pop()
                engine.add_request(rid, ids_, sp)

        feed()
        if on_submit is not None:
            on_submit(engine)
        prompts_by_id = {rid: item[0] for rid, item in zip(ids, items)}
        bar = None
        if use_tqdm:
            try:
                from tqdm import tqdm

                bar = tqdm(total=len(ids), desc="requests", unit="req")
            except ImportError:  # pragma: no cover
                bar = None
        steps = 0
        t_first = t_last = None
        while engine.has_unfinished():
            t0 = time.perf_counter()
            raw, snap = engine.step()
            t_last = time.perf_counter()
            t_first = t0 if t_first is None else t_first
            steps += 1
            outs = [self._convert(o, prompts_by_id.get(o.request_id)) for o in raw]
            if bar is not None:
                bar.update(sum(1 for o in raw if o.finished))
            if on_step is not None:
                on_step(outs, snap)
            yield outs, snap, raw
            feed()
        if bar is not None:
            bar.close()
        elapsed = (t_last - t_first) if t_first is not None else 0.0
        s = engine.summary().to_json()
        s["elapsed_s"] = elapsed
        s["tokens_per_s"] = s["tokens_generated"] / elapsed if elapsed > 0 else 0.0
        s["device"] = str(self.runner.device)
        s["dtype"] = self.runner.dtype_name
        s["pool_bytes"] = self.pool_info["bytes"] if engine.config == self.config else engine.config.pool_slots * self.runner.bytes_per_slot
        self.last_summary = s

    def _convert(self, o: RequestOutput, prompt_text: str | None) -> RequestOutput:
        """The engine's output with the text filled in (each sample's, once the request finishes)."""
        samples = [dataclasses.replace(c, token_ids=list(c.token_ids), new_token_ids=list(c.new_token_ids),
                                       text=self.decode(c.token_ids) if o.finished else "")
                   for c in o.outputs]
        return dataclasses.replace(o, prompt_token_ids=list(o.prompt_token_ids), outputs=samples, prompt=prompt_text)

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
        use_tqdm: bool = False,
        on_step: Callable | None = None,
        *,
        engine: Engine | None = None,
        on_submit: Callable[[Engine], None] | None = None,
        sequential: bool = False,
    ) -> list[RequestOutput]:
        """Run ``prompts`` (strings, token-id lists, or one of either) to completion and return
        one :class:`RequestOutput` per prompt, in order. ``chat`` wraps text prompts in the chat
        template. ``on_step(request_outputs, snapshot)`` sees every step (an output's ``text`` is
        filled in once its request finishes; :meth:`stream` gives partial text). Prompts that cannot run
        (too long for the model or the pool) come back with ``reject_reason`` set, the others run.
        ``engine``, ``on_submit`` and ``sequential``: as for :meth:`run`."""
        final: dict[str, RequestOutput] = {}
        order: list[str] = []
        for outs, _snap, _raw in self.run(prompts, sampling_params, chat, on_step=on_step, use_tqdm=use_tqdm,
                                          engine=engine, on_submit=on_submit, sequential=sequential):
            for o in outs:
                if o.finished:
                    final[o.request_id] = o
        order = sorted(final, key=int)
        return [final[r] for r in order]

    def stream(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
    ) -> Iterator[StreamDelta]:
        """Like :meth:`generate`, but yields a :class:`StreamDelta` per sample as soon as a step
        gives it new tokens (partial text, decoded incrementally)."""
        detok: dict[tuple[str, int], _Detokenizer] = {}
        done_keys: set[tuple[str, int]] = set()
        for _outs, snap, raw in self.run(prompts, sampling_params, chat):
            for o in raw:
                for c in o.outputs:
                    key = (o.request_id, c.index)
                    done = c.finish_reason is not None
                    if key in done_keys or (not c.new_token_ids and not done):
                        continue
                    text = detok.setdefault(key, _Detokenizer(self.tokenizer)).update(c.token_ids, final=done)
                    if done:
                        done_keys.add(key)
                    yield StreamDelta(o.request_id, c.index, text, list(c.new_token_ids), done, c.finish_reason, snap.step)

    def summary(self) -> dict | None:
        """The figures of the last run (see ``last_summary``)."""
        return self.last_summary

    def __repr__(self) -> str:
        r = self.runner
        return (f"LLM({self.loaded.name}, device={r.device}, dtype={r.dtype_name}, "
                f"pool={self.config.pool_slots} slots x block {self.config.block_size}, {self.config.allocator})")

