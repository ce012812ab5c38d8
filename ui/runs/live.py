"""Live runs: the chat prompts (or the first requests of the shipped Azure request log) on the real
model, a contiguous baseline and paged side by side, stepped by a
:class:`~ui.live_stepper.LiveStepper` on a thread of their own while the page draws. No Streamlit
here: this module sizes, starts and finishes the runs; keeping them in the browser session and
stepping them for the page is :mod:`ui.runs.session`'s."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedkv_core.config import EngineConfig
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.sizing.memory import check_fits
from ui.live_stepper import GuardedRecording
from ui.runs.budgets import budget_note, run_bytes_estimate
from ui.runs.model import Run, compact_header

REAL_MAX_TOKENS = 256  # the longest answer a live chat request may ask for: what a contiguous server must reserve
# Tokens one step of a live real-model engine may compute (EngineConfig.max_batch_tokens, vLLM's
# max_num_batched_tokens): the 16 chat prompts' prefills (about 600 tokens) are chunked over the
# first steps instead of one step of several seconds, so the first frame comes at once. 64 keeps
# one step of the pair near 0.3 s on one core each while prefilling, and above the 16 decodes
# of a full batch, so the budget never holds a decode back.
LIVE_BATCH_TOKENS = 64
LIVE_LOG_SCALE = 1 / 8  # request-log lengths scaled so a CPU replays them live

LiveRequest = tuple[str, list[int], object]  # (request id, prompt ids, SamplingParams)
LiveText = tuple[str, str, str]  # (request id, text so far, finish reason or "running")


@dataclass(eq=False)
class LiveRun(Run):
    """A run on the real model that the page steps live, with what only such a run has."""

    token_text: Callable[[int], str] | None = None  # token id -> its text (the hover labels)
    kv_bytes: int = 0  # the engine's KV pools (device + host), while it holds them
    texts: list[LiveText] = field(default_factory=list)  # the answers, kept when the engine is let go

    @property
    def nbytes(self) -> int:
        """:attr:`Run.nbytes <ui.runs.model.Run.nbytes>` plus the KV pools while the engine holds them."""
        held = super().nbytes
        if self.engine is not None:
            held += self.kv_bytes
        return held


def live_configs(contiguous: str, **engine_settings) -> list[EngineConfig]:
    """The live pair's configs: the contiguous baseline ``contiguous`` and paged, each with
    ``engine_settings`` (the sidebar's) and the per-step token budget :data:`LIVE_BATCH_TOKENS`."""
    return [EngineConfig(**{**engine_settings, "allocator": a, "max_batch_tokens": LIVE_BATCH_TOKENS})
            for a in (contiguous, "paged")]


def live_requests(tokenizer, replay: bool) -> list[LiveRequest]:
    """(request id, prompt ids, SamplingParams) of the live pair: the 16 chat prompts, or the
    first 16 requests of the shipped Azure request log replayed at :data:`LIVE_LOG_SCALE` (exact
    prompt and answer lengths, ``ignore_eos``; Orca Pow2 and Oracle then reserve from the
    answer's real length)."""
    from pagedkv_core.sampling import SamplingParams
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS
    from ui.models import chat_prompt  # a plain function of the tokenizer

    if replay:
        from pagedkv_core.workloads.log_prompts import log_requests
        from pagedkv_core.workloads.scenarios import DATA_DIR, read_log_rows

        rows = read_log_rows(DATA_DIR / "azure_conv_2023.csv", 0, len(CHAT_PROMPTS))
        return [(f"log{i:02d}", ids, sp) for i, (ids, sp) in enumerate(log_requests(rows, tokenizer, LIVE_LOG_SCALE))]
    return [(f"chat{i:02d}", chat_prompt(tokenizer, text), SamplingParams(max_tokens=REAL_MAX_TOKENS))
            for i, text in enumerate(CHAT_PROMPTS)]


def live_workload_note(workload: str) -> str:
    """What the live pair runs in place of the sidebar's scripted ``workload`` (the pages and the
    sidebar say it, so that the requests on the screen are never a surprise)."""
    from pagedkv_core.workloads.prompts import CHAT_PROMPTS

    n = len(CHAT_PROMPTS)
    if workload.startswith("azure-conv"):
        return (f"SmolLM2 replays the first {n} requests of Azure's conversation log as real text, their prompt "
                f"and answer lengths scaled to 1/{round(1 / LIVE_LOG_SCALE)}: the rest of the {workload} workload "
                "does not run on the real model.")
    return (f"SmolLM2 runs {n} chat prompts (answers of up to {REAL_MAX_TOKENS} tokens), not the {workload} "
            f"workload: a real model needs real prompts. An azure-conv workload replays the first {n} requests "
            "of Azure's log instead.")


def check_live_fits(make, configs: list[EngineConfig], budget: int) -> list[int]:
    """Each config's KV pools (bytes) on ``make``'s model (a :class:`ui.models.EngineFactory`),
    after checking that the pools and the runs' fixed parts fit ``budget``: BudgetError (a
    ConfigError, one line with the numbers) before anything is allocated when they would not."""
    kv = [make.kv_bytes(cfg) for cfg in configs]
    need = sum(kv) + sum(run_bytes_estimate(cfg) for cfg in configs)
    check_fits(need, budget,
               f"the two real-model KV pools ({configs[0].pool_slots:,} device slots each, plus "
               f"{configs[1].num_host_blocks * configs[1].block_size:,} host slots for swap, at "
               f"{format_bytes(make.bytes_per_token)} a token)",
               hint="pick a smaller pool or swap pool, or raise PAGEDKV_SESSION_BUDGET")
    return kv


def start_live(make, configs: list[EngineConfig], kv_bytes: list[int], requests: list[LiveRequest],
               token_text: Callable[[int], str] | None) -> list[LiveRun]:
    """A fresh engine per config from ``make``, each with ``requests`` added and nothing stepped
    yet, recording into a :class:`~ui.live_stepper.GuardedRecording` (the stepping thread writes
    it while the page reads it)."""
    runs = []
    for cfg, kv in zip(configs, kv_bytes):
        recording = GuardedRecording()
        engine = make(cfg, recording=recording)
        for rid, ids, sampling in requests:
            engine.add_request(rid, ids, sampling)
        runs.append(LiveRun(cfg.allocator, cfg, request_ids=list(engine.requests), header=compact_header(engine),
                            engine=engine, recording=recording, token_text=token_text, kv_bytes=kv))
    return runs


def finish(run: LiveRun, tokenizer) -> None:
    """A live run whose engine has ended (or was stopped): keep its header and texts, release its pools."""
    run.texts = live_texts(run, tokenizer)
    run.header = {**compact_header(run.engine), "summary": run.engine.summary().to_json()}
    run.done = not run.engine.has_unfinished()
    run.engine = None
    run.kv_bytes = 0


def after_live_step(runs: list[LiveRun], budget: int, tokenizer) -> None:
    """After each step of a live group (on its stepping thread): finish the runs that ended, and
    stop them all, saying so, when together they outgrow ``budget``."""
    for run in runs:
        if run.engine is not None and not run.engine.has_unfinished():
            finish(run, tokenizer)
    if sum(r.nbytes for r in runs) > budget:
        for run in runs:
            if run.engine is not None:
                run.stopped = budget_note(run, budget // len(runs))
                finish(run, tokenizer)


def live_texts(run: LiveRun, tok) -> list[LiveText]:
    """(request id, text so far, finish reason) of a live run: from its engine while it runs
    (decoded with ``tok``, the model's tokenizer), the texts kept when it ended."""
    engine = run.engine  # read once: the stepping thread lets it go when the run ends
    if engine is None:
        return list(run.texts)
    out = []
    for rid in run.request_ids:
        req = engine.get_request(rid)
        ids = list(req.output_token_ids[0]) if req.output_token_ids else []
        out.append((rid, tok.decode(ids, skip_special_tokens=True), req.finish_reason or "running"))
    return out
