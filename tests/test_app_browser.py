"""The real app in a real browser: Streamlit in a subprocess, Debian Chromium through Playwright."""
import pytest

from tests.browser import chromium_page, running_app, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_home_page_renders_the_models_kv_arithmetic(tmp_path):
    with running_app() as url, chromium_page() as page:
        page.goto(url)
        wait_idle(page)
        # A fresh machine converts the GGUF first (about 20 s, with a progress bar): wait for the table.
        page.wait_for_function("() => document.body.innerText.includes('46,080 B')", timeout=180_000)
        body = page.inner_text("body")
        assert "2 × 30 × 3 × 64 × 4 = 46,080 B" in body
        assert "2 × 30 × 3 × 64 × 2 = 23,040 B" in body
        assert "737,280 B" in body  # one 16-token block in fp32
        page.screenshot(path=str(tmp_path / "home.png"), full_page=True)
