"""Charts that stay on the screen while playing (ui/live_chart.py; issue 21's "charts go blank while
playing", issue 25's "no chart is rebuilt from scratch").

One server, one Chromium page at 1280x720 on *Reserve or page* (scripted source). Play at Speed 10,
then, once the step has moved, sample the paged pool's chart every SAMPLE_MS for at least
SAMPLE_S seconds (and until the heatmap has shown a few different frames):

- the chart's plot is on the screen at every sample: its node is there, drawn (Plotly's SVG with
  the heatmap layer in it), never missing or empty; nor is it missing after any change to the page
  between samples (a MutationObserver checks after each);
- it is the same DOM node at every sample: frames update it in place (``st.plotly_chart`` mounted
  a new element for every frame, blank until drawn);
- its heatmap data (the cells' x, y and codes) changes from frame to frame on that node;
- no draw repeats the one before it (the same cells under the same title): a tick that holds its
  frame for a browser still drawing it sends the message already drawn, and the browser draws
  nothing (it used to draw every held frame again, two draws in three while playing here);
- most of the pool's draws repaint its cells alone (``data-how="cells"``), and each of the first
  few such pictures, drawn again by Plotly itself from the traces and layout the chart then held,
  is the same image, pixel for pixel, under the same title; with the pointer over the chart it is
  drawn by Plotly in full (its hover reads what Plotly drew), and away from it, repainted again.

Against ``st.plotly_chart`` this fails: the node changes every frame and samples catch it absent.
The waits depend on progress (the step moving, frames arriving), bounded generously; nothing is timed.
"""
from __future__ import annotations

import time

import pytest

from tests.browser import chromium_page, running_app, wait_idle
from ui.pool_cells import GRID_STROKE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE = "reserve-or-page"
CHART = ".st-key-rop_heat_paged .js-plotly-plot"
STRIP = ".st-key-rop_events .js-plotly-plot"  # the event strip under the slider
STEP = '[data-testid="stMain"] [data-testid="stSlider"] input[aria-label="Step"]'
PLAY = ".st-key-rop_play button"
SAMPLE_MS = 100
SAMPLE_S = 10.0
MIN_FRAMES = 3  # different heatmaps seen on the node
BOUND_S = 180.0  # the most the sampling may take on a slow machine (a bound, not an expectation)

# Between samples, every change to the page is checked too: a MutationObserver notes each time the
# chart's plot is missing once the browser has applied a batch of changes, and each draw of the chart
# (its data-rev attribute, set after every draw) that shows the same cells and title as the draw before.
WATCH = """(chart) => {
  window.__blank = 0; window.__draws = 0; window.__repeats = 0; window.__lastDraw = null;
  window.__mounts = []; window.__watchedAt = performance.now();
  const drawn = () => { const n = document.querySelector(chart); return !!(n && n.querySelector('.main-svg') && n.querySelector('.hm')); };
  const app = document.querySelector('[data-testid="stApp"]');
  let last = document.querySelector(chart);
  new MutationObserver(() => {
    if (!drawn()) window.__blank += 1;
    const now = document.querySelector(chart);
    if (now !== last) {  // a chart node mounted (or gone): when, and in which script state
      const s = document.querySelector('[data-testid="stMain"] [data-testid="stSlider"] input[aria-label="Step"]');
      window.__mounts.push({ms: Math.round(performance.now() - window.__watchedAt), present: !!now,
                            script: app && app.getAttribute('data-test-script-state'), step: s ? Number(s.value) : null});
      last = now;
    }
  }).observe(document.querySelector('[data-testid="stMain"]'), {childList: true, subtree: true});
  new MutationObserver((records) => {
    for (const r of records) {
      const n = r.target;
      if (!n.matches || !n.matches(chart)) continue;
      const cells = (n.data || []).filter((t) => t.type === 'heatmap').map((t) => JSON.stringify([t.x, t.y, t.z]));
      const title = n.layout && n.layout.title && n.layout.title.text;
      const seen = JSON.stringify([title, cells]);
      window.__draws += 1;
      if (seen === window.__lastDraw) window.__repeats += 1;
      window.__lastDraw = seen;
    }
  }).observe(document.querySelector('[data-testid="stMain"]'), {attributes: true, attributeFilter: ['data-rev'], subtree: true});
  // how each draw of the pool was made, and the first few repaints of its cells alone (ui.live_chart:
  // "cells"): the images shown then, and the traces and layout the chart held, to be drawn by Plotly
  // itself once paused (gd.data and gd.layout are replaced, never changed in place, by later draws)
  window.__poolHows = []; window.__cells = [];
  new MutationObserver((records) => {
    for (const r of records) {
      const n = r.target;
      if (!n.matches || !n.matches(chart)) continue;
      window.__poolHows.push(n.dataset.how);
      if (n.dataset.how !== 'cells' || window.__cells.length >= 3) continue;
      window.__cells.push({images: [...n.querySelectorAll('g.hm image')].map((i) => i.getAttribute('xlink:href') || i.getAttribute('href')),
                           title: (n.querySelector('.gtitle') || {}).textContent, data: n.data.slice(),
                           layout: Object.assign({}, n.layout, {width: n._fullLayout.width, height: n._fullLayout.height})});
    }
  }).observe(document.querySelector('[data-testid="stMain"]'), {attributes: true, attributeFilter: ['data-rev'], subtree: true});
  // how each draw of the event strip was made (ui.live_chart: "react-layout" when only its layout changed)
  window.__stripHows = [];
  new MutationObserver((records) => {
    for (const r of records) if (r.target.matches && r.target.matches(STRIP)) window.__stripHows.push(r.target.dataset.how);
  }).observe(document.querySelector('[data-testid="stMain"]'), {attributes: true, attributeFilter: ['data-rev'], subtree: true});
}""".replace("STRIP", repr(STRIP))

