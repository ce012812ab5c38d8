"""Every page in a real browser: Streamlit in a subprocess, Debian Chromium through Playwright.
Screenshots land in test-output/ for a person to look at."""
import re
from pathlib import Path

import pytest

from tests.browser import chromium_page, running_app, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = Path(__file__).resolve().parents[1] / "test-output"
POOL_PAGES = ["ops", "reserve-or-page"]  # the last one is played, as it was loaded
STEP = '[data-testid="stMain"] [data-testid="stSlider"] input[aria-label="Step"]'


def heatmap_titles(page) -> list[str]:
    return [t for t in page.locator(".js-plotly-plot .gtitle").all_text_contents() if "KV slots at step" in t]


def current_step(page) -> int:
    titles = heatmap_titles(page)
    assert titles, "no heatmap title on the page"
    return int(re.search(r"at step (\d+)", titles[0]).group(1))


def test_every_page_renders_and_play_advances_the_step():
    OUT.mkdir(exist_ok=True)
    with running_app() as url, chromium_page(1400, 1800) as page:
        for path in POOL_PAGES:
            page.goto(f"{url}/{path}")
            wait_idle(page)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0, path
            assert page.locator(".js-plotly-plot").count() >= 2, path
            page.screenshot(path=str(OUT / f"{path}.png"), full_page=True)

        assert len(heatmap_titles(page)) == 2, "a heatmap per allocator"
        before = current_step(page)
        page.get_by_role("button", name=re.compile("Play")).click()
        # Pause stops on the step the screen shows (the step slider's, which the press carries): wait
        # until every pool on the screen and the slider are 3 steps on (on a busy machine one pool's
        # chart can be drawn a frame before the other's, and the slider a frame after the charts)
        page.wait_for_function(
            """([before, slider]) => { const steps = [...document.querySelectorAll('.js-plotly-plot .gtitle')]
                 .map(t => t.textContent.match(/at step (\\d+)/)).filter(m => m).map(m => +m[1]);
                 const s = document.querySelector(slider);
                 return steps.length >= 2 && steps.every(t => t >= before + 3) && s && +s.getAttribute('value') >= before + 3; }""",
            arg=[before, STEP], timeout=30_000)
        page.get_by_role("button", name=re.compile("Pause")).click()
        wait_idle(page)
        assert current_step(page) >= before + 3
        page.screenshot(path=str(OUT / "reserve-or-page-playing.png"), full_page=True)
