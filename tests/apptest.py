"""Helpers for running the app under streamlit.testing.v1.AppTest."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180

# AppTest resets Streamlit's "legacy pages/ folder" flag before every run, which makes it run a
# page file on its own, without app.py's shared sidebar. The app itself is started through
# pages/serve.py, which clears that flag; do the same here so tests see what users see.
_original_init = PagesManager.__init__


def _navigation_only_init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    PagesManager.uses_pages_directory = False


PagesManager.__init__ = _navigation_only_init


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
