"""The live real-model page in a real browser: Reserve or page with the SmolLM2 source (16 chat
prompts on a contiguous and a paged engine, 2,048 slots each), served by ``python -m ui.serve``
on a free loopback port and driven by Debian Chromium (headless) through Playwright.

Measured where a person waits, not on the server: the time from pressing Play to the first new
frame (the step slider's value changes), and the steps per second the pair then advances over
``PLAY_S`` seconds of play (the slider's value, read every ``POLL_S`` seconds), in one session
and with three sessions playing at once. Opening the page (to the first drawn heatmaps) is timed
too. A first visit loads the model into the server process first; it is timed apart and not
counted. The browser draws on the same cores as the server, as the browser tests do.

The machine may be shared, so the wall-clock figures depend on what else runs. The CPU seconds
the server and the browser spend per step shown (from /proc) do not, much: they give what the
cores would do if nothing else ran (``steps_per_s_if_cores_idle``), and without the browser's
share, as in a workshop where each browser runs on its own laptop.

    .venv/bin/python -m benchmarks live
"""
from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path

from benchmarks.common import print_table, write_result

PAGE = "/reserve-or-page?source=model"
PLAY_S = 20.0
QUICK_PLAY_S = 4.0
POLL_S = 0.05
SESSIONS = 3
FIRST_FRAME_TARGET_S = 3.0
STEPS_PER_S_TARGET = 4.0
OPEN_TIMEOUT_MS = 600_000  # a fresh machine converts the model on the first visit
FRAME_TIMEOUT_S = 60.0
STEP_JS = """() => {
  const i = document.querySelector('[data-testid="stMain"] [data-testid="stSlider"] input[aria-label="Step"]');
  return i ? Number(i.value) : 0;
}"""  # no slider yet while a run has one step: step 0


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process's descendants: the app server
    ("server": engines and figures) and Playwright's driver with Chromium ("browser"). Read from
    /proc, so that a step's cost is known however busy the machine is."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in procs.items() if ppid in frontier and pid not in mine}
        mine |= frontier
    out = {"server": 0.0, "browser": 0.0}
    for pid in mine:
        _, cpu, cmd = procs[pid]
        out["server" if "ui.serve" in cmd else "browser"] += cpu
    return out


def open_page(browser, url: str):
    """A new session on the live page; returns (page, seconds until its heatmaps are drawn)."""
    from tests.browser import IDLE

    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    t0 = time.monotonic()
    page.goto(url + PAGE)
    page.wait_for_selector('[data-testid="stApp"]', timeout=OPEN_TIMEOUT_MS)
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=OPEN_TIMEOUT_MS)
    page.locator('[data-testid="stMain"] .js-plotly-plot').first.wait_for(timeout=OPEN_TIMEOUT_MS)
    errors = page.locator('[data-testid="stException"]').count()
    if errors:
        raise RuntimeError(f"the page shows an exception: {page.locator('[data-testid=stException]').first.inner_text()[:300]}")
    return page, time.monotonic() - t0


def play(pages: list, seconds: float) -> tuple[list[dict], dict]:
    """Press Play on every page (one after the other, at once in effect), then read each one's
    step every POLL_S seconds for ``seconds`` after its first new frame. Returns each page's
    figures, and the CPU seconds the server and the browser spent per step shown (all pages)."""
    start = [p.evaluate(STEP_JS) for p in pages]
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    pressed = []
    for p in pages:
        p.get_by_role("button", name=re.compile("Play")).click()
        pressed.append(time.monotonic())
    first: list[float | None] = [None] * len(pages)
    samples: list[list[tuple[float, int]]] = [[] for _ in pages]
    deadline = time.monotonic() + FRAME_TIMEOUT_S
    while True:
        now = time.monotonic()
        for i, p in enumerate(pages):
            step = p.evaluate(STEP_JS)
            t = time.monotonic()
            if first[i] is None and step > start[i]:
                first[i] = t
            if first[i] is not None:
                samples[i].append((t, step))
        if all(f is not None and samples[i][-1][0] - f >= seconds for i, f in enumerate(first)):
            break
        if now > deadline and any(f is None for f in first):
            break
        time.sleep(POLL_S)
    cpu1, wall = cpu_seconds(), time.monotonic() - wall0
    out = []  # the caller closes the pages, which ends their sessions (no Pause: a busy page may not take a click)
    for i in range(len(pages)):
        if first[i] is None:
            out.append({"first_frame_s": None, "steps_per_s": 0.0, "frames_per_s": 0.0, "steps": 0})
            continue
        s = samples[i]
        elapsed = s[-1][0] - s[0][0]
        frames = sum(1 for a, b in zip(s, s[1:]) if b[1] != a[1])
        out.append({"first_frame_s": round(first[i] - pressed[i], 2),
                    "steps_per_s": round((s[-1][1] - s[0][1]) / elapsed, 2) if elapsed > 0 else 0.0,
                    "frames_per_s": round(frames / elapsed, 2) if elapsed > 0 else 0.0,
                    "steps": s[-1][1] - start[i], "seconds": round(elapsed, 1)})
    steps = sum(o["steps"] for o in out)
    cpu = {f"{role}_cpu_s_per_step": round((cpu1[role] - cpu0[role]) / steps, 3) if steps else None for role in cpu0}
    cpu["cpu_share_of_cores"] = round(sum(cpu1[r] - cpu0[r] for r in cpu0) / (wall * (os.cpu_count() or 1)), 2)
    if steps:  # what the cores could do if nothing else ran: all of them on this app (and its browser)
        per = sum(cpu1[r] - cpu0[r] for r in cpu0) / steps
        cpu["steps_per_s_if_cores_idle"] = round((os.cpu_count() or 1) / per, 2)
        cpu["steps_per_s_if_cores_idle_browser_elsewhere"] = round((os.cpu_count() or 1) / max(1e-9, cpu["server_cpu_s_per_step"]), 2)
    return out, cpu


