"""Your vLLM server: its prefix cache as a forest of block chains, blocks stored and evicted per
second, and its signals under vLLM's names, live from a server or from a recorded observation."""
import tempfile
from pathlib import Path

import streamlit as st

from pagedkv_core.config import ConfigError
from pagedkv_core.observe.observation import UNKNOWN, load_observation
from pagedkv_core.record.trace_file import TraceError, write_recording
from ui import export, player, workshop
from ui import vllm_view as view
from ui.live_chart import show_chart

KEY = "vllm"
MODES = ("Live server", "Recorded observation")

st.title("Your vLLM server")
st.caption(
    "What a **real vLLM server** tells the world about its KV cache: its KV-cache events (each full block stored "
    "in the prefix cache, each block evicted) and its Prometheus `/metrics`. Start one with `make vllm`, or watch "
    "a recording made with `python -m pagedkv_core observe --trace-out FILE`."
)


@st.cache_resource(show_spinner=False, max_entries=1)
def bundled_tokenizer():
    """SmolLM2's tokenizer from pagedkv's converted copy, or None when it is not converted yet."""
    from pagedkv_core.sources.model.loader import bundled_gguf_path, gguf_cache_dir

    folder = gguf_cache_dir(bundled_gguf_path())
    if not (folder / "tokenizer.json").exists():
        return None
    from pagedkv_core.sources.model.tokenizer import open_tokenizer

    tok, _ = open_tokenizer(folder)
    if tok is not None:
        return tok
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def text_of_tokens():
    if not st.session_state.get(f"{KEY}_decode", True):
        return None
    tok = bundled_tokenizer()
    if tok is None:
        return None
    return lambda ids: tok.decode(ids)


def draw(obs, step: int, live: bool) -> None:
    state = obs.state_at(step)
    now = obs.time_at(step) or 0.0
    left, right = st.columns([3, 2])
    with left:
        color_by = st.session_state.get(f"{KEY}_color") or "age"
        forest = view.forest_figure(state, now, color_by, text_of_tokens())
        show_chart(forest.figure, f"{KEY}_forest", config=export.png_config("vllm-forest"))
        more = f" (the {forest.shown:,} stored last)" if forest.shown < forest.total else ""
        st.caption(f"**The prefix cache as chains of blocks**: {forest.total:,} cached blocks{more}, "
                   f"{len(state.roots()):,} chain(s). Each cell is a stretch of blocks, after the stretch its prompt "
                   "continues; its height counts the blocks that go on from it, so a tall cell is a prefix that many "
                   "prompts share. Click a cell to open it.")
    with right:
        if not obs.has_metrics(step):
            st.info("No `/metrics` in this observation (it watched an event stream without its server), so "
                    "vLLM's signals are not drawn.")
        else:
            for panel in view.SIGNAL_PANELS:
                show_chart(view.signal_figure(obs, panel), f"{KEY}_sig_{panel[3]}",
                           config=export.png_config(f"vllm-{panel[3]}"))
                st.caption(view.SENTENCES[panel[0]])
    with left:
        show_chart(view.rates_figure(obs), f"{KEY}_rates", config=export.png_config("vllm-rates"))
        c = state.counts
        st.caption(f"**Blocks stored and evicted per second** (block hashes, not events): {c.blocks_stored:,} stored "
                   f"and {c.blocks_removed:,} evicted so far. Evictions that keep pace with stores mean the cache is "
                   "full and turning over: a prefix must come back before it reaches the end of the free list.")
        st.markdown("**What the server's events do not say**, so this view does not show it:\n"
                    + "\n".join(f"- {u}" for u in UNKNOWN))


