"""The shipped Azure conversation trace, its license, and the scenarios built on it."""
from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.log_prompts import PromptBuilder, passages, log_requests
from pagedkv_core.workloads.scenarios import (
    AZURE_CONV_LOG,
    DATA_DIR,
    WORKLOADS,
    LogRow,
    build_workload,
    load_workload_file,
    read_log_rows,
    workload_description,
)


def shipped_rows():
    with AZURE_CONV_LOG.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    return rows[1:]


def test_the_trace_ships_with_its_license_and_attribution():
    assert AZURE_CONV_LOG.stat().st_size < 1 << 20
    rows = shipped_rows()
    assert len(rows) == 19366
    assert rows[0] == ["2023-11-16 18:15:46.6805900", "374", "44"]
    text = (DATA_DIR / "LICENSE-azure-trace.txt").read_text(encoding="utf-8")
    for needed in ("Microsoft Azure", "AzurePublicDataset", "Splitwise", "ISCA 2024", "CC BY 4.0",
                   "Attribution 4.0 International", "Section 3 -- License Conditions."):
        assert needed in text, needed


def test_the_whole_trace_reads_without_a_bad_row():
    rows = read_log_rows(AZURE_CONV_LOG, start=0, count=5000)
    assert len(rows) == 5000 and rows[0].row == 1 and rows[-1].row == 5000
    times = np.array([r.time_s for r in rows])
    assert (np.diff(times) >= 0).all()
    assert 1000 < times[-1] - times[0] < 1200  # about 4.6 requests a second
    tail = read_log_rows(AZURE_CONV_LOG, start=19000, count=1000)
    assert len(tail) == 366 and tail[-1].row == 19366


def test_azure_conv_is_the_first_thousand_requests_that_fit_the_context():
    w = build_workload("azure-conv")
    rows = shipped_rows()
    assert len(w.requests) == 1000 and w.pool_slots == 65536
    fitting = [i for i, (_, p, a) in enumerate(rows) if int(p) + int(a) <= 2048][:1000]
    assert fitting[-1] == 1107  # rows 1-1,108; 108 of them are longer than the context
    for r, i in zip(w.requests, fitting):
        assert r.id == f"r{i + 1}"
        assert (len(r.prompt), r.output_len) == (int(rows[i][1]), int(rows[i][2]))
        assert len(r.prompt) + r.max_tokens == 2048
    arrivals = [r.arrival_step for r in w.requests]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and 4000 < arrivals[-1] < 5000  # 50 ms a step
    lens = np.array([r.output_len for r in w.requests])
    assert 200 < lens.mean() < 300 and np.median(lens) < lens.mean()  # long-tailed answers
    for words in ("Azure", "CC BY 4.0", "Splitwise", "rows 1-1,108", "108 left out", "50 ms"):
        assert words in w.description, words


def test_azure_conv_small_scales_every_length_by_an_eighth():
    w = build_workload("azure-conv-small")
    big = build_workload("azure-conv")
    assert len(w.requests) == 200 and w.pool_slots == 4096
    by_id = {r.id: r for r in big.requests}
    for r in w.requests:
        assert len(r.prompt) + r.max_tokens == 256
        if r.id in by_id:
            b = by_id[r.id]
            assert abs(len(r.prompt) - len(b.prompt) / 8) <= 0.5 + 1e-9 or len(r.prompt) == 1
            assert abs(r.output_len - b.output_len / 8) <= 0.5 + 1e-9 or r.output_len == 1
    assert "1/8 scale" in w.description and "400 ms" in w.description and "CC BY 4.0" in w.description


@pytest.mark.parametrize("name", ["azure-conv", "azure-conv-small"])
def test_scenarios_are_registered_for_the_app_and_the_cli(name):
    assert name in WORKLOADS
    a, b = build_workload(name, 0), build_workload(name, 1)
    assert [(len(x.prompt), x.output_len, x.arrival_step) for x in a.requests] == [
        (len(x.prompt), x.output_len, x.arrival_step) for x in b.requests
    ]  # the seed changes the prompts' token ids only
    assert a.requests[0].prompt != b.requests[0].prompt
    assert workload_description(name) == a.description


def test_the_shipped_file_loads_as_a_workload_file():
    w = load_workload_file(AZURE_CONV_LOG, count=1000, overlong="leave-out")  # the scenario: rows that fit
    assert [r.id for r in w.requests] == [r.id for r in build_workload("azure-conv").requests]


def test_the_small_scenario_pages_beat_reserving_the_maximum():
    w = build_workload("azure-conv-small")
    out = {}
    for allocator in ("paged", "contiguous"):
        engine = Engine(EngineConfig(pool_slots=w.pool_slots, allocator=allocator), ScriptedSource())
        w.submit(engine)
        out[allocator] = engine.run()
    paged, contiguous = out["paged"], out["contiguous"]
    assert paged.finished == contiguous.finished == 200
    assert contiguous.peak_running == 16  # 4,096 slots / 256-slot reservations
    assert paged.peak_running >= 2 * contiguous.peak_running
    assert paged.steps < 0.8 * contiguous.steps
    assert paged.preemptions > 0  # the paged pool is busy too


# ---------------------------------------------------------------------------- real-model replay

