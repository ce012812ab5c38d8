"""Presenter mode in Chromium at a projector's 1280 x 720 (issue 21): the slides of Reserve or page
and Real traffic, every prediction answered, each with its whole figure on the screen, → to the
next slide and ← back. The rest of presenter mode, on every lesson, is checked under AppTest in
test_presenter_pages.py."""
import re
from pathlib import Path

import pytest

from tests.browser import answer_prediction, chromium_page, running_app, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_slides_fit_a_projector_in_chromium():
    """Reserve or page and Real traffic as slides at 1280 x 720, every prediction answered: no
    sidebar, no error, and each slide's figure ends on the screen. Reserve or page opens on a
    prediction; → goes to the next slide, and from its last slide ← goes back one."""
    out = Path(__file__).resolve().parents[1] / "test-output"
    out.mkdir(exist_ok=True)
    with running_app() as url, chromium_page(1280, 720) as page:
        for path in ("reserve-or-page", "baselines"):
            page.goto(f"{url}/{path}?present=on")
            wait_idle(page, 600_000)
            slide = 1
            titles = []  # each slide's figure title, as the browser drew it
            while True:
                # The slide's run under way (its header), then done: only then is "no question
                # here" an answer, not a page still arriving.
                page.get_by_text(re.compile(f"Part {slide} of")).first.wait_for(timeout=600_000)
                wait_idle(page, 600_000)
                if path == "reserve-or-page" and slide == 1:  # it opens on a prediction: wait for it to be drawn
                    # (under load the page can sit idle between two runs of its script before it is)
                    page.get_by_text(re.compile("^Predict:")).first.wait_for(timeout=600_000)
                asked = answer_prediction(page, out / f"{path}-slide-{slide}-unanswered.png")
                if path == "reserve-or-page" and slide == 1:
                    assert asked, "Reserve or page's first slide asks no prediction"
                wait_idle(page, 600_000)
                page.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
                assert page.locator('[data-testid="stException"]').count() == 0, (path, slide)
                assert not page.locator('[data-testid="stSidebar"]').is_visible()
                titles.append(page.locator(".js-plotly-plot .gtitle").first.text_content())
                box = page.locator(".js-plotly-plot").first.bounding_box()
                assert box["y"] + box["height"] <= 720 + 1, (path, slide, box)  # the whole figure on the screen
                page.screenshot(path=str(out / f"{path}-slide-{slide}-1280x720.png"))
                header = page.get_by_text(re.compile(r"Part \d+ of \d+")).first.inner_text()
                done, total = (int(x) for x in re.search(r"Part (\d+) of (\d+)", header).groups())
                if done == total:
                    # the browser drew each slide's own figure, not the first one again
                    assert len(set(titles)) >= 3, (path, titles)
                    if path == "reserve-or-page":  # ← goes back one slide
                        page.locator('[data-testid="stAlertContentInfo"]').first.click()
                        page.keyboard.press("ArrowLeft")
                        page.get_by_text(re.compile(f"Part {total - 1} of")).first.wait_for(timeout=120_000)
                    break
                page.locator('[data-testid="stAlertContentInfo"]').first.click()  # keys go to the page
                page.keyboard.press("ArrowRight")
                slide += 1
                page.get_by_text(re.compile(f"Part {slide} of")).first.wait_for(timeout=120_000)

