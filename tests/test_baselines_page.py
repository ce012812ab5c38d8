"""The baselines page: Azure's production requests on Orca Max, Pow2, Oracle and paged blocks, with the
memory-waste breakdown measured on each and the paper's token shares beside it."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig, setting_spec
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.waste import CLASSES, measure_run
from pagedkv_core.workloads.scenarios import build_workload
from tests.apptest import figure, open_page, plotly_array
from ui.lessons.baselines import ALLOCATORS, PAPER_TOKEN_SHARE
from ui.pool_cells import cell_codes, figure_cells, pool_cells
from ui.runs.model import BASELINE_LABELS

WORKLOAD = "azure-conv-small"


@pytest.fixture(scope="module")
def page():
    """The page after both predictions are answered (the breakdown is drawn only then)."""
    at = open_page("pages/baselines.py")
    assert not at.error, [e.value for e in at.error]
    assert not [c for c in at.get("plotly_chart") if "base_waste" in c.proto.id]  # nothing given away yet
    at.radio(key="predict_base_base_worst").set_value("Orca Max").run()
    at.radio(key="predict_base_base_paged_share").set_value("90% or more").run()
    assert not at.exception
    return at


def test_predictions_come_first_and_reveal_the_measured_answers(page):
    shown = " ".join(s.value for s in page.success)
    assert "Right." in shown and "Orca Max holds tokens in" in shown
    assert page.get("plotly_chart") and any("base_waste" in c.proto.id for c in page.get("plotly_chart"))


def engine(allocator: str, recording=None) -> Engine:
    w = build_workload(WORKLOAD)
    e = Engine(EngineConfig(allocator=allocator, pool_slots=w.pool_slots, block_size=16), ScriptedSource(),
               recording=recording)
    w.submit(e)
    return e


def workload_caption(at) -> str:
    return next(c.value for c in at.caption if c.value.startswith(("Default requests", "The sidebar's workload")))


def bars(at) -> dict[str, dict[str, float]]:
    """allocator label -> class -> share of the pool, read from the stacked bars."""
    out: dict[str, dict[str, float]] = {}
    for trace in figure(at, "base_waste")["data"]:
        for label, x in zip(trace["y"], plotly_array(trace["x"]).tolist()):
            out.setdefault(label, {})[trace["name"]] = x
    return out


def test_four_allocators_on_the_default_trace(page):
    assert ALLOCATORS == ("contiguous", "contiguous-pow2", "contiguous-oracle", "paged")
    for allocator in ALLOCATORS:
        figure(page, f"base_heat_{allocator}")
    assert "Azure" in workload_caption(page) and "200 requests" in workload_caption(page)


def test_each_bar_sums_to_one_and_equals_the_measured_breakdown(page):
    shown = bars(page)
    assert list(shown) == [BASELINE_LABELS[a] for a in ALLOCATORS]
    for allocator in ALLOCATORS:
        row = shown[BASELINE_LABELS[allocator]]
        assert list(row) == list(CLASSES)
        assert sum(row.values()) == pytest.approx(1.0)
        _, want = measure_run(engine(allocator))
        assert row == pytest.approx({c: want[c] for c in CLASSES}, abs=1e-9), allocator


def test_token_shares_order_as_in_the_paper(page):
    measured, paper = figure(page, "base_token_share")["data"]
    m = plotly_array(measured["x"]).tolist()
    assert m == sorted(m) and len(set(m)) == 4  # Orca Max < Pow2 < Oracle < paged
    assert m[-1] > 0.9
    assert plotly_array(paper["x"]).tolist() == [PAPER_TOKEN_SHARE[a] for a in ALLOCATORS] == [0.204, 0.268, 0.382, 0.963]


def test_the_table_gives_steps_and_running_per_allocator(page):
    rows = page.dataframe[0].value
    assert list(rows["allocator"]) == [BASELINE_LABELS[a] for a in ALLOCATORS]
    for i, allocator in enumerate(ALLOCATORS):
        rec = Recording()
        e = engine(allocator, rec)
        e.run(snapshot=False)
        running = rec.metrics_series("num_running")
        assert rows["steps to finish"][i] == f"{rec.num_steps:,}"
        assert rows["peak running"][i] == running.max()
        assert rows["mean running"][i] == round(float(running.mean()), 1)
    assert rows["peak running"].tolist() == sorted(rows["peak running"].tolist())  # paging runs the most at once
    text = " ".join(m.value for m in page.markdown)
    assert "OPT-13B" in text and "ShareGPT" in text and "CC BY 4.0" in text


def test_one_slider_moves_all_four_pools(page):
    page.slider(key="base_step").set_value(120).run()
    assert not page.exception
    for allocator in ALLOCATORS:
        e = engine(allocator)
        for _ in range(120):
            e.step(snapshot=False)
        snap = e.step()[1]
        spec = figure(page, f"base_heat_{allocator}")
        assert "step 120" in spec["layout"]["title"]["text"]
        codes, _ = figure_cells(spec)
        want = cell_codes(pool_cells(snap.slot_state, snap.slot_owner, max(1, snap.block_size)))
        assert np.array_equal(codes, want), allocator


def test_the_sidebar_workload_replaces_the_default():
    at = open_page("pages/baselines.py", workload="burst")
    assert not at.exception and not at.error
    assert workload_caption(at).startswith("The sidebar's workload: ")
    assert f"pool {setting_spec('pool_slots').default:,} slots" in workload_caption(at)
