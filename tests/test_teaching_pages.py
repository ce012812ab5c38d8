"""The teaching pages under streamlit.testing: the facts each lesson teaches are checked on what the
page draws, and the real-model lessons run SmolLM2 on the CPU with small token counts.

Real-model runs are cached per process (st.cache_resource), so each lesson's run happens once here."""
import math

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from tests.apptest import figure, open_page, plotly_array, walk_guide
from ui.pool_cells import figure_cells

BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def metric(at, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r} in {[m.label for m in at.metric]}")


def metrics(at, label: str) -> list[str]:
    return [m.value for m in at.metric if m.label == label]


def curve(at, key: str, name: str | None = None) -> list[float]:
    data = figure(at, key)["data"]
    trace = data[0] if name is None else next(t for t in data if t.get("name") == name)
    return [float(v) for v in plotly_array(trace["y"]).tolist()]


# ---------------------------------------------------------------------------- home
def test_home_links_the_lessons_in_teaching_order():
    """Lesson cards come right under the title (something to click above the fold), in teaching
    order, each with a link to the page, its guide and its slides."""
    from ui.pages_registry import lessons

    at = open_page("pages/home.py")
    titles = [m.value for m in at.markdown if m.value.startswith("**") and m.value[2:3].isdigit()]
    want = ["Reserve or page", "Live engine", "Prefix sharing", "Under pressure", "Block size", "Ops dashboard",
            "Real traffic"]
    positions = [next(i for i, t in enumerate(titles) if w in t) for w in want]
    assert positions == sorted(positions), titles
    first_prose = next(i for i, m in enumerate(at.markdown) if "Every token a language model" in m.value)
    assert first_prose > max(i for i, m in enumerate(at.markdown) if m.value in titles)  # the cards come first
    links = [(p.proto.label, p.proto.page) for p in at.get("page_link")]
    for page in lessons():
        for label in ("Open", "Guide", "Slides"):
            assert any(lab == label and page.url_path in target for lab, target in links), (page.url_path, label, links)


