"""The app at production scale: Reserve or page at 262,144 slots keeps its runs within a stated memory
budget and sends bounded figures; the level-of-detail heatmap counts every slot exactly; zooming draws a
window slot by slot; bad uploads are one-line errors; budgets refuse runs up front and stop runs that
outgrow them; a calculator preset becomes the sidebar's pool; the contiguous policy comes from the URL."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES
from pagedkv_core.config import EngineConfig, setting_spec
from pagedkv_core.engine import Engine
from pagedkv_core.sizing.memory import BudgetError, process_budget
from pagedkv_core.record.recording import pool_bytes
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.trace_file import load_recording, write_recording
from pagedkv_core.workloads.scenarios import AZURE_CONV_LOG, build_workload, workload_from_bytes
from tests.apptest import figure, open_page, uploader
from ui import settings
from ui.models import EngineFactory
from ui.pool_cells import MAX_CELLS, MAX_GROUPS, STATE_NAMES, cell_codes, figure_cells, pool_cells
from ui.runs.budgets import RECORDING_STATES, process_runs, run_bytes_estimate
from ui.runs.model import CACHED_SNAPSHOTS, engine_bytes
from ui.runs.scripted import named_workload, play_scripted, scripted_pair

POOL = 262_144
PAYLOAD_LIMIT = 300_000  # bytes of one figure's JSON, as Streamlit sends it
# The budget this page stays within at 262,144 slots (explainer40, 338 steps a side): per run, its
# recording (about 11 MB: a 2.4 MB keyframe every 256 steps plus what each step changed) and the two
# snapshots it keeps rebuilt (2.4 MB each). Stated: 40 MiB for the pair's recordings, 64 MiB in all.
RECORDING_BUDGET = 40 << 20
PAIR_BUDGET = 64 << 20


def defaults(**over) -> dict:
    return {**{k: setting_spec(k).default for k in settings.ENGINE_KEYS}, **over}


def engine_snapshot(allocator: str, step: int, workload: str = "explainer40", **cfg):
    """The engine's own full snapshot at ``step`` (scripted tokens, no recording)."""
    engine = Engine(EngineConfig(allocator=allocator, **defaults(**cfg)), ScriptedSource())
    build_workload(workload).submit(engine)
    for _ in range(step):
        engine.step(snapshot=False)
    return engine.step()[1]


def caption_counts(text: str) -> dict[str, int]:
    """{"free": 235601, "filled": 2463, ...} from a pool caption."""
    return {name: int(n.replace(",", "")) for name, n in re.findall(r"\b([a-z]+) ([\d,]+)", text.split(": ", 1)[1])}


def bincount(states: np.ndarray) -> dict[str, int]:
    counts = np.bincount(states, minlength=len(STATE_NAMES))
    return {STATE_NAMES[s]: int(n) for s, n in enumerate(counts) if n}


def pool_captions(at) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith(("All ", "Slots "))]


# ---------------------------------------------------------------------------- Reserve or page at 262,144 slots
@pytest.fixture(scope="module")
def big_page():
    at = open_page("pages/reserve_or_page.py", pool_slots=str(POOL))
    assert not at.error, [e.value for e in at.error]
    return at


def test_runs_stay_within_the_stated_budget(big_page):
    runs = scripted_pair(named_workload("explainer40", 0), "contiguous", **defaults(pool_slots=POOL))  # the page's runs
    assert [r.allocator for r in runs] == ["contiguous", "paged"] and all(r.done for r in runs)
    assert all(r.recording.at(0, copy=False).num_slots == POOL for r in runs)
    recorded = sum(r.recording.nbytes for r in runs)
    assert recorded < RECORDING_BUDGET, recorded
    assert sum(r.nbytes for r in runs) < PAIR_BUDGET
    # a full snapshot per step would hold 2.4 MB x 338 steps per run
    full = sum(r.num_steps * pool_bytes(POOL, r.recording.scalars["num_blocks"]) for r in runs)
    assert recorded < full / 20
    assert process_runs().used <= process_budget()


def test_figures_stay_under_300_kb(big_page):
    sizes = {c.proto.id.rsplit("-", 1)[-1]: len(c.proto.spec) for c in big_page.get("plotly_chart")}
    assert {"rop_heat_contiguous", "rop_heat_paged"} <= set(sizes)
    assert max(sizes.values()) < PAYLOAD_LIMIT, sizes


def test_level_of_detail_counts_equal_the_snapshot(big_page):
    big_page.slider(key="rop_step").set_value(100).run()
    assert not big_page.exception
    captions = pool_captions(big_page)
    assert len(captions) == 2
    for allocator, caption in zip(("contiguous", "paged"), captions):
        snap = engine_snapshot(allocator, 100, pool_slots=POOL)
        assert caption.startswith(f"All {POOL:,} slots")
        assert caption_counts(caption) == bincount(snap.slot_state), allocator
        # the drawn cells are the engine's state, aggregated: at most MAX_GROUPS cells of whole blocks
        codes, _ = figure_cells(figure(big_page, f"rop_heat_{allocator}"))
        want = cell_codes(pool_cells(snap.slot_state, snap.slot_owner, max(1, snap.block_size)))
        assert len(want) <= MAX_GROUPS and np.array_equal(codes, want), allocator


