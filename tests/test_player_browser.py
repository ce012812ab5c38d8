"""The step player in a real browser that is slower than the server (issues 20 and 21).

One server, one Chromium page on *Reserve or page* (scripted source), its CPU throttled through
the DevTools protocol so that drawing a frame takes longer than a tick, as on a slow 2-core
machine (the browser's own timer then asks for ticks faster than it draws them). Five Play→Pause
cycles at Speed 10, then five at Speed 50, each playing a moment (20 presses in all; ten cycles a
speed took three minutes of the suite's critical path for the same checks):

- every press takes effect: after Play the button says Pause, after Pause it says Play (a click
  that a fragment tick also carried used to toggle twice: the press was lost);
- Pause lands on the step on the screen: the step shown after Pause is the one shown when the
  press reached the page, or at most one frame past it (the frame already on its way) (a frame advances at most ``speed * MAX_CATCH_UP_S``
  steps), never behind it, and it stays there;
- the page never shows "Connection error" (a "Cached ForwardMsg MISS" killed it).

A cycle never plays into the end of the run (1,756 steps): one that starts with less of it ahead
than twice the longest cycle so far played (and at least :data:`ROOM_S` seconds at its speed)
presses Reset first. A loaded machine plays long between two presses (CI, beside the classroom load
test: about 585 steps a cycle at Speed 50, and its fourth cycle started at the last step), and a
slower one longer still: the room follows what this machine's cycles played.

Every wait polls for a condition, bounded generously; nothing here is timed.
"""
from __future__ import annotations

import time

import pytest

from tests.browser import IDLE, chromium_page, running_app
from ui import player

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE = "reserve-or-page"
STEP = '[data-testid="stMain"] [data-testid="stSlider"] input[aria-label="Step"]'
PLAY = ".st-key-rop_play button"
CYCLES = 5
THROTTLE = 3  # the browser's CPU three times slower
PLAY_MS = 800  # each cycle plays this long once the step has moved
WAIT_MS = 120_000  # a press to take effect, a page to load: bounds, not expectations
ROOM_S = 30  # seconds of the run ahead of a cycle at least, at its speed (about 12 s played in CI's slowest)
RESET = ".st-key-rop_reset button"


def button_label(page) -> str:
    return page.locator(PLAY).inner_text()


def shown_step(page) -> int:
    return int(page.locator(STEP).get_attribute("value"))


# The step on the screen at the moment a press reaches the page (Playwright's click takes a
# while to get there, and frames land meanwhile): noted by a listener that runs before the app's.
# The page's script runs are counted too (stApp's run state turning to "running"), so that a page
# that stops moving tells whether its ticks stopped reaching the server or came back unchanged.
# What the page did after each Pause press is kept as a timeline (seconds since the press: every
# pointer press and click with the step on the screen, the button's label and each full or
# fragment script run), so that a landing off the screen's step says where the time went.
NOTE_PRESS = """() => {
    const step = () => { const s = document.querySelector('%s'); return s ? +s.getAttribute('value') : null; };
    const label = () => { const b = document.querySelector('%s'); return b ? b.innerText.trim().split('\\n').pop() : null; };
    window.__timeline = []; window.__t0 = performance.now();
    const note = (what) => window.__timeline.length < 400 &&
        window.__timeline.push([+((performance.now() - window.__t0) / 1000).toFixed(2), what, step(), label()]);
    window.__mark = () => { window.__timeline = []; window.__t0 = performance.now(); };
    document.addEventListener('pointerdown', () => {
        window.__shownAtPress = step(); window.__runsAtPress = window.__runs || 0; note('pointerdown');
    }, true);
    document.addEventListener('click', () => note('click'), true);
    window.__runs = 0;
    const app = document.querySelector('[data-testid="stApp"]');
    new MutationObserver(() => {
        const s = app.getAttribute('data-test-script-state');
        if (s === 'running') window.__runs++;
        note('script ' + s);
    }).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}""" % (STEP, PLAY)


def one_frame(speed: int) -> int:
    """The most steps one frame advances at ``speed``: how far past the screen a Pause may land."""
    return round(speed * player.MAX_CATCH_UP_S)


