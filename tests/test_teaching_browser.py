"""The teaching pages in a real browser: Streamlit in a subprocess, Debian Chromium through Playwright.
Each page is opened in explore mode and at a guide step; screenshots land in test-output/. Presenter
mode at 1280 x 720 (a prediction answered, → and ←) is test_presenter_browser.py's."""
import re
from pathlib import Path

import pytest

from tests.browser import chromium_page, running_app, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = Path(__file__).resolve().parents[1] / "test-output"
# (url path, query, screenshot name, figures expected at least, viewport height)
VIEWS = [
    ("block-size", "", "block-size", 4, 3000),
    ("block-size", "?guide=on&guide_step=7", "block-size-guide", 4, 3000),
    # step 5: q0 has just finished and holds no blocks, so its block table is a sentence, not a chart
    # (the pool and a block table side by side: test_live_engine_streams_text_for_submitted_prompts)
    ("live-engine", "?guide=on&guide_step=5", "live-engine-guide", 1, 1700),
    ("prefix-sharing", "?guide=on&guide_step=6", "prefix-sharing-guide", 4, 2600),
    ("prefix-sharing", "", "prefix-sharing", 4, 2700),
    ("under-pressure", "?guide=on&guide_step=3", "under-pressure-guide", 7, 3800),
    ("under-pressure", "", "under-pressure", 7, 3900),
]


def settle(page, timeout_ms: int = 600_000) -> None:
    wait_idle(page, timeout_ms)
    page.locator(".js-plotly-plot").first.wait_for(timeout=timeout_ms)
    wait_idle(page, timeout_ms)
    page.wait_for_timeout(800)


def test_teaching_pages_render_in_chromium():
    OUT.mkdir(exist_ok=True)
    with running_app() as url, chromium_page(1400, 1200) as page:
        for path, query, name, figures, height in VIEWS:
            page.set_viewport_size({"width": 1400, "height": height})
            page.goto(f"{url}/{path}{query}")
            settle(page)
            assert page.locator('[data-testid="stException"]').count() == 0, name
            # Plotly mounts each chart on its own after the script has finished: wait for them all.
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {figures}",
                                   timeout=120_000)
            if "guide" in query:
                assert page.locator('[data-testid="stAlertContentInfo"]').count() >= 1, f"{name}: no narration"
            page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)


def test_live_engine_streams_text_for_submitted_prompts():
    OUT.mkdir(exist_ok=True)
    with running_app() as url, chromium_page(1400, 1700) as page:
        page.goto(f"{url}/live-engine")
        wait_idle(page, 600_000)
        page.locator("[data-testid=stMultiSelect]").first.click()
        page.get_by_role("option", name="What is the capital of France?").click()
        page.keyboard.press("Escape")
        page.get_by_label("…or type your own (one prompt)").fill("Name two planets.")
        page.get_by_role("button", name=re.compile("Submit")).click()
        # playing starts by itself: wait until the step counter has moved a few times
        page.wait_for_function(
            """() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]
                 .some(t => { const m = t.textContent.match(/at step (\\d+)/); return m && +m[1] >= 4; })""",
            timeout=300_000)
        page.get_by_role("button", name=re.compile("Pause")).click()
        settle(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator(".js-plotly-plot").count() >= 2  # the pool and the block table
        body = page.inner_text("body")
        assert "What is the capital of France?" in body and "Name two planets." in body
        page.screenshot(path=str(OUT / "live-engine.png"), full_page=True)

