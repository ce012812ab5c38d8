"""Lesson 2, the live engine: prompts submitted to the paged engine running SmolLM2, the text as it
streams, the pool as it fills, and one request's block table as logical -> physical arrows."""
from __future__ import annotations

import math
from dataclasses import dataclass

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.events import APPEND, FINISH
from pagedkv_core.workloads.prompts import CHAT_PROMPTS
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sequence import STATUS_NAMES
from pagedkv_core.record.slot_state import SlotState
from ui import export, player, presenter
from ui.pool_cells import LEGEND, SLIDE_LEGEND, free_pool_heatmap, snapshot_heatmap
from ui.guide import GuideStep
from ui.lesson import Export, Lesson
from ui.predict import Prediction
from ui.lesson_figures import block_table_arrows, most_advanced, short_text
from ui.models import EngineFactory, chat_prompt, engine_factory, model_path, token_text_lookup
from ui.runs.sidebar import settings_config
from ui.timed_runs import TimedRun, cached, new_timed_run
from ui.live_chart import show_chart

KEY = "live"
GUIDE_CONFIG = EngineConfig(block_size=16, pool_slots=512, watermark=0.01, prefix_caching=True)
GUIDE_QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primary colours."]
GUIDE_MAX_TOKENS = 16
MAX_PROMPT_CHARS = 20_000


