"""Slides at a projector's 1280 x 720 in Chromium, as drawn (issue 21's last walk): everything on
a slide, caption included, ends above the screen's bottom edge with a margin, and the page asks
nothing of a host other than the server (a classroom may be offline).

Reserve or page is the lesson with the most text under and over its figures (a question, its
answer, two pools and a two- or three-line caption); every lesson's slides are checked against
the same layout estimate under AppTest (test_presenter_pages.py)."""
import re
from urllib.parse import urlparse

import pytest

from tests.browser import ROOT, answer_prediction, chromium_page, running_app, wait_idle
from ui.presenter import SCREEN_PX

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MARGIN_PX = 8  # at least this much of the screen left under a slide's last line, as drawn
LOCAL = {"127.0.0.1", "localhost", "::1"}
OUT = ROOT / "test-output"

# The lowest bottom edge of anything drawn in the page's main area: each line of text as laid out
# (a caption's box reaches past its last line, into the gap under it), figures, boxes, buttons.
LOWEST = """() => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  let low = 0, what = '';
  const texts = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let n = texts.nextNode(); n; n = texts.nextNode()) {
    const s = getComputedStyle(n.parentElement);
    if (!n.textContent.trim() || s.visibility === 'hidden' || s.display === 'none') continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    for (const r of range.getClientRects()) {
      if (r.height > 0 && r.bottom > low) { low = r.bottom; what = 'text: ' + n.textContent.trim().slice(0, 60); }
    }
  }
  for (const el of main.querySelectorAll('.js-plotly-plot, canvas, img, button, input, [data-testid="stAlertContainer"]')) {
    const r = el.getBoundingClientRect();
    if (r.width >= 1 && r.height >= 1 && r.bottom > low) { low = r.bottom; what = el.tagName + ' ' + (el.getAttribute('data-testid') || ''); }
  }
  return [low, what];
}"""


def test_every_slide_ends_above_the_bottom_edge_and_nothing_is_fetched_from_elsewhere():
    requests = []
    with running_app() as url, chromium_page(1280, SCREEN_PX) as page:
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"{url}/reserve-or-page?guide=on&present=on")
        wait_idle(page, 600_000)
        slide, seen = 1, []
        while True:
            for answered in (False, True):  # the slide as it asks, then with the measured answer
                page.get_by_text(re.compile(f"Part {slide} of")).first.wait_for(timeout=600_000)
                wait_idle(page, 600_000)  # the slide's run done: "no question here" is an answer
                if answered and not answer_prediction(page, OUT / f"slide-fit-{slide}-unanswered.png"):
                    break
                wait_idle(page, 600_000)
                page.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
                low, what = page.evaluate(LOWEST)
                seen.append((slide, answered, round(low)))
                assert low <= SCREEN_PX - MARGIN_PX, (slide, answered, low, what)
            header = page.get_by_text(re.compile(r"Part \d+ of \d+")).first.inner_text()
            done, total = (int(x) for x in re.search(r"Part (\d+) of (\d+)", header).groups())
            if done == total:
                break
            page.locator('[data-testid="stAlertContentInfo"]').first.click()  # keys go to the page
            page.keyboard.press("ArrowRight")
            slide += 1
            page.get_by_text(re.compile(f"Part {slide} of")).first.wait_for(timeout=120_000)
        assert slide >= 5, seen
    elsewhere = sorted({u for u in requests if u.startswith(("http:", "https:", "ws:", "wss:"))
                        and urlparse(u).hostname not in LOCAL})
    assert not elsewhere, elsewhere  # e.g. a ":material/...:" page icon, fetched from fonts.gstatic.com
