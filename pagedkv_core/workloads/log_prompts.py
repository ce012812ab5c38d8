"""Real-model replay of a request log: prompts of the log's token lengths, made of real text.

A request log such as Azure's publishes only sizes (prompt tokens, answer tokens), never text. To run
those sizes through the real model, each prompt is built to exactly its (scaled) length from
real English: a one-turn chat whose user message is an excerpt of the passages in
``data/prompt_text.txt`` (public-domain prose) followed by one of the bundled chat questions
(:data:`pagedkv_core.workloads.prompts.CHAT_PROMPTS`). The excerpt starts at a word, and the requests of
one call start at different words (spread over the text by a stride, from a seeded first word),
so the prompts share no more than the chat template's opening, as requests to one chat service
do (about one 16-token block); the log itself states nothing shared, and with the same start
two prompts would share their excerpts too. The excerpt is cut to the token; prompts too short
for the template are plain excerpts. Each request asks for exactly the log's answer length with ``ignore_eos=True``, so
the model writes exactly that many tokens whatever it would say.

``scale`` shrinks every length (1/8 makes the Azure conversation log, mean prompt ~1,000
tokens, run on a CPU): ``max(1, round(n * scale))``, as :class:`~pagedkv_core.workloads.scenarios.LogOptions`
scales them for the scripted engine.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from .prompts import CHAT_PROMPTS
from ..sampling import SamplingParams
from .scenarios import DATA_DIR, scale_length

TEXT_FILE = DATA_DIR / "prompt_text.txt"
_SLOT = "\x00PAGEDKV-TEXT\x00"  # stands for the user's message while the chat template is rendered


@lru_cache(maxsize=1)
def passages() -> tuple[str, ...]:
    """The passages of ``data/prompt_text.txt`` (comment lines dropped)."""
    lines = [ln for ln in TEXT_FILE.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    return tuple(p.strip() for p in "\n".join(lines).split("\n\n") if p.strip())


def _encode(tokenizer, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


class PromptBuilder:
    """Builds prompts of exact token lengths for one tokenizer (tokenizes the text once)."""

    def __init__(self, tokenizer, chat: bool = True):
        self.tokenizer = tokenizer
        self.text_ids = np.array(_encode(tokenizer, "\n\n".join(passages()) + "\n\n"), dtype=np.int64)
        pieces = [tokenizer.decode([int(t)]) for t in self.text_ids]
        self.word_starts = np.array([i for i, p in enumerate(pieces) if p[:1].isspace() and p.strip()], dtype=np.int64)
        n = len(self.word_starts)
        self.stride = next(k for k in range(int(n * 0.618), n) if math.gcd(k, n) == 1)  # visits every word once
        self.head: list[int] = []
        self.tails: list[list[int]] = []
        if chat and getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": _SLOT}], tokenize=False,
                                                     add_generation_prompt=True)
            before, after = rendered.split(_SLOT)
            self.head = _encode(tokenizer, before)
            self.tails = [_encode(tokenizer, f"\n\n{q}{after}") for q in CHAT_PROMPTS]

    def excerpt(self, start: int, n: int) -> list[int]:
        """``n`` token ids of the text from ``start``, wrapping around at its end."""
        idx = (start + np.arange(n)) % len(self.text_ids)
        return self.text_ids[idx].tolist()

    def start(self, k: int, first: int = 0) -> int:
        """Where the ``k``-th excerpt starts: the ``first + k * stride``-th word (mod the words),
        so the starts of up to one per word are all different."""
        return int(self.word_starts[(first + k * self.stride) % len(self.word_starts)])

    def prompt(self, length: int, start: int, rng: np.random.Generator) -> list[int]:
        """Token ids of a prompt of exactly ``length`` tokens, its text from token ``start``."""
        if self.tails:
            tail = self.tails[int(rng.integers(len(self.tails)))]
            body = length - len(self.head) - len(tail)
            if body >= 1:
                return self.head + self.excerpt(start, body) + tail
        return self.excerpt(start, length)


def _lengths(row) -> tuple[int, int]:
    if hasattr(row, "prompt_len"):
        return int(row.prompt_len), int(row.answer_len)
    prompt_len, answer_len = row
    return int(prompt_len), int(answer_len)


def log_requests(rows: Iterable, tokenizer, scale: float = 1 / 8, *, seed: int = 0, chat: bool = True,
                   **sampling) -> list[tuple[list[int], SamplingParams]]:
    """One ``(prompt_ids, SamplingParams)`` per row, in order: a prompt of exactly
    ``scale_length(prompt_len, scale)`` tokens and ``max_tokens`` = the scaled answer length,
    with ``ignore_eos=True``. ``rows``: :class:`~pagedkv_core.workloads.scenarios.LogRow` objects (or
    anything with ``prompt_len`` and ``answer_len``) or ``(prompt_len, answer_len)`` pairs.
    ``seed`` picks where each excerpt starts and which question ends it; ``sampling`` passes
    further SamplingParams fields (temperature, seed, ...)."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale!r}")
    builder = PromptBuilder(tokenizer, chat)
    first = int(np.random.default_rng([seed, 0x7e47]).integers(len(builder.word_starts)))
    out = []
    for i, row in enumerate(rows):
        prompt_len, answer_len = _lengths(row)
        if prompt_len < 1 or answer_len < 1:
            raise ValueError(f"row {i}: lengths must be >= 1, got prompt {prompt_len}, answer {answer_len}")
        rng = np.random.default_rng([seed, i])
        ids = builder.prompt(scale_length(prompt_len, scale), builder.start(i, first), rng)
        out.append((ids, SamplingParams(max_tokens=scale_length(answer_len, scale), ignore_eos=True, **sampling)))
    return out