def test_zoom_draws_a_window_slot_by_slot(big_page):
    big_page.slider(key="rop_step").set_value(40).run()
    window = (16_384, 32_768)
    big_page.selectbox(key="rop_zoom").set_value(window).run()
    assert not big_page.exception
    for allocator in ("contiguous", "paged"):
        snap = engine_snapshot(allocator, 40, pool_slots=POOL)
        spec = figure(big_page, f"rop_heat_{allocator}")
        codes, _ = figure_cells(spec)
        want = cell_codes(pool_cells(snap.slot_state, snap.slot_owner, max(1, snap.block_size), window=window))
        assert len(codes) == MAX_CELLS and np.array_equal(codes, want), allocator
    for caption, allocator in zip(pool_captions(big_page), ("contiguous", "paged")):
        snap = engine_snapshot(allocator, 40, pool_slots=POOL)
        assert caption.startswith("Slots 16,384–32,767 of 262,144")
        assert caption_counts(caption) == bincount(snap.slot_state[window[0]:window[1]])
    sizes = [len(c.proto.spec) for c in big_page.get("plotly_chart")]
    assert max(sizes) < PAYLOAD_LIMIT
    big_page.selectbox(key="rop_zoom").set_value(None).run()


# ---------------------------------------------------------------------------- uploads
def _v2_trace(tmp_path) -> bytes:
    run = play_scripted(EngineConfig(allocator="paged", pool_slots=2048), build_workload("burst"), "paged")
    return write_recording(tmp_path / "t.jsonl", run.recording, {}, version=2).read_bytes()


@pytest.mark.parametrize("key, name, data, words", [
    ("trace_upload", "bad.jsonl", b'{"hello": 1}\n', "Cannot replay bad.jsonl"),
    ("trace_upload", "cut.jsonl", None, "Cannot replay cut.jsonl"),
    ("trace_upload", "flip.trace", "v4", "Cannot replay flip.trace"),
    ("workload_upload", "bad.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,12,5\n0.5,twelve,5\n", "row 2"),
    ("workload_upload", "cols.csv", b"time,prompt,answer\n0,1,2\n", "cols.csv"),
    ("workload_upload", "bad.json", b"[{not json", "bad.json"),
])
def test_a_bad_upload_shows_st_error_not_an_exception(tmp_path, key, name, data, words):
    if data is None:  # a version-2 trace with one step record corrupted
        lines = _v2_trace(tmp_path).split(b"\n")
        lines[3] = lines[3].replace(b'"data":"', b'"data":"!!')
        data = b"\n".join(lines)
    elif data == "v4":  # a version-4 trace with a byte of its third frame's deflated piece flipped
        run = play_scripted(EngineConfig(allocator="paged", pool_slots=2048), build_workload("burst"), "paged")
        from pagedkv_core.record.trace_frames import join_frames, split_frames

        head, frames = split_frames(write_recording(tmp_path / "t.trace", run.recording, {}).read_bytes())
        kind, payload = frames[2]
        frames[2] = (kind, payload[:8] + bytes([payload[8] ^ 0xFF]) + payload[9:])
        data = join_frames(head, frames)
    at = open_page("pages/reserve_or_page.py")
    uploader(at, key).set_value((name, data, "text/plain")).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert errors and any(words in e for e in errors), errors
    assert all("\n" not in e for e in errors)