# ---------------------------------------------------------------------------- block size (scripted)
def test_block_size_sweep_utilization_falls_on_short_requests():
    at = open_page("pages/block_size.py")
    util = curve(at, "bsize_util")
    assert len(util) == len(BLOCK_SIZES)
    assert all(a >= b for a, b in zip(util, util[1:])), util  # falls as blocks grow
    assert util[0] == pytest.approx(1.0) and util[-1] < 0.6
    waste = curve(at, "bsize_waste", "measured")
    assert waste[0] == 0.0
    for b, w in zip(BLOCK_SIZES[1:6], waste[1:6]):  # about half a block while blocks are small
        assert abs(w - (b - 1) / 2) <= 0.25 * b, (b, w)
    entries = curve(at, "bsize_entries")
    assert all(a > b for a, b in zip(entries, entries[1:])), entries
    reused = curve(at, "bsize_prefix")
    assert reused == [600 // b * b for b in BLOCK_SIZES]  # whole blocks only


def test_block_size_sweep_matches_the_engine():
    from ui.lessons.block_size import short_chat

    at = open_page("pages/block_size.py", block_size="32")
    engine = Engine(EngineConfig(block_size=32), ScriptedSource())
    short_chat(0).submit(engine)
    utils = []
    while engine.has_unfinished():
        m = engine.step()[1].metrics
        if m.allocated_slots:
            utils.append(m.token_utilization)
    assert curve(at, "bsize_util")[BLOCK_SIZES.index(32)] == pytest.approx(np.mean(utils))


def test_pool_calculator_llama3_70b_and_a_bad_budget():
    at = open_page("pages/block_size.py")
    at.selectbox(key="bsize_preset").set_value("Llama 3 70B").run()
    assert not at.exception
    assert metric(at, "bytes per token") == "320.0 KiB"  # 2 x 80 x 8 x 128 x 2 B
    blocks = int(metric(at, "KV blocks in the pool").replace(",", ""))
    want = int((160 * 2**30 - 70.6e9 * 2 - 8 * 2**30) // (327_680 * 16))
    assert blocks == want
    assert metric(at, "sequences at once") == f"{int(want // math.ceil(2048 / 16)):,}"
    at.number_input(key="bsize_budget_gib").set_value(80.0).run()
    assert not at.exception
    assert any("No room for a KV cache" in e.value for e in at.error), [e.value for e in at.error]


def test_pool_calculator_smollm2_comes_from_the_loaded_config():
    at = open_page("pages/block_size.py")
    assert "loaded" in at.selectbox(key="bsize_preset").value
    assert metric(at, "bytes per token") == "45.0 KiB"  # 2 x 30 x 3 x 64 x 4 B = 46,080 B
    assert any("46,080 B" in m.value for m in at.markdown)


def test_block_size_guide_steps_render():
    at = open_page("pages/block_size.py")
    seen = []

    def check(at, n):
        spec = figure(at, "bsize_util")
        seen.append(spec["layout"]["shapes"][0]["x0"])  # the highlighted block size

    n = walk_guide(at, "bsize", check)
    assert n >= 6 and len(set(seen)) >= 3


# ---------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_prefix_sharing_facts_are_measured_on_the_real_model():
    at = open_page("pages/prefix_sharing.py")
    seen = {}
    b_step = {}

    def check(at, n):
        seen[n] = {k: metric(at, k) for k in ("shared blocks (ref > 1)", "highest ref count", "copy-on-write so far",
                                              "tokens from the cache")}
        if n == 4:  # B reuses A's blocks
            z = plotly_array(figure(at, "prefix_tables")["data"][0]["z"]).astype(float)
            assert np.nanmax(z) >= 2  # shared cells in the block tables
            bars = figure(at, "prefix_prefill")["data"]
            computed = next(t for t in bars if t["name"].startswith("computed"))
            skipped = next(t for t in bars if t["name"].startswith("skipped"))
            labels = list(skipped["y"])
            b = next(i for i, lab in enumerate(labels) if lab.startswith("B"))
            assert plotly_array(skipped["x"])[b] > 0  # B skipped prefill tokens
            b_step["computed"] = int(plotly_array(computed["x"])[b])
            ttft = plotly_array(figure(at, "prefix_ttft")["data"][0]["x"])
            assert len(ttft) == 2 and all(t > 0 for t in ttft)

    n = walk_guide(at, "prefix", check)
    assert n == 11
    assert int(seen[1]["shared blocks (ref > 1)"]) == 0
    assert int(seen[4]["shared blocks (ref > 1)"]) > 0 and int(seen[4]["highest ref count"]) > 1
    assert int(seen[4]["tokens from the cache"].replace(",", "")) > 0
    assert int(seen[7]["copy-on-write so far"]) >= 1
    assert int(seen[11]["tokens from the cache"].replace(",", "")) > int(
        seen[4]["tokens from the cache"].replace(",", ""))  # D hit the cache after everyone left
    # predict then reveal: B's computed prompt tokens, as the bars measured them
    at.session_state["prefix_guide_step"] = 2
    at.run()
    at.number_input(key="predict_prefix_prefix_b_computed").set_value(0).run()
    assert any(f"Measured in this run: **{b_step['computed']:,} tokens**" in w.value for w in at.warning), \
        [w.value for w in at.warning]


@pytest.mark.slow
def test_under_pressure_both_modes_preempt_with_identical_outputs():
    at = open_page("pages/under_pressure.py")
    n = walk_guide(at, "pressure")
    assert n >= 6
    pre = [int(v) for v in metrics(at, "preemptions")]
    assert len(pre) == 2 and all(p > 0 for p in pre), pre
    assert metric(at, "moved to host") != "0 B"
    assert int(metric(at, "tokens evicted")) > 0
    assert any("exactly the same token ids" in s.value for s in at.success)
    table = at.dataframe[-1].value
    assert (table["same token ids in both runs"] == "✓ identical").all()
    # the verdict, with its numbers: the modelled preemption work, and the measured whole run, each said as such
    assert any("Modelled cost of the preemption work alone" in s.value and "Measured wall time over the whole run"
               in s.value for s in at.success)
    assert any("modelled cost = work / rate" in m.value and "GFLOP" in m.value for m in at.markdown)
    # predict then reveal: the victim is the most recently admitted running sequence
    at.session_state["pressure_guide_step"] = 2
    at.run()
    radio = at.radio(key="predict_pressure_pressure_victim")
    radio.set_value(radio.options[0]).run()
    shown = [w.value for w in list(at.success) + list(at.warning) if "Measured in this run" in w.value]
    assert shown and f"**{radio.options[-1]}**" in shown[0], shown  # listed in admission order: the last one
@pytest.mark.slow
def test_live_engine_guide_and_submitting_prompts():
    at = open_page("pages/live_engine.py")
    n = walk_guide(at, "live")
    assert n >= 6
    at.toggle(key="live_guide").set_value(False).run()
    # a bad input: nothing to submit
    at.button(key="FormSubmitter:live_form-Submit").click().run()
    assert any("Nothing to submit" in e.value for e in at.error), [e.value for e in at.error]
    # a prompt longer than the pool is rejected with its reason, a normal one runs
    at.multiselect(key="live_picks").set_value(["What is the capital of France?"])
    at.text_area(key="live_own").set_value("word " * 2100)
    at.number_input(key="live_max_tokens").set_value(8)
    at.button(key="FormSubmitter:live_form-Submit").click().run()
    assert not at.exception, at.exception
    for _ in range(3):
        at.button(key="live_fwd").click().run()
        assert not at.exception, at.exception
    assert any("r1 was rejected" in e.value for e in at.error), [e.value for e in at.error]
    z = figure_cells(figure(at, "live_heat"))[0]
    assert (z >= 4).sum() > 30  # the prompt's tokens fill slots
    figure(at, "live_arrows")
    assert any("Paris" in m.value or "capital" in m.value for m in at.markdown)


# ---------------------------------------------------------------------------- the recordings (no model)
class CharTokenizer:
    """A stand-in tokenizer for the lesson scenarios: one token per character."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return [3 + ord(c) % 40000 for c in text]


def test_recordings_read_the_lesson_facts_back_from_the_engine():
    from ui.lessons.prefix_sharing import prefix_sharing_run
    from ui.lessons.under_pressure import pressure_run

    def make(config, recording=None):
        return Engine(config, ScriptedSource(), recording=recording)

    rec = prefix_sharing_run(make, CharTokenizer(), EngineConfig(block_size=16, pool_slots=16384))
    assert rec.done and rec.engine is None  # finished, pool released
    comp_a, skip_a = rec.prefill_tokens("A")
    comp_b, skip_b = rec.prefill_tokens("B")
    assert skip_a == 0 and comp_a == len(rec.requests["A"].prompt_ids)
    assert skip_b > 0 and skip_b % 16 == 0 and comp_b + skip_b == len(rec.requests["B"].prompt_ids)
    assert rec.ttft_s("A") == pytest.approx(rec.wall_s[0])
    assert rec.first_token_step("D") == rec.requests["D"].arrival_step > rec.finish_step("B")
    assert rec.prefill_tokens("D")[1] >= skip_b  # the preamble outlived every request
    assert len(rec.output_ids("C")) == 3

    press = {m: pressure_run(make, CharTokenizer(), EngineConfig(block_size=16, pool_slots=384, preemption=m, watermark=0.1))
             for m in ("swap", "recompute")}
    for mode, r in press.items():
        pre = r.preemptions()
        assert pre, mode
        for p in pre:
            assert p["mode"] == mode and p["victim"] == p["running_before"][-1]  # the most recently admitted
        assert r.preempted_tokens() > 0
    assert press["recompute"].recomputed_tokens() > 0 and press["swap"].recomputed_tokens() == 0
    assert all(press["swap"].output_ids(rid) == press["recompute"].output_ids(rid) for rid in press["swap"].requests)