with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
    mode = st.segmented_control("Watch", MODES, default=MODES[0], key=f"{KEY}_mode") or MODES[0]
    if mode == MODES[1]:
        with st.popover("Open a recording", icon=":material/folder_open:"):
            st.file_uploader("A recorded observation (`observe --trace-out FILE`)", type=["trace", "jsonl"],
                             key=f"{KEY}_upload", max_upload_size=workshop.upload_cap_mb())
    st.segmented_control("Colour blocks by", ["age", "reuse"], default="age", key=f"{KEY}_color",
                         help="age: seconds since the block was stored. reuse: times its hash was stored "
                              "(a block evicted and computed again counts twice).")
    st.toggle("Decode tokens (SmolLM2)", value=True, key=f"{KEY}_decode",
              help="Hover text decoded with the bundled SmolLM2 tokenizer: right when the server runs SmolLM2, "
                   "as `make vllm` does; turn it off for another model (token ids are shown instead).")

address = st.get_option("server.address")
if mode == MODES[0]:
    choices = view.server_choices(address)
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        if choices is None:
            url = st.text_input("Server", value=view.DEFAULT_SERVER, key=f"{KEY}_url", width=320,
                                help="The vLLM server's HTTP address. Its KV-event endpoints are found from "
                                     "/kv_event_sources; its signals are read from /metrics.")
        elif not choices:
            url = None
        else:
            url = st.selectbox("Server", choices, key=f"{KEY}_server", width=320)
        connect = st.button("Connect", icon=":material/link:", key=f"{KEY}_connect", disabled=url is None, type="primary")
        disconnect = st.button("Disconnect", icon=":material/link_off:", key=f"{KEY}_disconnect")
    if url is None:
        st.info(f"This app connects only to the vLLM servers its operator lists in `{view.ENV_SERVERS}`, and none is "
                "listed. Watch a recorded observation instead.")
    live = st.session_state.get(f"{KEY}_live")
    if disconnect and live is not None:
        live.close()
        st.session_state.pop(f"{KEY}_live", None)
        live = None
    if connect and url is not None:
        if live is not None:
            live.close()
            st.session_state.pop(f"{KEY}_live", None)
            live = None
        try:
            live = view.LiveObservation(view.check_server(url, address))
            st.session_state[f"{KEY}_live"] = live
        except ConfigError as exc:
            st.error(str(exc))
    if live is None:
        if choices is None:
            st.caption("Start a server with `make vllm` (about 3 minutes on 2 cores), then Connect.")
        st.stop()

    @st.fragment(run_every=1.0)
    def live_view():
        step = live.pump()
        st.caption(f"Watching {live.url}: {live.observer.status_line()}"
                   + (f" | metrics: {live.observer.metrics_error}" if live.observer.metrics_error else ""))
        draw(live.observation, step, live=True)

    live_view()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_recording(Path(tmp) / "observation.jsonl", live.recording, live.recorder.header | {
            "observation": {"kind": "vllm-observation", "unknown": list(UNKNOWN), "medium": "GPU"}})
        st.download_button("Save this observation", path.read_bytes(), "vllm-observation.trace",
                           icon=":material/download:", key=f"{KEY}_save")
        st.caption("The observation so far as a pagedkv trace: open it here under Recorded observation.")
else:
    upload = st.session_state.get(f"{KEY}_upload")
    if upload is None:
        st.info("Open a recording (above) made with `python -m pagedkv_core observe --server URL --trace-out FILE`, "
                "or saved from a live observation here.")
        st.stop()
    loaded = st.session_state.get(f"{KEY}_loaded")
    if loaded is None or loaded[0] != (upload.name, upload.size):
        try:
            workshop.check_upload(upload, "observation")
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "observation.jsonl"
                path.write_bytes(upload.getvalue())
                obs = load_observation(path)
        except (ConfigError, TraceError) as exc:
            st.error(str(exc))
            st.stop()
        loaded = ((upload.name, upload.size), obs)
        st.session_state[f"{KEY}_loaded"] = loaded
    obs = loaded[1]
    player.controls(KEY, obs.num_steps)

    @st.fragment(run_every=player.interval(KEY))
    def replay_view():
        step = player.tick(KEY, obs.num_steps)
        player.slider(KEY, obs.num_steps)
        draw(obs, step, live=False)

    replay_view()