def guide_run(make_engine, tokenizer, config: EngineConfig) -> TimedRun:
    """The guide's scenario: three chat prompts arrive together, greedy, 16 tokens each."""
    rec = new_timed_run("live guide", config, make_engine)
    for i, q in enumerate(GUIDE_QUESTIONS):
        rec.add(f"q{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=GUIDE_MAX_TOKENS), text=q, arrival_step=0)
    return rec.run().release()


def status_of(rec: TimedRun, snap, rid: str, step: int) -> str:
    if rid in rec.rejected and rec.requests[rid].arrival_step <= step:
        return "rejected"
    if snap is not None:
        idx = rec.request_ids.index(rid)
        states = [int(s) for r, s in zip(snap.seq_request, snap.seq_status) if int(r) == idx]
        if states:
            return STATUS_NAMES[most_advanced(states)]
    if any(rec.outputs_at(step)[rid]) and rec.requests[rid].arrival_step <= step:
        return "finished"
    return "queued"


class LiveView:
    """Draws one step of a live (or the guide's) run; ``text_of`` maps a token id to its text."""

    def __init__(self, text_of):
        self.text_of = text_of

    def decode(self, ids: list[int]) -> str:
        return "".join(self.text_of(t) for t in ids).replace("<|im_end|>", " ⟨end⟩")

    def block_arrows(self, rec: TimedRun, snap, rid: str):
        idx = rec.request_ids.index(rid)
        rows = [i for i in range(len(snap.seq_id)) if int(snap.seq_request[i]) == idx]
        if not rows:
            return None
        table = snap.block_table(int(snap.seq_id[rows[0]]))
        bs = snap.block_size
        fills = [int(snap.block_fill[b]) for b in table]
        refs = [int(snap.block_ref[b]) for b in table]
        texts = [short_text("".join(self.text_of(int(t)) for t in snap.slot_token[b * bs: b * bs + f] if t >= 0), 80)
                 for b, f in zip(table, fills)]
        fig = block_table_arrows(table, fills, bs, f"{rid}: block table at step {snap.step}", texts, refs)
        return fig, table, fills

    def pool_figure(self, rec: TimedRun, snap):
        cfg = rec.config
        if snap is None:
            n = cfg.pool_slots
            return free_pool_heatmap(n, cfg.block_size, f"{n:,} KV slots: all free (nothing submitted yet)", height=440)[0]
        return snapshot_heatmap(snap, rec.request_ids, f"{snap.num_slots:,} KV slots in blocks of {snap.block_size}, "
                                f"at step {snap.step}", token_text=self.text_of, height=440)[0]

    def slide(self, rec: TimedRun, show: dict) -> None:
        """Presenter mode: the pool, or (``figure`` = ``table``) the selected request's block table."""
        snap = rec.at(int(show["step"]))
        drawn = self.block_arrows(rec, snap, show["select"]) if show.get("figure") == "table" else None
        if drawn is not None:
            presenter.slide(drawn[0], KEY)
        else:
            presenter.slide(self.pool_figure(rec, snap), KEY, SLIDE_LEGEND)

    def render(self, rec: TimedRun, step: int, selected: str | None) -> None:
        cfg = rec.config
        snap = rec.at(step) if rec.num_steps else None
        c = st.columns(6)
        if snap is not None:
            m = snap.metrics
            c[0].metric("step", snap.step)
            c[1].metric("running", m.num_running)
            c[2].metric("waiting", m.num_waiting)
            c[3].metric("KV usage", f"{m.kv_usage:.0%}", help="allocated blocks / pool")
            c[4].metric("tokens generated", m.tokens_generated)
            c[5].metric("this step took", f"{rec.step_wall_s(step) * 1000:.0f} ms",
                        help="measured wall time of engine.step(): the model's forward pass and the bookkeeping")
        left, right = st.columns([3, 2])
        with left:
            fig = self.pool_figure(rec, snap)
            show_chart(fig, f"{KEY}_heat", config=export.png_config(f"{KEY}-pool"))
            st.caption(LEGEND)
        with right:
            if snap is None or selected is None:
                st.info("Submit a prompt to see its block table here.")
            else:
                self._block_table(rec, snap, selected, step)
        if not rec.requests:
            return
        st.markdown(f"**SmolLM2's answers at step {snap.step if snap is not None else 0}**")
        outs = rec.outputs_at(step)
        ids = rec.request_ids
        cols = st.columns(min(3, len(ids)))
        for k, rid in enumerate(ids):
            info = rec.requests[rid]
            status = status_of(rec, snap, rid, step)
            with cols[k % len(cols)].container(border=True):
                ttft = rec.ttft_s(rid)
                first = rec.first_token_step(rid)
                extra = f" · first token after {ttft:.2f} s" if ttft is not None and first is not None and first <= step else ""
                st.markdown(f"**{rid}** · {status} · {len(info.prompt_ids)} prompt tokens{extra}  \n"
                            f"*{short_text(info.text, 90)}*")
                if status == "rejected":
                    st.error(rec.rejected[rid])
                else:
                    st.markdown(self.decode(outs[rid][0]) if outs[rid] and outs[rid][0] else "…")

    def _block_table(self, rec: TimedRun, snap, selected: str, step: int) -> None:
        drawn = self.block_arrows(rec, snap, selected)
        if drawn is None:
            st.markdown(f"**{selected}** holds no blocks at step {snap.step} ({status_of(rec, snap, selected, step)}).")
            return
        fig, table, fills = drawn
        show_chart(fig, f"{KEY}_arrows", config=export.png_config(f"{KEY}-block-table"))
        tokens = int(sum(fills))
        bs = snap.block_size
        st.caption(f"{selected} holds {tokens} tokens in {len(table)} blocks of {bs}: "
                   f"{math.ceil(tokens / bs)} = ⌈{tokens} / {bs}⌉. Its last block "
                   f"(yellow) holds {fills[-1]} of {bs}; the other {bs - fills[-1]} slots wait for the next tokens."
                   + (" Orange: blocks shared with another request (prefix cache)." if any(
                       int(snap.block_ref[b]) > 1 for b in table) else ""))


# ---------------------------------------------------------------------------- guide
def last_block_fill(snap, request_index: int) -> tuple[list[int], list[int]]:
    """(block table, fill of each block) of the request's first sample in ``snap`` (empty when it holds none)."""
    rows = [i for i in range(len(snap.seq_id)) if int(snap.seq_request[i]) == request_index]
    if not rows:
        return [], []
    table = snap.block_table(int(snap.seq_id[rows[0]]))
    return table, [int(snap.block_fill[b]) for b in table]


def guide_steps(rec: TimedRun) -> list[GuideStep]:
    """The walkthrough over the fixed run; every step number and every answer is read off the run."""
    ids = rec.request_ids
    first = ids[0]
    p0 = len(rec.requests[first].prompt_ids)
    bs = rec.config.block_size
    last = rec.last_step
    appends = rec.events(APPEND)
    finishes = rec.events(FINISH)
    fin_step, fin_ev = finishes[0] if finishes else (last, None)
    # The new block the guide asks about: the first append that does not fall in the finish
    # question's window (the step before the first finish and the finish), so that neither
    # question's answer lies between the other's question and answer.
    apart = [a for a in appends if fin_ev is None or not fin_step - 1 <= a[0] <= fin_step]
    app_step, app_ev = apart[0] if apart else (appends[0] if appends else (1, None))
    ask_block = bool(apart)
    total_tokens = rec.at(last).metrics.tokens_generated
    total_s = sum(rec.wall_s)
    grow = app_ev.request_id if app_ev else first
    fin = fin_ev.request_id if fin_ev else first
    n = len(ids)

    def running_at(step: int, prefer: str) -> str:
        """``prefer`` if it is still running at ``step``, else the first request that is (the figure
        then shows a live block table, not a finished request)."""
        snap = rec.at(step)
        live = [ids[int(r)] for r, st_ in zip(snap.seq_request, snap.seq_status) if STATUS_NAMES[int(st_)] == "running"]
        return prefer if prefer in live or not live else live[0]

    longest = max(ids, key=lambda r: len(rec.requests[r].prompt_ids))
    decode_step = min(1, last)
    if app_ev is not None and decode_step >= app_step - 1:  # not between the block question and its answer
        decode_step = app_step
    cfg = rec.config
    steps = [
        GuideStep(f"{n} prompts arrive", f"{n} chat prompts arrive together and are prefilled in one step. {first}'s "
                  f"prompt is {p0} tokens (the chat template adds a system line), so it takes ⌈{p0} / {bs}⌉ = "
                  f"{math.ceil(p0 / bs)} blocks and its last block holds {p0 - (math.ceil(p0 / bs) - 1) * bs} of {bs}. "
                  "The first token of each answer comes out of the same step. (The guide runs these prompts on its own "
                  f"pool of {cfg.pool_slots:,} slots in blocks of {bs}, whatever the sidebar says.)",
                  {"step": 0, "select": first, "figure": "table"}),
        GuideStep("What a cell holds", "Every cell of the heatmap is one token slot: the K and V vectors of one token in "
                  "every layer of the model. Hover a coloured cell to read its token. The orange cells at the end of each "
                  "request are allocated but still empty: that is the only waste paging leaves, less than one block per "
                  "request.", {"step": 0, "select": ids[1 % n]}),
    ]
    block_question = None
    if app_ev is not None and ask_block:
        # Asked at the latest step the guide has shown before the new block, so that the guide never
        # goes back in time: from the first prompts' step, decoding and (when it comes first) a finish.
        shown = [0, decode_step] + ([fin_step - 1, fin_step] if fin_ev is not None and fin_step >= 1 else [])
        at = max([s for s in shown if s < app_step], default=0)
        _, fills0 = last_block_fill(rec.at(at), ids.index(grow))
        f0 = fills0[-1] if fills0 else 0
        block_question = GuideStep(
            "When is the block full?", f"Look at {grow}'s block table after step {at}: its last block (yellow) holds "
            f"{f0} of {bs} slots. From now on every step writes one more token of each answer into the pool.",
            {"step": at, "select": grow, "figure": "table"},
            predict=Prediction(
                "live_new_block", f"Predict: at which step will {grow} need a new block?", app_step,
                (f"After step {at} its last block held {f0} of {bs} slots; one token per step filled the other "
                 f"{bs - f0} by step {app_step - 1}, so at step {app_step} its next token needed a fresh block."
                 if f0 < bs else f"After step {at} its last block was already full ({f0} of {bs} slots), so its very "
                 f"next token, at step {app_step}, needed a fresh block."),
                tolerance=1),
            reveal={"step": app_step})
    steps += [
        GuideStep("Decoding", f"Step {decode_step}: every step adds one token to every running request: the answers "
                  "below grow token by token, and so does the filled part of each last block.",
                  {"step": decode_step, "select": running_at(decode_step, first)}),
        GuideStep("A new block", f"At step {app_step} {grow}'s last block was full, so the block manager appended a fresh "
                  f"one{' (physical block ' + str(app_ev.detail['blocks'][0]) + ')' if app_ev else ''}. Blocks are "
                  "allocated one at a time, only when a token needs one.",
                  {"step": app_step, "select": grow, "figure": "table"}),
        GuideStep("Logical to physical", f"{running_at(app_step, longest)}'s block table maps its logical blocks 0, 1, 2, … (positions in the "
                  "sequence) to physical blocks in the pool. They need not be neighbours: attention reads the K/V "
                  "through this table, so any free block will do.",
                  {"step": app_step, "select": running_at(app_step, longest), "figure": "table"}),
    ]
    if fin_ev is not None and fin_step >= 1:
        table, fills = last_block_fill(rec.at(fin_step - 1), ids.index(fin))
        after = rec.at(fin_step)
        cached_blocks = sum(1 for b in table if int(after.block_state[b]) == SlotState.CACHED)
        partial = [f for f in fills if f < bs]
        steps.append(GuideStep(
            "Before the finish", f"{fin} is about to finish: it holds {len(table)} blocks (its block table on the right). "
            "With prefix caching on, a block that is full has a hash, so a later request with the same tokens could "
            "find it.", {"step": fin_step - 1, "select": fin, "figure": "table"},
            predict=Prediction(
                "live_cached_blocks", f"Predict: when {fin} finishes, how many of its {len(table)} blocks will stay in "
                "the pool as cached blocks (pale blue)?", cached_blocks,
                f"Only full blocks carry a hash: its {cached_blocks} full blocks stay cached, reusable until the pool "
                "needs the room" + (f"; its last block, {partial[-1]}/{bs} full, is simply freed." if partial else "."),
                unit="blocks"),
            reveal={"step": fin_step}))
    steps += [
        GuideStep("A request finishes", f"At step {fin_step} {fin} finished "
                  f"({(fin_ev.detail['reason'] if fin_ev else 'length')}). Its blocks go back to the pool at once; the "
                  "full ones keep their hash and show pale blue: a later request with the same prefix can reuse them.",
                  {"step": fin_step, "select": fin}),
        GuideStep("Measured", f"All done after {last + 1} steps: {total_tokens} tokens generated in {total_s:.1f} s of "
                  f"measured engine time on this machine ({total_tokens / max(total_s, 1e-9):.1f} tokens/s, all {n} "
                  "requests batched together).", {"step": last, "select": ids[-1]}),
    ]
    steps = sorted(steps, key=lambda g: g.show["step"])  # forward through the run, never back
    if block_question is not None:  # after the steps it follows, before the new block it asks about
        i = next((k for k, g in enumerate(steps) if g.show["step"] > block_question.show["step"]), len(steps))
        steps.insert(i, block_question)
    return steps


# ---------------------------------------------------------------------------- explore
def live_recording(config: EngineConfig, make: EngineFactory) -> TimedRun:
    """The session's live run on ``config``; a fresh engine (empty pool) when the settings changed."""
    key = (config, model_path())
    held = st.session_state.get(f"_{KEY}_rec")
    if held and held[0] == key:
        return held[1]
    rec = new_timed_run("live", config, make)
    if held:
        st.info("The engine settings changed, so a fresh engine (with an empty pool) took over.")
    st.session_state[f"_{KEY}_rec"] = (key, rec)
    st.session_state[f"{KEY}_step"] = 0
    player.stop(KEY)
    return rec


def submit_form(rec: TimedRun, tokenizer) -> None:
    with st.form(f"{KEY}_form", border=True, clear_on_submit=True):
        c = st.columns([3, 3, 1.4])
        picks = c[0].multiselect("Pick example prompts", CHAT_PROMPTS, key=f"{KEY}_picks",
                                 placeholder="Choose one or more")
        own = c[1].text_area("…or type your own (one prompt)", key=f"{KEY}_own", height=90, max_chars=MAX_PROMPT_CHARS)
        max_tokens = c[2].number_input("max tokens", 1, 256, 24, key=f"{KEY}_max_tokens",
                                       help="The longest answer each request may get.")
        sent = st.form_submit_button("Submit", type="primary", icon=":material/send:")
    if not sent:
        return
    prompts = list(picks) + ([own.strip()] if own and own.strip() else [])
    if not prompts:
        st.error("Nothing to submit: pick an example prompt or type one.")
        return
    for text in prompts:
        rid = f"r{len(rec.requests)}"
        rec.add(rid, chat_prompt(tokenizer, text), SamplingParams(max_tokens=int(max_tokens)), text=text)
    st.session_state[f"{KEY}_selected"] = rec.request_ids[len(rec.request_ids) - len(prompts)]
    player.start(KEY)


@dataclass(frozen=True)
class Live:
    """What the page draws: the guide's recorded run, or the session's live one on the sidebar's
    ``config`` (None in guide mode), stepped by engines from ``make``."""
    view: LiveView
    rec: TimedRun
    make: EngineFactory
    config: EngineConfig | None = None


def scenario(guided: bool) -> Live:
    """The guide's three prompts, run once and cached; else the session's live run on the sidebar's
    engine. Stops (saying why) when the model cannot load or the settings are invalid."""
    make = engine_factory()
    if make is None:
        st.stop()
    view = LiveView(token_text_lookup())
    if guided:
        rec = cached(guide_run, GUIDE_CONFIG, spinner=f"Running the guide's {len(GUIDE_QUESTIONS)} prompts on SmolLM2, "
                     f"up to {GUIDE_MAX_TOKENS} tokens each…")
        if rec is None:
            st.stop()
        return Live(view, rec, make)
    try:
        config = settings_config("paged")
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    try:
        rec = live_recording(config, make)
    except ConfigError as exc:  # the real-model pool would not fit the session's memory budget
        st.error(str(exc))
        st.stop()
    return Live(view, rec, make, config)


def explore(live: Live) -> None:
    """The submit form, and the player that steps the model while playing."""
    view, rec, make, config = live.view, live.rec, live.make, live.config
    submit_form(rec, make.tokenizer)
    c = st.columns([6, 1.3])
    c[0].caption(f"Engine: blocks of {config.block_size}, {config.pool_slots:,} slots, watermark {config.watermark:.0%}, "
                 f"prefix caching {'on' if config.prefix_caching else 'off'} (from the sidebar). Greedy decoding. "
                 "New engine drops every request and starts again with an empty pool.")
    if c[1].button("New engine", icon=":material/restart_alt:", key=f"{KEY}_clear", width="stretch"):
        st.session_state.pop(f"_{KEY}_rec", None)
        st.rerun()
    player.controls(KEY, max(1, rec.num_steps), can_grow=not rec.done, runs=[rec])

    @st.fragment(run_every=player.interval(KEY))
    def live_view() -> None:
        cur = int(st.session_state.get(f"{KEY}_step", 0))
        if rec.requests and not rec.done:
            need = cur + (2 if player.is_playing(KEY) else 1)
            if rec.num_steps < need:
                with st.spinner("SmolLM2 is computing the next step…"):
                    rec.step()
        n = max(1, rec.num_steps)
        step = player.tick(KEY, n, can_grow=bool(rec.requests) and not rec.done)
        player.slider(KEY, n, runs=[rec] if rec.num_steps else None)
        for rid, reason in rec.rejected.items():
            if rec.requests[rid].arrival_step <= step:
                st.error(f"{rid} was rejected: {reason}")
        ids = rec.request_ids
        selected = None
        if ids:
            if st.session_state.get(f"{KEY}_selected") not in ids:
                st.session_state[f"{KEY}_selected"] = ids[0]
            selected = st.selectbox("Show the block table of", ids, key=f"{KEY}_selected",
                                    format_func=lambda r: f"{r}: {short_text(rec.requests[r].text, 60)}")
        view.render(rec, step, selected)

    live_view()


def export_files(live: Live) -> Export | None:
    if live.config is None:
        return Export([live.rec], "Live engine: three chat prompts on SmolLM2", "live-engine")
    return Export([live.rec], "Live engine: the prompts submitted on this page", "live-engine") if live.rec.num_steps else None


LESSON = Lesson(key=KEY, title="Live engine", scenario=scenario, guide_steps=lambda live: guide_steps(live.rec),
                guide_view=lambda live, show: live.view.render(live.rec, int(show["step"]), show["select"]),
                slide=lambda live, show: live.view.slide(live.rec, show), explore=explore, export=export_files)
