"""The *Prefix cache on real traffic* lesson under streamlit.testing: the curve it draws is the replay
module's, every guide step renders, its predictions reveal what was measured, presenter mode draws
one figure a slide, and the page is in the navigation and on Home.

The page's window (2,000 requests of the shipped Mooncake trace) runs once per process (cached)."""
import pytest

from pagedkv_core.workloads.hashed_log import MOONCAKE_CONV_LOG, read_hashed_log
from pagedkv_core.workloads.prefix_replay import replay, requests_from_rows
from tests.apptest import figure, open_page, plotly_array, walk_guide
from ui.lessons import prefix_traffic as lesson
from ui.pages_registry import lessons

KEY = lesson.KEY
PAGE = "pages/prefix_traffic.py"


@pytest.fixture(scope="module")
def window_requests():
    w = lesson.GUIDE_WINDOW
    return requests_from_rows(read_hashed_log(MOONCAKE_CONV_LOG, w.start, w.count), lesson.BLOCK_SIZE)


def trace_y(fig: dict, name_part: str) -> list[float]:
    trace = next(t for t in fig["data"] if name_part in t.get("name", ""))
    return [float(v) for v in plotly_array(trace["y"]).tolist()]


def test_the_curve_is_the_replay_modules(window_requests):
    at = open_page(PAGE)
    assert not at.error, [e.value for e in at.error]
    fig = figure(at, f"{KEY}_curve")
    xs = [float(v) for v in plotly_array(next(t for t in fig["data"] if "LRU" in t["name"])["x"]).tolist()]
    assert xs == [b * 512 for b in lesson.CAPACITIES]  # capacities in the log's tokens
    for policy, name in (("lru", "LRU"), ("belady", "Belady")):
        want = [replay(window_requests, lesson.BLOCK_SIZE, b, policy).hit_rate for b in lesson.CAPACITIES]
        assert trace_y(fig, name) == pytest.approx(want, abs=1e-12), policy
    unbounded = replay(window_requests, lesson.BLOCK_SIZE, None, "unbounded").hit_rate
    assert any(f"{unbounded:.0%}" in a["text"] for a in fig["layout"]["annotations"])
    lru, belady = trace_y(fig, "LRU"), trace_y(fig, "Belady")
    assert all(b >= a for a, b in zip(lru, belady)) and max(belady) <= unbounded + 1e-12
    # the engine's point is the recorded run's own hit rate, at the pool it ran with
    engine = trace_y(fig, "engine")
    run = lesson.engine_run(lesson.GUIDE_WINDOW)
    m = run.at(run.num_steps - 1).metrics
    assert engine == pytest.approx([m.prefix_hit_tokens / m.prefix_queried_tokens])
    assert run.config.pool_slots == lesson.POOL_BLOCKS * lesson.BLOCK_SIZE and run.config.block_size == 32


def test_bigger_blocks_share_less(window_requests):
    at = open_page(PAGE)
    fig = figure(at, f"{KEY}_blocks")
    bars = trace_y(fig, "never evicts")
    want = [replay(lesson.coarsened(window_requests, k), k * lesson.BLOCK_SIZE, None, "unbounded").hit_rate
            for k in lesson.GROUPS]
    assert bars == pytest.approx(want, abs=1e-12)
    assert all(a > b for a, b in zip(bars, bars[1:])), bars  # a shared run shorter than a block is never a hit


def test_belady_on_the_engine_beats_lru():
    at = open_page(PAGE)
    lru = at.metric[0].value
    at.radio(key=f"{KEY}_eviction").set_value("belady").run()
    assert not at.exception and not at.error
    belady = at.metric[0].value
    assert at.metric[0].label == "hit rate (engine)"
    assert float(belady.rstrip("%")) >= float(lru.rstrip("%")), (lru, belady)


