"""The app's pages, written once: app.py builds ``st.navigation`` from this list and the home page
lists the lessons from it, in teaching order."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageInfo:
    path: str  # the page script, relative to app.py
    title: str
    icon: str
    url_path: str | None  # None: Streamlit's default (the home page)
    lesson: int | None  # position in the teaching order; None for a page that is not a lesson
    description: str  # one line, for the home page's list


PAGES = (
    PageInfo("pages/home.py", "Home", ":material/home:", None, None,
             "what pagedkv teaches, how to use it, and the KV-cache arithmetic of the loaded model"),
    PageInfo("pages/reserve_or_page.py", "Reserve or page", ":material/view_module:", "reserve-or-page", 1,
             "contiguous reservations beside paged blocks, same requests, same memory"),
    PageInfo("pages/live_engine.py", "Live engine", ":material/play_circle:", "live-engine", 2,
             "submit prompts, watch SmolLM2's text stream while its blocks fill the pool"),
    PageInfo("pages/prefix_sharing.py", "Prefix sharing and copy-on-write", ":material/account_tree:",
             "prefix-sharing", 3, "a shared system prompt computed once; forked samples"),
    PageInfo("pages/under_pressure.py", "Under pressure: swap versus recompute", ":material/compress:",
             "under-pressure", 4, "a load spike on a small pool, preempted two ways"),
    PageInfo("pages/block_size.py", "Block size and pool sizing", ":material/grid_view:", "block-size", 5,
             "a block-size sweep and a pool calculator"),
    PageInfo("pages/ops.py", "Ops dashboard", ":material/monitoring:", "ops", 6, "the signals an operator watches"),
    PageInfo("pages/baselines.py", "Real traffic: the paper's baselines", ":material/stacked_bar_chart:", "baselines", 7,
             "Azure's production requests on the vLLM paper's three Orca baselines and on paging, waste measured"),
    PageInfo("pages/prefix_traffic.py", "Prefix cache on real traffic", ":material/cached:", "prefix-traffic", 8,
             "Mooncake's production request log: hit rate against cache size, LRU against Belady, and why a hit rate is low"),
    PageInfo("pages/vllm_server.py", "Your vLLM server", ":material/dns:", "vllm-server", None,
             "a real vLLM server's prefix cache, live from its KV events and /metrics, or recorded"),
)
HOME = PAGES[0]


def lessons() -> list[PageInfo]:
    """The lesson pages in teaching order."""
    return sorted((p for p in PAGES if p.lesson is not None), key=lambda p: p.lesson)


def navigation_pages() -> list:
    """``st.Page`` objects for ``st.navigation``, the home page first and default."""
    import streamlit as st

    return [st.Page(p.path, title=p.title, icon=p.icon, default=p is HOME,
                    **({"url_path": p.url_path} if p.url_path else {})) for p in PAGES]