def wait_label(page, label: str) -> bool:
    """Whether the Play/Pause button comes to say ``label`` within :data:`WAIT_MS`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "([sel, label]) => { const b = document.querySelector(sel); return b && b.innerText.includes(label); }",
            arg=[PLAY, label], timeout=WAIT_MS)
        return True
    except PlaywrightTimeout:
        return False


def plays(page, start: int) -> bool:
    """Whether the step on the screen moves past ``start`` within :data:`WAIT_MS`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("([sel, s]) => { const e = document.querySelector(sel); return e && +e.getAttribute('value') > s; }",
                               arg=[STEP, start], timeout=WAIT_MS)
        return True
    except PlaywrightTimeout:
        return False


def state(page) -> str:
    """What a page that stopped moving shows: its button, its step, the line under the slider,
    and how many script runs it saw since the last press."""
    caption = page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').all_inner_texts()
    runs = page.evaluate("() => (window.__runs || 0) - (window.__runsAtPress || 0)")
    return (f"button {button_label(page)!r}, step {shown_step(page)}, {runs} script runs since the press, "
            f"captions {[c for c in caption if 'Play' in c or 'Paused' in c]}")


def reset(page) -> None:
    page.locator(RESET).click(timeout=WAIT_MS)
    page.wait_for_function("(sel) => { const e = document.querySelector(sel); return e && e.getAttribute('value') === '0'; }",
                           arg=STEP, timeout=WAIT_MS)
    page.wait_for_selector(IDLE, timeout=WAIT_MS)


def connection_error(page, console: list[str]) -> str | None:
    if page.get_by_text("Connection error").count():
        return "the page shows 'Connection error'"
    return next((line for line in console if "MISS" in line or "fatal error" in line), None)


def cycles(page, url: str, speed: int, console: list[str]) -> list[tuple[int, int]]:
    """:data:`CYCLES` Play→Pause cycles at ``speed``; returns (shown before Pause, paused at)."""
    page.goto(f"{url}/{PAGE}?speed={speed}")
    page.wait_for_selector(IDLE, timeout=WAIT_MS)
    page.locator(STEP).wait_for(state="attached", timeout=WAIT_MS)
    page.evaluate(NOTE_PRESS)
    last = int(page.locator(STEP).get_attribute("max"))
    landings, played = [], []  # played: (step when Play was pressed, step it paused at) of each cycle
    for cycle in range(CYCLES):
        start = shown_step(page)
        if landings:  # ticks already on their way when Pause took effect did not move it
            assert start == landings[-1][1], f"speed {speed}, cycle {cycle}: the step moved after Pause"
        longest = max((paused - shown for shown, paused in played), default=0)
        if start > last - max(speed * ROOM_S, 2 * longest):
            reset(page)
            start = shown_step(page)
        page.locator(PLAY).click(timeout=WAIT_MS)
        assert wait_label(page, "Pause"), f"speed {speed}, cycle {cycle}: the Play press was lost ({button_label(page)!r})"
        assert plays(page, start), f"speed {speed}, cycle {cycle}: Play took effect but the step stayed at {start}: {state(page)}"
        page.wait_for_timeout(PLAY_MS)
        page.evaluate("() => window.__mark()")
        page.locator(PLAY).click(timeout=WAIT_MS)
        before = page.evaluate("() => window.__shownAtPress")
        assert wait_label(page, "Play"), f"speed {speed}, cycle {cycle}: the Pause press was lost ({button_label(page)!r})"
        page.wait_for_selector(IDLE, timeout=WAIT_MS)
        paused = shown_step(page)
        error = connection_error(page, console)
        assert error is None, f"speed {speed}, cycle {cycle}: {error}"
        landings.append((before, paused))
        played.append((start, paused))
        if not before <= paused <= before + one_frame(speed):
            print(f"\nspeed {speed}, cycle {cycle}: Pause pressed at step {before} landed at {paused}; what the page "
                  f"did after the press (s, what, step, button): {page.evaluate('() => window.__timeline')}")
    return landings


def test_play_pause_lands_on_the_screen_and_every_press_counts_in_a_slow_browser():
    with running_app() as url, chromium_page(1280, 900) as page:
        console: list[str] = []
        page.on("console", lambda m: console.append(m.text))
        page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": THROTTLE})
        started = time.monotonic()
        for speed in (10, 50):
            landings = cycles(page, url, speed, console)
            frame = one_frame(speed)
            late = [(b, p) for b, p in landings if not b <= p <= b + frame]
            print(f"\nspeed {speed}: (shown before Pause, paused at) {landings}; {time.monotonic() - started:.0f} s so far")
            assert not late, f"speed {speed}: Pause landed more than one frame ({frame} steps) from the screen: {late}"
        assert connection_error(page, console) is None
