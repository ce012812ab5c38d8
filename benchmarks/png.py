"""A Plotly figure as a PNG file, drawn by plotly.js itself in headless Chromium.

Plotly's own static export needs kaleido (and kaleido a Chrome of its own); the project already
drives Debian's Chromium through Playwright for its browser tests, so a benchmark plot is drawn
the same way: the figure's HTML (plotly.js inline, no network) is opened in a blank page and
``Plotly.toImage`` returns the PNG. Without Chromium or Playwright, :func:`write_png` says why
and writes nothing (the benchmark's JSON result does not depend on it).
"""
from __future__ import annotations

import base64
import os
from pathlib import Path

CHROMIUM = os.environ.get("PAGEDKV_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def why_not() -> str | None:
    """Why a PNG cannot be drawn on this machine, or None when it can."""
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM} (set PAGEDKV_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


def write_png(fig, path, *, width: int = 1000, height: int = 560, scale: int = 2) -> str | None:
    """Draw ``fig`` at ``width`` x ``height`` CSS pixels (times ``scale``) into ``path``.
    Returns None when written, else why not."""
    why = why_not()
    if why:
        return why
    from playwright.sync_api import sync_playwright

    html = fig.to_html(include_plotlyjs=True, full_html=True, div_id="fig", config={"staticPlot": True})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width + 40, "height": height + 40})
            page.set_content(html, wait_until="load")
            page.wait_for_function("() => window.Plotly && document.querySelector('#fig .main-svg')", timeout=60_000)
            url = page.evaluate(
                "([w, h, s]) => Plotly.toImage(document.getElementById('fig'), {format: 'png', width: w, height: h, scale: s})",
                [width, height, scale])
        finally:
            browser.close()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(base64.b64decode(url.split(",", 1)[1]))
    return None