SAMPLE = """([chart, step]) => {
  const node = document.querySelector(chart);
  const s = document.querySelector(step);
  const out = {present: false, same: false, z: null, step: s ? Number(s.value) : null, node: null};
  if (!node) return out;
  if (!window.__chartNode) window.__chartNode = node;
  out.same = node === window.__chartNode;
  if (node.__sampleId === undefined) node.__sampleId = (window.__nodes = (window.__nodes || 0) + 1);
  out.node = node.__sampleId;  // which node this is: 1 the one at load, 2 the next mounted, ...
  const drawn = node.querySelector('.main-svg') && node.querySelector('.hm');
  // the pool's cells: heatmap traces in column form (x, y, z per cell); arrays come as a typed
  // array's base64 text ({dtype, bdata, shape}) or as plain arrays
  const cells = (node.data || []).filter((t) => t.type === 'heatmap' && t.z);
  out.present = !!(drawn && cells.length);
  if (out.present) {  // a checksum of the cells drawn
    let sum = 0, k = 1;
    const add = (x) => { sum = (sum + x * k) % 1000000007; k = (k * 31) % 1000003; };
    const walk = (a) => {
      if (a === null || a === undefined) return;
      if (a.bdata !== undefined) a = a.bdata;
      if (typeof a === 'string') { for (let i = 0; i < a.length; i++) add(a.charCodeAt(i)); return; }
      for (const x of a) { if (x !== null && typeof x === 'object') walk(x); else add(Number(x) || 0); } };
    for (const t of cells) { walk(t.x); walk(t.y); walk(t.z); add(7); }
    out.z = sum;
  }
  return out;
}"""