def run(quick: bool = False) -> dict:
    """The ``bench live`` payload: page open, first frame and steps per second, one session and
    SESSIONS at once."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS, running_app

    seconds = QUICK_PLAY_S if quick else PLAY_S
    result: dict = {"setup": {"page": PAGE, "play_s": seconds, "poll_s": POLL_S, "sessions": [1, SESSIONS],
                              "browser": "Debian Chromium, headless, on the same machine as the server"}}
    with running_app(timeout=180) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            warm, result["warmup_open_s"] = open_page(browser, url)  # loads the model into the server
            warm.context.close()
            page, open_s = open_page(browser, url)
            (one,), cpu_one = play([page], seconds)
            page.context.close()
            result["single"] = {"open_s": round(open_s, 2), **one, "cpu": cpu_one}
            opened = [open_page(browser, url) for _ in range(SESSIONS)]
            many, cpu_many = play([p for p, _ in opened], seconds)
            for p, _ in opened:
                p.context.close()
        finally:
            browser.close()
    rates = [m["steps_per_s"] for m in many]
    firsts = [m["first_frame_s"] for m in many if m["first_frame_s"] is not None]
    result["multi"] = {"sessions": SESSIONS, "open_s": [round(s, 2) for _, s in opened], "per_session": many,
                       "steps_per_s_min": min(rates), "steps_per_s_mean": round(statistics.mean(rates), 2),
                       "first_frame_s_max": max(firsts) if len(firsts) == len(many) else None, "cpu": cpu_many}
    single = result["single"]
    first = single["first_frame_s"]
    result["targets"] = [
        {"name": "Play to the first new frame, one session (s)", "value": first,
         "target": f"<= {FIRST_FRAME_TARGET_S:g}", "pass": first is not None and first <= FIRST_FRAME_TARGET_S},
        {"name": "steps per second while playing, one session", "value": single["steps_per_s"],
         "target": f">= {STEPS_PER_S_TARGET:g}", "pass": single["steps_per_s"] >= STEPS_PER_S_TARGET},
    ]
    return result


def print_result(result: dict) -> None:
    rows = [{"sessions": 1, "open_s": result["single"]["open_s"], "first_frame_s": result["single"]["first_frame_s"],
             "steps_per_s": result["single"]["steps_per_s"], "frames_per_s": result["single"]["frames_per_s"]}]
    for i, m in enumerate(result["multi"]["per_session"]):
        rows.append({"sessions": f"{result['multi']['sessions']} (#{i + 1})", "open_s": result["multi"]["open_s"][i],
                     "first_frame_s": m["first_frame_s"], "steps_per_s": m["steps_per_s"],
                     "frames_per_s": m["frames_per_s"]})
    print(f"first visit (loads the model): {result['warmup_open_s']:.1f} s")
    print_table(rows, list(rows[0]))
    for name, part in (("1 session", result["single"]), (f"{result['multi']['sessions']} sessions", result["multi"])):
        c = part["cpu"]
        print(f"{name}: CPU s per step shown: server {c['server_cpu_s_per_step']}, browser {c['browser_cpu_s_per_step']}; "
              f"used {c['cpu_share_of_cores']:.0%} of the cores; on idle cores: {c.get('steps_per_s_if_cores_idle')} steps/s "
              f"({c.get('steps_per_s_if_cores_idle_browser_elsewhere')} with the browser on another machine)")


if __name__ == "__main__":
    res = run()
    print_result(res)
    write_result("live", {"command": "python -m benchmarks.bench_live", **res})