def test_a_trace_csv_becomes_the_workload_with_its_row_and_time_options():
    head = b"".join(AZURE_CONV_LOG.read_bytes().splitlines(keepends=True)[:61])  # header + 60 requests
    at = open_page("pages/reserve_or_page.py")
    uploader(at, "workload_upload").set_value(("azure60.csv", head, "text/csv")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.number_input(key="csv_start").set_value(10).run()
    at.number_input(key="csv_count").set_value(20).run()
    at.number_input(key="csv_seconds_per_step").set_value(0.5).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    workload = at.session_state["_workload_upload"][1]
    want = workload_from_bytes(head, "azure60.csv", start=10, count=20, seconds_per_step=0.5, rate=1.0)
    assert workload == want and len(workload.requests) == 20 and workload.requests[0].id == "r11"
    assert "1 step = 500 ms" in workload.description
    figure(at, "rop_heat_paged")


def test_a_downloaded_trace_is_the_recording_and_the_requests(tmp_path):
    workload = build_workload("burst")
    run = play_scripted(EngineConfig(allocator="paged", pool_slots=2048, block_size=8), workload, "paged")
    path = tmp_path / "download.jsonl"
    path.write_bytes(run.trace_bytes())
    header, recording = load_recording(path)
    assert recording.num_steps == run.num_steps
    for step in (0, 25, run.num_steps - 1):
        assert recording.at(step) == run.at(step)
    assert [r["prompt"] for r in header["requests"]] == [list(r.prompt) for r in workload.requests]
    assert header["config"] == run.config.to_dict()


# ---------------------------------------------------------------------------- budgets
def test_a_run_over_the_session_budget_is_refused_with_the_numbers(monkeypatch):
    monkeypatch.setenv("PAGEDKV_SESSION_BUDGET", "16MiB")
    at = open_page("pages/reserve_or_page.py", pool_slots=str(1 << 20))
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any("1,048,576-slot" in e and "over the memory budget of 8.0 MiB" in e for e in errors), errors


def test_a_recording_that_outgrows_its_budget_is_stopped_and_says_so():
    config = EngineConfig(allocator="paged", pool_slots=POOL, block_size=16)
    workload = named_workload("explainer40", 0)
    copy = pool_bytes(POOL, config.num_blocks)
    assert run_bytes_estimate(config) == engine_bytes(config) + (RECORDING_STATES + CACHED_SNAPSHOTS) * copy
    # While it runs, a run holds the engine, the recording's head and keyframes, and (counted up front)
    # the snapshots it will keep rebuilt: under the estimate until its second keyframe, at step K.
    budget = run_bytes_estimate(config) + (256 << 10)
    run = play_scripted(config, workload, "paged", budget=budget)
    assert not run.done and run.num_steps == run.recording.keyframe_every + 1 == 257
    assert "past its share of the memory budget" in run.stopped and f"step {run.num_steps - 1}" in run.stopped
    assert run.nbytes + engine_bytes(config) > budget  # the step that crossed it is kept; then the engine is let go
    with pytest.raises(BudgetError, match=r"262,144-slot .* over the memory budget"):
        play_scripted(config, workload, "paged", budget=run_bytes_estimate(config) - 1)


def test_a_real_model_pool_is_refused_before_it_is_allocated(monkeypatch):
    monkeypatch.setenv("PAGEDKV_SESSION_BUDGET", "64MiB")
    factory = EngineFactory(runner=SimpleNamespace(bytes_per_slot=46_080), tokenizer=None)  # SmolLM2 in fp32
    config = EngineConfig(allocator="paged", pool_slots=4096, block_size=16)
    assert factory.kv_bytes(config) == (4096 + 4096) * 46_080  # device pool + the swap pool's host slots
    assert factory.kv_bytes(EngineConfig(allocator="contiguous", pool_slots=4096)) == 4096 * 46_080
    with pytest.raises(BudgetError, match=r"4,096 slots .* needs 360.0 MiB, over the memory budget of 64.0 MiB"):
        factory(config)


# ---------------------------------------------------------------------------- sidebar
def test_rounded_pool_keeps_whole_blocks_within_bounds():
    assert settings.rounded_pool(500_001, 16) == 500_000
    assert settings.rounded_pool(123_457, 128) == 123_392
    assert settings.rounded_pool(5_000_000, 16) == setting_spec("pool_slots").hi
    assert settings.rounded_pool(3, 16) == 16


def test_a_calculator_pool_becomes_the_sidebars_pool():
    at = open_page("pages/block_size.py")
    at.selectbox(key="bsize_preset").set_value("Qwen2.5-0.5B").run()
    at.number_input(key="bsize_budget_gib").set_value(1.0).run()
    at.number_input(key="bsize_workspace_gib").set_value(0.0).run()
    per_block = 2 * 24 * 2 * 64 * 2 * 16  # Qwen2.5-0.5B in bf16, blocks of 16
    blocks = int((1.0 * 2**30 - 0.494e9 * 2) // per_block)
    at.button(key="bsize_use_pool").click().run()
    assert not at.exception, at.exception
    assert at.session_state["pool_slots"] == blocks * 16
    assert any(f"Pool set to {blocks * 16:,} token slots" in s.value for s in at.success)


def test_the_sidebar_offers_the_three_orca_policies():
    assert list(settings.POLICY_LABELS) == list(CONTIGUOUS_POLICIES) == ["max", "pow2", "oracle"]
    assert settings.BY_KEY["contiguous_policy"].default == "max"


def test_the_contiguous_policy_comes_from_the_url():
    at = open_page("pages/reserve_or_page.py", contiguous_policy="pow2")
    assert at.session_state["contiguous_policy"] == "pow2"
    figure(at, "rop_heat_contiguous-pow2")
    assert any("Orca Pow2" in h.value for h in at.markdown)  # each side's heading (a compact #### line)
    bad = open_page("pages/reserve_or_page.py", contiguous_policy="huge")
    assert any("contiguous_policy" in e.value for e in bad.error)
    figure(bad, "rop_heat_contiguous")
