"""Every number in a guide's narration comes from the run it narrates (issue 21, item 4).

The check renders each lesson's guide three times, over three different runs of the same lesson
(another seed, another tokenizer, another pool, other measured step times and machine rates), and
reads every number out of every step's text: the narration, the prediction's question and its
explanation (and a lesson's computed take-aways). A number measured from the run changes with the
run (three runs, so that a measurement that happens to repeat once, 92% twice, is not mistaken for
a constant). A number that comes out the same in all renderings must be a named setting of the lesson,
not a figure typed into a sentence: a numeric constant of the lesson's module (or the length of
one of its lists), a field of the runs' config, a fact of the workload (its request count, how
many arrive at each step), or one of the small structural integers 0, 1 and 2 ("block 0",
"2 (K and V)"). A hard-coded measurement ("a 637-token prefix shares 624", "about 620") is the
same in every rendering and is none of these, so it fails.

Everything runs on the scripted token source (the real-model lessons' scenarios take any token
source and tokenizer), so the test needs no model and takes seconds.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import (AZURE_CONV_SMALL_OPTIONS, AZURE_CONV_LOG, LogOptions, build_workload,
                                    request_log_workload)
from tests.test_teaching_pages import CharTokenizer
from ui import costs, guide
from ui.lessons import baselines, block_size, live_engine, ops, prefix_sharing, reserve_or_page, under_pressure
from ui.runs.scripted import scripted_pair

# Names that contain digits but are not quantities: model and hardware names, the rule's source.
NAMES = re.compile(r"Llama \d+(?: \d+B)?|SmolLM2[-\w.]*|OPT-\d+B|Qwen[\d.]+-[\d.]+B|vLLM v\d|PCIe \d\.\d x\d+|"
                   r"SOSP \d+|ISCA \d+|\bH\(")
# A number: optional thousands separators and decimals. One glued to a letter (q0, r5, fp32, 13B,
# x16) is a name and is skipped.
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w])")
STRUCTURAL = {0.0, 1.0, 2.0}


def numbers(text: str) -> list[float]:
    text = NAMES.sub(" ", text)
    out = []
    for m in NUMBER.finditer(text):
        whole = m.group(1).replace(",", "")
        out.append(float(f"{whole}.{m.group(2)}") if m.group(2) else float(whole))
    return out


def step_texts(steps: list[guide.GuideStep]) -> list[str]:
    out = []
    for s in steps:
        parts = [s.title, s.narration]
        if s.predict is not None:
            parts += [s.predict.question, s.predict.why]
        out.append("\n".join(parts))
    return out


def _values(obj, depth: int = 0):
    """Every number a module-level constant holds (containers and dataclasses opened two deep)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield float(obj)
        return
    if depth > 2:
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _values(getattr(obj, f.name), depth + 1)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _values(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        yield float(len(obj))
        for v in obj:
            yield from _values(v, depth + 1)


def settings_of(module, *configs: EngineConfig, workload=None) -> set[float]:
    """The lesson's named settings: its module's numeric constants, the runs' configs, the workload's facts."""
    allowed = set(STRUCTURAL)
    for name, value in vars(module).items():
        if name.isupper():
            allowed.update(_values(value))
    for cfg in configs:
        allowed.update(_values(cfg.to_dict()))
        allowed.update((float(cfg.num_blocks), float(cfg.watermark_blocks)))
    if workload is not None:
        arrivals = Counter(r.arrival_step for r in workload.requests)
        allowed.add(float(len(workload.requests)))
        allowed.update(float(n) for n in arrivals.values())  # how many arrive at a step
        allowed.update(float(n) for n in arrivals)  # the steps they arrive at
    for v in [v for v in allowed if 0 < v < 1]:  # 0.9 reads as "90%", 0.204 as "20%" or "20.4%"
        allowed |= {round(v * 100, 6), float(round(v * 100)), round(v * 100, 1)}
    return allowed


def _by_title(texts: list[str]) -> dict[str, str]:
    """Steps keyed by their title (its first line, digits dropped: "40 requests arrive"), since a run
    may order a guide's steps differently."""
    out = {}
    for t in texts:
        key = re.sub(r"\d", "", t.split("\n", 1)[0])
        out[key if key not in out else f"{key} ({len(out)})"] = t
    return out


def check(name: str, *worlds: list[str], allowed: set[float]) -> None:
    """``worlds``: each rendering's texts, a guide step (or a take-away block) each."""
    keyed = [_by_title(w) for w in worlds]
    assert len({frozenset(k) for k in keyed}) == 1, f"{name}: the runs give guides with different steps"
    assert any(numbers(t) for t in worlds[0]), f"{name}: no numbers at all?"
    bad = []
    for title in keyed[0]:
        texts = [k[title] for k in keyed]
        same = set.intersection(*(set(numbers(t)) for t in texts))
        for n in sorted(same - allowed):
            bad.append(f"{title!r}: {n:g} is the same over every run and is not a setting of the lesson: {texts[0]!r}")
    assert not bad, f"{name}:\n" + "\n".join(bad)


def make_scripted(config, recording=None):
    return Engine(config, ScriptedSource(), recording=recording)


class ShiftTokenizer(CharTokenizer):
    """Another stand-in tokenizer: a different token per character, and two for every a, e and o, so
    every prompt has another length (and another number of blocks) than with CharTokenizer."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        ids = super().apply_chat_template(messages, add_generation_prompt)
        return [t for i in ids for t in ((i + 7,) * (2 if chr((i - 3) % 40000) in "aeo" else 1))]


class PairTokenizer(CharTokenizer):
    """A third: every character twice, and a shorter system line, so lengths differ again."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        ids = super().apply_chat_template(messages, add_generation_prompt)
        return [t + 11 for i in ids[5:] for t in (i, i)]


def with_wall_times(rec, base: float, slope: float):
    """Give a scripted run deterministic step times (a real run measures them): the two renderings
    then differ in every measured time, not by chance."""
    rec.wall_s = [base + slope * (i % 7) for i in range(len(rec.wall_s))]
    return rec


# (tokenizer, base step time, its spread): the three renderings of each real-model lesson
TOKENIZERS = [(CharTokenizer(), 0.2, 0.01), (ShiftTokenizer(), 0.3, 0.02), (PairTokenizer(), 0.45, 0.015)]


# ---------------------------------------------------------------------------- scripted lessons
def test_reserve_or_page_narration_is_read_off_the_run():
    lesson = reserve_or_page
    runs = [lesson.guided_runs()] + [scripted_pair(build_workload(lesson.GUIDE_WORKLOAD, seed=seed),
                                                   pool_slots=lesson.GUIDE_POOL, block_size=block)
                                     for seed, block in ((1, 8), (2, 32))]
    allowed = settings_of(lesson, *(r[1].config for r in runs), workload=build_workload(lesson.GUIDE_WORKLOAD))
    check("reserve_or_page", *(step_texts(lesson.guide_steps(r)) for r in runs), allowed=allowed)


def test_reserve_or_page_step_counts_agree():
    """The paged side's last step and its number of steps are said as what they are (418 is the
    last step of 419)."""
    runs = reserve_or_page.guided_runs()
    paged_end = runs[1].num_steps - 1
    texts = step_texts(reserve_or_page.guide_steps(runs))
    last = next(t for t in texts if "Same work" in t)
    assert f"at step {paged_end}, its last: {paged_end + 1:,} steps" in last
    assert f"against the paged side's {paged_end + 1:,}" in last


@pytest.mark.parametrize("lesson", [reserve_or_page, ops], ids=["reserve_or_page", "ops"])
def test_a_narration_that_opens_on_a_step_shows_that_step(lesson):
    """"Step N:" in a narration is the engine's step N, the one its figure shows (the slider's
    "Step"); the guide's own place is a part ("Part 3 of 7", ui/guide.py), so that a class never
    reads "Step 3 of 7" above "Step 1: ..." (issue 21's numbers that contradict each other)."""
    opened = 0
    for g in lesson.guide_steps(lesson.guided_runs()):
        m = re.match(r"Step (\d+)[:,]", g.narration)
        if m:
            opened += 1
            assert g.show.get("step") == int(m.group(1)), (g.title, g.show)
    assert opened


def test_ops_narration_is_read_off_the_run():
    runs = [ops.guided_runs()] + [scripted_pair(build_workload(ops.GUIDE_WORKLOAD, seed=seed), pool_slots=pool,
                                                block_size=ops.GUIDE_BLOCK) for seed, pool in ((1, 1792), (2, 1536))]
    allowed = settings_of(ops, *(r[1].config for r in runs), workload=build_workload(ops.GUIDE_WORKLOAD))
    check("ops", *(step_texts(ops.guide_steps(r)) for r in runs), allowed=allowed)


def test_ops_thrashing_step_answers_its_question():
    runs = ops.guided_runs()
    text = next(s.narration for s in ops.guide_steps(runs) if s.title == "Thrashing?")
    assert re.search(r"thrashing\? (Yes|No)\b", text), text


def test_block_size_narration_is_read_off_the_sweep():
    """Three sweeps over workloads of different lengths. What the lesson's fixed parts compute (the
    preamble's whole blocks at each block size, Llama 3 70B's bytes per token) is computed here too,
    from the lesson's constants, and allowed as such."""
    presets = {p.name: p for p in block_size.STATIC_PRESETS}
    cfg = EngineConfig()
    loads = [block_size.short_chat(0), build_workload("trickle"), build_workload("explainer40")]
    worlds = [step_texts(block_size.guide_steps(block_size.sweep(cfg, w, 0), presets, w)) for w in loads]
    derived = {100.0}  # blocks of 1: every allocated slot holds a token, by construction
    n = block_size.PREAMBLE_TOKENS
    for b in block_size.BLOCK_SIZES:
        derived |= {float(n // b), float(n // b * b), float(n - n // b * b)}
    derived.add(float(len(block_size.preamble_workload().requests)))
    l70 = presets["Llama 3 70B"]
    per_token = 2 * l70.layers * l70.kv_heads * l70.head_dim * 2  # bf16
    mha = l70.heads // l70.kv_heads
    derived |= {float(per_token), per_token / 1024, float(mha), per_token * mha / 1024 / 1024}
    check("block_size", *worlds, allowed=settings_of(block_size, cfg, workload=loads[0]) | derived)


def test_baselines_narration_is_read_off_the_runs():
    """The default requests, and two other slices of the same trace on smaller pools."""
    runs, workload, config = baselines.guided_runs()
    worlds = [(runs, workload)]
    allowed = settings_of(baselines, runs[0].config, workload=workload)
    for start, pool in ((200, workload.pool_slots * 3 // 4), (400, workload.pool_slots // 2)):
        opts = LogOptions(**{**AZURE_CONV_SMALL_OPTIONS, "start": start, "pool_slots": pool})
        other = request_log_workload(AZURE_CONV_LOG, 0, opts, name=f"slice {start}")
        worlds.append((baselines.baseline_runs(other, **{**config, "pool_slots": pool}), other))
        allowed |= settings_of(baselines, worlds[-1][0][0].config, workload=other)
    check("baselines", *(step_texts(baselines.guide_steps(r, w)) for r, w in worlds), allowed=allowed)


# ---------------------------------------------------------------------------- real-model lessons (scripted here)
class StopSource(ScriptedSource):
    """A scripted source whose answers end (eos) at a given length per request, as a real model's do."""

    eos_token_id = 2

    def __init__(self, lengths: dict[str, int]):
        super().__init__()
        self.lengths = lengths

    def execute(self, batch):
        out = super().execute(batch)
        for w in batch.seqs:
            if w.num_samples and w.num_output_tokens + 1 >= self.lengths.get(w.request_id, 1 << 30):
                out[w.seq_id] = [2] * w.num_samples
        return out


def test_live_engine_narration_is_read_off_the_run():
    lengths = [{"q0": 3, "q1": 12, "q2": 16}, {"q0": 14, "q1": 16, "q2": 15}, {"q0": 9, "q1": 6, "q2": 14}]
    recs = [with_wall_times(live_engine.guide_run(lambda c, recording=None, n=n: Engine(c, StopSource(n), recording=recording),
                                                  tok, live_engine.GUIDE_CONFIG),
                            base, slope) for (tok, base, slope), n in zip(TOKENIZERS, lengths)]
    check("live_engine", *(step_texts(live_engine.guide_steps(r)) for r in recs),
          allowed=settings_of(live_engine, live_engine.GUIDE_CONFIG))


LIVE_LENGTHS = [None, {"q0": 3, "q1": 12, "q2": 16}, {"q0": 14, "q1": 16, "q2": 15}, {"q0": 9, "q1": 6, "q2": 14}]


@pytest.mark.parametrize("lengths", LIVE_LENGTHS)
def test_live_engine_guide_never_goes_back_in_time(lengths):
    """Each guide step shows a step at or after the one before it showed, a prediction's reveal
    included (a finished request is never "about to finish" later)."""
    rec = live_engine.guide_run(lambda c, recording=None: Engine(c, StopSource(lengths or {}), recording=recording),
                                CharTokenizer(), live_engine.GUIDE_CONFIG)
    seen = 0
    for s in live_engine.guide_steps(rec):
        assert s.show["step"] >= seen, (s.title, s.show["step"], seen)
        seen = max(s.show["step"], s.reveal.get("step", 0))


PREFIX_CONFIG = EngineConfig(block_size=16, pool_slots=32768)  # the stand-in tokenizers make long prompts


def test_prefix_sharing_narration_and_takeaways_are_read_off_the_run():
    recs = [with_wall_times(prefix_sharing.prefix_sharing_run(make_scripted, tok, PREFIX_CONFIG), base, slope)
            for tok, base, slope in TOKENIZERS]
    check("prefix_sharing", *(step_texts(prefix_sharing.guide_steps(r)) + [prefix_sharing.takeaways(r)] for r in recs),
          allowed=settings_of(prefix_sharing, PREFIX_CONFIG))
    a = recs[0]
    # one measurement, one number: the take-away and the guide say the same common prefix and share
    common, (_, skipped) = prefix_sharing.common_prefix(a), a.prefill_tokens("B")
    whole = next(s.narration for s in prefix_sharing.guide_steps(a) if s.title == "Only whole blocks are shared")
    assert f"first {common} tokens" in whole and f"only {skipped} =" in whole
    assert f"{common}-token common prefix" in prefix_sharing.takeaways(a) and f"shares {skipped} tokens" in prefix_sharing.takeaways(a)


def _pressure(tokenizer, rates: costs.Rates, base: float, slope: float, pool: int = 384, params: int = 134_515_008):
    cfg = {m: EngineConfig(block_size=16, pool_slots=pool, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    recs = under_pressure.pressure_pair(make_scripted, tokenizer, cfg["swap"], cfg["recompute"])
    for i, rec in enumerate(recs.values()):
        with_wall_times(rec, base * (1 + i), slope)
    model = under_pressure.cost_model(recs, costs.flops_per_token(params), rates)
    return under_pressure.PressureView(recs, str, model), cfg["swap"]


def test_under_pressure_narration_is_read_off_the_runs():
    rates = [costs.Rates(5e9, 5e10, 5, 2), costs.Rates(7e9, 3e10, 5, 2), costs.Rates(3e9, 8e10, 5, 2)]
    views = [_pressure(tok, r, base / 4, slope / 3, pool, params) for (tok, base, slope), r, pool, params
             in zip(TOKENIZERS, rates, (384, 256, 512), (134_515_008, 360_000_000, 494_000_000))]
    spike = len(under_pressure.PRESSURE_QUESTIONS) - under_pressure.PRESSURE_FIRST  # requests arriving at the spike
    check("under_pressure", *(step_texts(v.guide_steps()) for v, _ in views),
          allowed=set.union(*(settings_of(under_pressure, cfg) for _, cfg in views)) | {float(spike)})


def test_under_pressure_token_counts_add_up_and_times_say_what_they_measure():
    view, _ = _pressure(CharTokenizer(), costs.Rates(5e9, 5e10, 5, 2), 0.05, 0.003)
    c = under_pressure.costs(view.recs["recompute"])
    assert c["tokens needed again"] == c["tokens recomputed"] + c["tokens from the cache"]
    assert c["tokens needed again"] >= c["tokens lost"]
    why = next(s.predict.why for s in view.guide_steps() if s.predict and s.predict.key == "pressure_recomputed")
    assert (f"Of the {c['tokens needed again']} tokens needed again ({c['tokens lost']} evicted + "
            f"{c['tokens needed again'] - c['tokens lost']} sampled but not yet written), {c['tokens from the cache']} "
            f"came back from the prefix cache and {c['tokens recomputed']} were prefilled again") in why
    bill = next(s.predict.why for s in view.guide_steps() if s.predict and s.predict.key == "pressure_cheaper")
    assert "Modelled cost of the preemption work alone" in bill
    assert "Measured wall time over the whole run" in bill
    s, r = under_pressure.costs(view.recs["swap"]), c
    assert f"swap {s['total s']:.1f} s in {s['steps']} steps, recompute {r['total s']:.1f} s in {r['steps']} steps" in bill


@pytest.mark.parametrize("page", ["pages/under_pressure.py"])
def test_intro_does_not_give_away_the_victim(page):
    """The page's intro names no rule for the victim: the guide asks the student to predict it."""
    source = open(page, encoding="utf-8").read()
    assert "most recently admitted" not in source and "most\n" not in source
