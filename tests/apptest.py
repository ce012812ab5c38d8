"""Helpers for running the app under streamlit.testing.v1.AppTest."""
from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from streamlit.components.v2 import manifest_scanner
from streamlit.testing.v1 import AppTest

from ui import live_chart
from ui.streamlit_compat import use_navigation_only

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180

# Every new AppTest scans the metadata of every installed distribution (about 330) for component
# manifests: 0.3-0.5 s each time, and the non-slow tests alone made 154 (measured). The environment
# does not change while the tests run, so each process scans once. (The live chart is not found by
# that scan: it is declared in ui/live_chart.py when imported.)
manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)

# AppTest resets Streamlit's "legacy pages/ folder" flag before every run; the shim that the app's
# launcher (ui/serve.py) uses keeps it off, so tests see what users see.
use_navigation_only()


class LiveChart:
    """A chart drawn by :func:`ui.live_chart.show_chart`, read like an ``st.plotly_chart`` element:
    ``proto.id`` (its element id, which holds its key), ``proto.spec`` (the figure's JSON) and
    ``proto.config``. An AppTest run is a full script run, so every live chart in it carries its
    whole figure."""

    type = "plotly_chart"

    def __init__(self, element):
        data = live_chart.received(json.loads(element.proto.json))
        fig = live_chart.sent_figure(data)
        assert fig is not None, f"live chart {element.proto.id} carries no whole figure in a full run"
        self.key = element.key
        self.proto = SimpleNamespace(id=element.proto.id, spec=json.dumps(fig), config=json.dumps(data.get("config", {})))


def _get(self, element_type: str):
    """``at.get("plotly_chart")`` lists the live charts too, in page order."""
    if element_type != "plotly_chart":
        return _plain_get(self, element_type)
    return [LiveChart(e) if e.type == "bidi_component" else e for e in self._tree
            if e.type == "plotly_chart" or (e.type == "bidi_component" and e.proto.component_name == live_chart.COMPONENT)]


_plain_get = AppTest.get
AppTest.get = _get


def app(**query) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = v
    return at


def open_page(page: str, **query) -> AppTest:
    at = app(**query).run()
    at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def plotly_array(value) -> np.ndarray:
    """Plotly 6+ writes numeric arrays as {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return a.reshape([int(x) for x in str(value.get("shape", len(a))).split(",")])
    return np.asarray(value)


def figure(at, key_part: str) -> dict:
    """The Plotly figure JSON of the chart whose widget key contains ``key_part``."""
    for c in at.get("plotly_chart"):
        if key_part in c.proto.id:
            return json.loads(c.proto.spec)
    raise AssertionError(f"no chart {key_part!r} in {[c.proto.id for c in at.get('plotly_chart')]}")


def uploader(at, key: str):
    for u in at.get("file_uploader"):
        if u.key == key:
            return u
    raise AssertionError(f"no file_uploader {key!r}")


def walk_guide(at, key: str, on_step=None) -> int:
    """Turn guide mode on and press Next until the end; every step must render its narration."""
    at.toggle(key=f"{key}_guide").set_value(True).run()
    assert not at.exception, at.exception
    n = 0
    while True:
        n += 1
        assert at.info and at.info[0].value, f"step {n}: no narration"
        assert not at.error, [e.value for e in at.error]
        if on_step is not None:
            on_step(at, n)
        nxt = at.button(key=f"{key}_guide_next")
        if nxt.disabled:
            return n
        nxt.click().run()
        assert not at.exception, at.exception