class WordTokenizer:
    """A stand-in tokenizer: one token per word (with its leading space), punctuation mark,
    newline or chat marker; ids are handed out as pieces are first seen."""

    PIECES = re.compile(r"<\|[a-z_]+\|>| ?[A-Za-z']+| ?[0-9]+|\n| ?[^\sA-Za-z0-9]|\s+")

    def __init__(self, chat_template: str | None = "chatml"):
        self.chat_template = chat_template
        self.ids: dict[str, int] = {}
        self.pieces: list[str] = []

    def __call__(self, text, add_special_tokens=True):
        out = []
        for piece in self.PIECES.findall(text):
            if piece not in self.ids:
                self.ids[piece] = len(self.pieces)
                self.pieces.append(piece)
            out.append(self.ids[piece])
        return {"input_ids": out}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


ROWS = [(374, 44), (396, 109), (879, 55), (91, 16), (2, 7), (14050, 1000)]


def test_replay_prompts_have_exactly_the_scaled_lengths():
    tok = WordTokenizer()
    reqs = log_requests(ROWS, tok, scale=1 / 8)
    assert [len(ids) for ids, _ in reqs] == [47, 50, 110, 11, 1, 1756]
    assert [sp.max_tokens for _, sp in reqs] == [6, 14, 7, 2, 1, 125]
    assert all(sp.ignore_eos and sp.n == 1 for _, sp in reqs)
    chat = [tok.decode(ids) for ids, _ in reqs]
    assert chat[0].startswith("<|im_start|>user\n") and chat[0].endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert not chat[3].startswith("<|im_start|>")  # 11 tokens: too short for the template, plain text
    assert log_requests(ROWS, WordTokenizer(), scale=1 / 8) == reqs  # deterministic
    assert log_requests(ROWS, WordTokenizer(), scale=1 / 8, seed=1) != reqs
    full = log_requests(ROWS[:2], WordTokenizer(), scale=1.0, temperature=0.7)
    assert [len(ids) for ids, _ in full] == [374, 396] and full[0][1].temperature == 0.7


def test_replay_prompts_are_real_text_and_start_apart():
    tok = WordTokenizer(chat_template=None)
    rows = read_log_rows(AZURE_CONV_LOG, count=300)
    reqs = log_requests(rows, tok, scale=1 / 8)
    text = "\n\n".join(passages())
    for ids, _ in reqs[:20]:
        assert tok.decode(ids).strip() in text + "\n\n" + text  # an excerpt (wrapping at the end)
    long = [ids for ids, _ in reqs if len(ids) >= 16]
    assert len({tuple(ids[:8]) for ids in long}) >= 0.95 * len(long)  # no two start at the same word
    builder = PromptBuilder(tok, chat=False)
    starts = {builder.start(k) for k in range(len(builder.word_starts))}
    assert len(starts) == len(builder.word_starts)  # the stride visits every word once


def test_replay_takes_log_rows_and_checks_its_arguments():
    reqs = log_requests([LogRow(1, 0.0, 80, 16)], WordTokenizer(), scale=0.5)
    assert len(reqs[0][0]) == 40 and reqs[0][1].max_tokens == 8
    with pytest.raises(ValueError, match="scale must be in"):
        log_requests(ROWS, WordTokenizer(), scale=0)
    with pytest.raises(ValueError, match="row 0: lengths must be >= 1"):
        log_requests([(0, 5)], WordTokenizer())


@pytest.mark.slow
def test_smollm2_replays_the_log_lengths_exactly():
    from pagedkv_core.llm import LLM  # torch and the model: only here

    llm = LLM(device="cpu", pool_slots=2048, block_size=16)
    rows = read_log_rows(AZURE_CONV_LOG, count=6)
    reqs = log_requests(rows, llm.tokenizer, scale=1 / 16)
    outs = llm.generate([ids for ids, _ in reqs], [sp for _, sp in reqs])
    for r, (ids, sp), out in zip(rows, reqs, outs):
        assert out.prompt_token_ids == ids and len(ids) == max(1, round(r.prompt_len / 16))
        assert len(out.outputs[0].token_ids) == sp.max_tokens == max(1, round(r.answer_len / 16))
    longest = max((ids for ids, _ in reqs), key=len)  # 879 / 16 = 55 tokens: a chat turn
    text = llm.decode(longest, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n") and " and " in text


@pytest.mark.slow
def test_live_pair_replays_the_logs_lengths_on_the_real_model():
    """Reserve or page's SmolLM2 source with an azure-conv workload: the first 16 requests of the
    shipped trace at 1/8 of their lengths, exact prompt lengths, answers of exactly the scaled
    length (ignore_eos)."""
    from pagedkv_core.sources.model.loader import open_model
    from pagedkv_core.workloads.scenarios import DATA_DIR, read_log_rows, scale_length
    from ui.runs.live import LIVE_LOG_SCALE, live_requests

    tok = open_model(progress=lambda f, m: None).tokenizer
    rows = read_log_rows(DATA_DIR / "azure_conv_2023.csv", 0, 16)
    reqs = live_requests(tok, True)
    assert [r for r, _, _ in reqs] == [f"log{i:02d}" for i in range(16)]
    for row, (_, ids, sp) in zip(rows, reqs):
        assert len(ids) == scale_length(row.prompt_len, LIVE_LOG_SCALE)
        assert sp.max_tokens == scale_length(row.answer_len, LIVE_LOG_SCALE) and sp.ignore_eos