def test_coarsened_keys_chain_whole_groups():
    from pagedkv_core.workloads.prefix_replay import ReplayRequest

    r = ReplayRequest((10, 11, 12, 13, 14), 5 * 32 - 7)
    assert lesson.coarsened([r], 2) == [ReplayRequest((11, 13, 14), r.num_tokens)]
    assert lesson.coarsened([r], 1) == [r]


def test_shared_prefixes_from_hash_ids():
    from pagedkv_core.workloads.hashed_log import HashedLogRow

    rows = [HashedLogRow(1, 0.0, 1500, 1, (0, 1, 2)), HashedLogRow(2, 1.0, 1100, 1, (0, 1, 3)),
            HashedLogRow(3, 2.0, 600, 1, (0, 4)), HashedLogRow(4, 3.0, 1500, 1, (0, 1, 2))]
    maximal, every = lesson.shared_prefixes(rows)
    assert {(p.hash_id, p.blocks, p.tokens, p.requests, p.first) for p in every} == {
        (0, 1, 512, 4, 0), (1, 2, 1024, 3, 0), (2, 3, 1500, 2, 0)}
    assert [p.hash_id for p in maximal] == [2]  # 0 and 1 are extended by a longer shared prefix


def walk(at, on_step=None) -> int:
    return walk_guide(at, KEY, on_step)


def test_guide_steps_and_predictions_reveal_the_measured_answers():
    at = open_page(PAGE)
    view = lesson.view()
    steps = lesson.guide_steps(view)
    asks = [s.predict for s in steps if s.predict is not None]
    assert len(asks) >= 3
    hit = next(p for p in asks if p.key == "ptraffic_hit_pool")
    assert hit.answer == round(100 * view.engine_hit_rate(), 1)  # read off the run, not typed in
    seen = []

    def on_step(at, n):
        step = steps[n - 1]
        seen.append(step.title)
        if step.predict is None:
            return
        p = step.predict
        if p.is_choice:
            hidden = figure(at, f"{KEY}_{step.show['figure']}")  # drawn without its data until answered
            assert any("Answer the prediction" in a.get("text", "") for a in hidden["layout"].get("annotations", []))
            assert not any("LRU" in t.get("name", "") for t in hidden["data"])
            at.radio(key=f"predict_{KEY}_{p.key}").set_value(p.answer).run()
        else:
            at.number_input(key=f"predict_{KEY}_{p.key}").set_value(p.answer).run()
        assert not at.exception, at.exception
        assert any(s.value.startswith("**Right.**") for s in at.success), [s.value for s in at.success]
        if step.show.get("figure") == "curve":  # the answer reveals the curve
            fig = figure(at, f"{KEY}_curve")
            assert trace_y(fig, "LRU") == pytest.approx(list(view.curve.lru))

    n = walk(at, on_step)
    assert n == len(steps) == len(seen)
    assert any("right this session" in m.value and f"**{len(asks)}** of {len(asks)}" in m.value for m in at.markdown)


def test_presenter_mode_one_figure_a_slide():
    at = open_page(PAGE, present="on", guide_step="7")
    assert not at.exception, at.exception
    assert at.toggle(key=f"{KEY}_present").value and at.toggle(key=f"{KEY}_guide").value
    charts = at.get("plotly_chart")
    assert len(charts) == 1 and f"{KEY}_slide" in charts[0].proto.id
    assert any("Part 7 of" in m.value for m in at.markdown)
    at.button(key=f"{KEY}_guide_next").click().run()
    assert not at.exception and len(at.get("plotly_chart")) == 1
    at = open_page(PAGE, present="on", guide_step="4")  # the pool's slide
    assert not at.exception and len(at.get("plotly_chart")) == 1


def test_in_the_navigation_and_on_home():
    assert [p.path for p in lessons()][-1] == PAGE
    at = open_page("pages/home.py")
    info = lessons()[-1]
    assert any(f"{info.lesson}. {info.title}" in m.value for m in at.markdown)  # its card
    assert sum(info.url_path in p.proto.page or info.path in p.proto.page for p in at.get("page_link")) >= 1