def test_a_playing_heatmap_stays_on_the_screen_and_changes_in_place():
    with running_app() as url, chromium_page(1280, 720) as page:
        page.goto(f"{url}/{PAGE}")
        wait_idle(page)
        page.wait_for_selector(CHART, timeout=120_000)
        first = page.evaluate(SAMPLE, [CHART, STEP])
        assert first["present"], "the paged pool's chart is not drawn after the page loaded"
        # the lines between the cells (ui.pool_cells.cell_grid) are drawn on whole pixels (ui.layout)
        grid = page.evaluate("""([chart, stroke]) => [...document.querySelectorAll(chart + ' .shapelayer path')]
            .filter((p) => p.style.stroke === stroke).map((p) => getComputedStyle(p).shapeRendering)""", [CHART, GRID_STROKE])
        assert [g.lower() for g in grid] == ["crispedges"], grid
        page.evaluate(WATCH, CHART)
        page.locator(PLAY).click()
        deadline = time.monotonic() + BOUND_S
        while page.evaluate(SAMPLE, [CHART, STEP])["step"] in (None, first["step"] or 0):
            assert time.monotonic() < deadline, "Play did not move the step"
            page.wait_for_timeout(SAMPLE_MS)
        samples, start = [], time.monotonic()
        while True:
            samples.append(page.evaluate(SAMPLE, [CHART, STEP]))
            seen = {s["z"] for s in samples if s["z"] is not None}
            if time.monotonic() - start >= SAMPLE_S and len(seen) >= MIN_FRAMES:
                break
            assert time.monotonic() < deadline, f"only {len(seen)} different heatmaps in {len(samples)} samples"
            page.wait_for_timeout(SAMPLE_MS)
        pool_hows = page.evaluate("() => window.__poolHows")  # the draws with no pointer over the pool
        # Under the pointer the pool is drawn by Plotly in full (its hover reads what it drew); away
        # from it, its cells alone are repainted again. Each waits for two draws of the pool, within a
        # bound of its own (the sampling above may have used much of its own on a slow machine).
        deadline = time.monotonic() + BOUND_S
        for where, expect in (("over", False), ("away", True)):
            if where == "over":
                page.hover(CHART)
            else:
                page.mouse.move(1, 1)
            start_at = page.evaluate("() => window.__poolHows.length")
            while page.evaluate("() => window.__poolHows.length") < start_at + 2:
                assert time.monotonic() < deadline, f"the pool was not drawn twice with the pointer {where}"
                page.wait_for_timeout(SAMPLE_MS)
            hows = page.evaluate("(n) => window.__poolHows.slice(n + 1)", start_at)  # the first may have begun before
            assert (("cells" in hows) if expect else ("cells" not in hows)), (where, hows)
        blank = page.evaluate("() => window.__blank")
        mounts = page.evaluate("() => window.__mounts")
        draws, repeats = page.evaluate("() => [window.__draws, window.__repeats]")
        strip_hows = page.evaluate("() => window.__stripHows")
        page.locator(PLAY).click()  # Pause
        redrawn = page.evaluate(REDRAWN)
        absent = [i for i, s in enumerate(samples) if not s["present"]]
        replaced = [i for i, s in enumerate(samples) if s["present"] and not s["same"]]
        # which node each sample saw, as runs (node, samples, steps): one change at Play, or one a frame
        seen_nodes = []
        for s in samples:
            if seen_nodes and seen_nodes[-1][0] == s["node"]:
                seen_nodes[-1][1] += 1
                seen_nodes[-1][3] = s["step"]
            else:
                seen_nodes.append([s["node"], 1, s["step"], s["step"]])
        facts = (f"the nodes sampled after the step moved (node, samples, from step, to step): {seen_nodes}; "
                 f"{blank} changes to the page found the plot missing; the step moved from {first['step']}; "
                 f"chart nodes mounted or gone after load (ms from just before Play was pressed, the script's state, the step): "
                 f"{mounts}")
        assert not absent, f"the chart was absent or empty at {len(absent)} of {len(samples)} samples; {facts}"
        assert not replaced, f"the chart was a new DOM node at {len(replaced)} of {len(samples)} samples; {facts}"
        assert blank == 0, f"the chart's plot was missing after {blank} changes to the page"
        assert draws >= MIN_FRAMES and repeats == 0, f"{repeats} of the chart's {draws} draws drew the frame drawn before"
        steps = [s["step"] for s in samples]
        assert steps[-1] > steps[0], "the run did not advance while sampled"
        assert len({s["z"] for s in samples}) >= MIN_FRAMES  # new data, on the same node
        # The strip's events are the same while the run plays (it is recorded whole): only its step
        # line moves, and its traces are given to Plotly as drawn before, so Plotly relays it out.
        assert "react-layout" in strip_hows, f"the event strip's draws: {strip_hows}"
        # The pool's traces and grid stay the same from step to step (ui.pool_cells), so most of its
        # draws repaint its cells alone, and each such picture is the one Plotly draws for the same figure.
        assert pool_hows.count("cells") * 2 > len(pool_hows), f"the pool's draws: {pool_hows}"
        assert redrawn and all(r["same"] and r["title"][0] == r["title"][1] and r["images"][0] >= 4 for r in redrawn), redrawn
        # Drawn in pixels, not in Plotly's "responsive" mode (a chart first drawn into a node that
        # already had a height stayed 0 px high there), and still as wide as the page: a narrower
        # window narrows it.
        box = page.evaluate(BOX, CHART)
        assert box["height"] > 100 and box["svg"].endswith("px") and abs(box["width"] - box["parent"]) <= 1, box
        page.set_viewport_size({"width": 900, "height": 720})
        page.wait_for_function(f"(sel) => ({BOX})(sel).width < {box['width'] - 100} && "
                               f"Math.abs(({BOX})(sel).width - ({BOX})(sel).parent) <= 1", arg=CHART, timeout=60_000)


# A live chart's plot box: its width and height, the svg container's style width, and its node's width.
# Each repaint of the pool's cells captured while playing, drawn again by Plotly itself from the traces
# and layout the chart held: whether every heatmap's image is the same picture, pixel for pixel, and
# the title the same text.
REDRAWN = """async () => {
  const pixels = async (href) => {
    const im = new Image(); im.src = href; await im.decode();
    const cv = document.createElement('canvas'); cv.width = im.naturalWidth; cv.height = im.naturalHeight;
    const cx = cv.getContext('2d'); cx.drawImage(im, 0, 0);
    return cv.width + 'x' + cv.height + ':' + Array.from(cx.getImageData(0, 0, cv.width, cv.height).data).join(',');
  };
  const out = [];
  for (const cap of window.__cells) {
    const div = document.createElement('div');
    document.body.appendChild(div);
    await Plotly.newPlot(div, cap.data, cap.layout, {staticPlot: true});
    const theirs = [...div.querySelectorAll('g.hm image')].map((i) => i.getAttribute('xlink:href') || i.getAttribute('href'));
    const ours = await Promise.all(cap.images.map(pixels)), drawn = await Promise.all(theirs.map(pixels));
    out.push({images: [ours.length, drawn.length], same: ours.length === drawn.length && ours.every((p, k) => p === drawn[k]),
              title: [cap.title, (div.querySelector('.gtitle') || {}).textContent]});
    Plotly.purge(div); div.remove();
  }
  return out;
}"""

BOX = """(sel) => { const gd = document.querySelector(sel); const sc = gd && gd.querySelector('.svg-container');
  if (!sc) return {width: 0, height: 0, svg: '', parent: -1};
  const r = sc.getBoundingClientRect();
  return {width: r.width, height: r.height, svg: sc.style.width, parent: gd.getBoundingClientRect().width}; }"""
