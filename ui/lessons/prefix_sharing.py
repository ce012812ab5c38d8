"""Lesson 3, prefix sharing and copy-on-write: requests A, B, C (three parallel samples) and D share
a ~620-token system prompt on the real model. The scenario, what each step shows (the pool, the
block tables, prefill computed vs skipped, the measured time to first token, the chained hashes
recomputed here), and the guide's narration, every number read from the recorded run."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.events import ADMIT, ALLOCATE, APPEND, CACHE_HIT, COW, FINISH, FORK
from pagedkv_core.kv.prefix_hash import hash_block
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sequence import SequenceStatus
from ui import export, player, presenter, settings
from ui.pool_cells import LEGEND, SLIDE_LEGEND, snapshot_heatmap
from ui.guide import GuideStep
from ui.lesson import Export, Lesson
from ui.predict import Prediction
from ui.lesson_figures import block_tables_grid, short_text, split_bars, value_bars
from ui.models import chat_prompt, token_text_lookup
from ui.runs.sidebar import settings_config
from ui.timed_runs import TimedRun, cached, new_timed_run
from ui.live_chart import show_chart

KEY = "prefix"
# the sidebar's defaults, so that explore mode with default settings reuses the guide's run
GUIDE_CONFIG = EngineConfig(block_size=16, pool_slots=2048)
GUIDE_SEED = 0
SPINNER = "Running A, B, C (n = 3) and D on SmolLM2: one long prefill, then a step per token…"

# ---------------------------------------------------------------------------- the scenario
# The system prompt that requests A, B, C and D share (~620 tokens with SmolLM2's chat template).
PREAMBLE = """You are Ada, the help-desk assistant of the Riverside Public Library. Follow these rules in every answer.

About the library. The Riverside Public Library has a main building on Elm Street and two branches, one in the Harbour district and one in Northfield. The main building is open from nine in the morning to eight in the evening on weekdays, and from ten to five on Saturdays. It is closed on Sundays and on public holidays. The branches open at ten and close at six, Monday to Saturday. The reading room on the second floor of the main building is a quiet zone: no phone calls, no group work and no food. The children's corner on the ground floor hosts a story hour every Wednesday at four. The makerspace in the basement has two 3D printers, a laser cutter and a sewing machine; members book it online for up to two hours a week after a short safety course.

Membership. Anyone who lives, works or studies in the city can join for free with a photo identity document and a proof of address. Visitors from elsewhere pay twenty dollars a year. A member card lets you borrow up to fifteen items at a time: books, audiobooks, films, board games and museum passes. Children under twelve need a parent or guardian to sign their application. Lost cards cost two dollars to replace.

Loans. Books and audiobooks are lent for three weeks, films and board games for one week, museum passes for three days. A loan can be renewed twice, online or at any desk, unless another member has reserved the item. Overdue books cost ten cents a day, up to a maximum of five dollars per item; children's books never collect fines. Items returned to any branch count as returned on the day they are dropped off. Members can reserve items that are out on loan; we send an email or a text message when a reserved item is ready, and we hold it for seven days.

Digital services. Members can borrow e-books and e-audiobooks through the library app, up to ten at a time, for two weeks each. Wi-Fi is free in every building and needs no password. Public computers can be booked for one hour a day, and printing costs ten cents a page in black and white and fifty cents in colour.

How to answer. Be friendly, brief and concrete: two or three sentences are usually enough. Give opening hours, prices and limits exactly as written above, and never invent a rule, a price or an event that is not listed here. If a question is not about the library, answer it briefly and kindly, then offer help with library services. If you do not know the answer, say so and suggest that the member call the front desk at 555-0142 or ask a librarian in person. Never ask for a member's password or card number. Write in plain English, without lists, headings or emojis, and sign nothing."""

# A and B share the preamble; C asks for 3 parallel samples; D comes after all of them have
# finished and still finds the preamble cached.
PREFIX_REQUESTS = [
    # (label, question, max_tokens, n, arrival step)
    ("A", "When does the main building open on Saturdays?", 12, 1, 0),
    ("B", "How much does it cost to replace a lost card?", 24, 1, 1),
    ("C", "Suggest a catchy name for the story hour.", 10, 3, 2),  # an odd length: its tail block is partial
]
LATE_REQUEST = ("D", "Can I print in colour?", 8, 1)
PARALLEL_TEMPERATURE = 0.7


def prefix_sharing_run(make_engine, tokenizer, config: EngineConfig, seed: int = 0) -> TimedRun:
    """Requests A, B, C (n=3, sampled) and then D, all with the same ~620-token preamble."""
    rec = new_timed_run("prefix sharing", config, make_engine)
    for label, question, max_tokens, n, arrival in PREFIX_REQUESTS:
        sampling = (SamplingParams(max_tokens=max_tokens) if n == 1 else
                    SamplingParams(max_tokens=max_tokens, n=n, temperature=PARALLEL_TEMPERATURE, seed=seed))
        rec.add(label, chat_prompt(tokenizer, question, PREAMBLE), sampling, label=label, text=question,
                arrival_step=arrival)
    rec.run()
    label, question, max_tokens, n = LATE_REQUEST
    rec.add(label, chat_prompt(tokenizer, question, PREAMBLE), SamplingParams(max_tokens=max_tokens), label=label,
            text=question)
    return rec.run().release()


def explore_settings() -> tuple[EngineConfig, int]:
    """Explore mode's config and seed from the sidebar (st.error and stop when they are invalid)."""
    try:
        config = settings_config("paged")
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    seed = int(settings.current("seed"))
    st.caption(f"Explore mode: sidebar settings (blocks of {config.block_size}, {config.pool_slots:,} slots, prefix "
               f"caching {'on' if config.prefix_caching else 'off'}, seed {seed}). Guide mode uses blocks of "
               f"{GUIDE_CONFIG.block_size}, {GUIDE_CONFIG.pool_slots:,} slots, caching on.")
    return config, seed


# ---------------------------------------------------------------------------- one step, drawn
class PrefixView:
    """Draws one step of the recorded run ``rec``; ``text_of`` maps a token id to its text."""

    def __init__(self, rec: TimedRun, text_of):
        self.rec = rec
        self.text_of = text_of
        self.ids = rec.request_ids
        self.bs = rec.config.block_size

    def seq_label(self, snap, i: int) -> str:
        rid = self.ids[int(snap.seq_request[i])]
        return f"{rid} sample {int(snap.seq_sample[i]) + 1}" if self.rec.requests[rid].n > 1 else rid

    def block_text(self, snap, b: int, limit: int = 48) -> str:
        fill = int(snap.block_fill[b])
        toks = snap.slot_token[b * self.bs: b * self.bs + fill]
        return short_text("".join(self.text_of(int(t)) for t in toks if t >= 0), limit)

    def decode(self, toks: list[int]) -> str:
        return "".join(self.text_of(t) for t in toks).replace("<|im_end|>", " ⟨end⟩").replace("\n", " ")

    def describe(self, e) -> str:
        """One line on an engine event, in the lesson's words ("" for nothing worth saying)."""
        d = e.detail
        who = e.request_id
        if e.kind == CACHE_HIT:
            return f"**{who}**: prefix-cache hit on {len(d['blocks'])} blocks = {d['tokens']} tokens whose K/V is already in the pool"
        if e.kind == ADMIT:
            p = len(self.rec.requests[who].prompt_ids)
            return (f"**{who}** admitted: {p} prompt tokens, {d['cached_tokens']} from the cache, "
                    f"{p - d['cached_tokens']} computed in this step")
        if e.kind == FORK:
            return f"**{who}** forks a sample: it shares all {len(d['blocks'])} blocks (ref counts go up, nothing is copied)"
        if e.kind == COW:
            return (f"**{who}** copy-on-write: block {d['src']} is shared, so it is copied to block {d['dst']} "
                    f"before this sample writes its own token into it")
        if e.kind == FINISH:
            return f"**{who}** finished ({d['reason']}, {d['output_tokens']} tokens): its references are dropped"
        if e.kind == ALLOCATE:
            return f"**{who}** allocated {len(d['blocks'])} fresh block(s)" if d["blocks"] else ""
        if e.kind == APPEND:
            return f"**{who}** appended block {', '.join(map(str, d['blocks']))} (its last block was full)"
        return f"**{who}** {e.kind.replace('_', ' ')}"

    def hash_rows(self, snap, focus: str) -> list[dict]:
        """The focus request's blocks with their chained hashes, each checked here by recomputing
        hash(parent hash, the block's tokens) from the tokens the snapshot says the block holds."""
        idx = self.ids.index(focus)
        bs = self.bs
        rows = []
        for i in range(len(snap.seq_id)):
            if int(snap.seq_request[i]) != idx:
                continue
            parent = 0
            for j, b in enumerate(snap.block_table(int(snap.seq_id[i]))):
                h = int(snap.block_hash[b])
                fill = int(snap.block_fill[b])
                toks = [int(t) for t in snap.slot_token[b * bs: b * bs + fill]]
                if h:
                    check = "✓ matches" if hash_block(parent, toks) == h else "✗ differs"
                else:
                    check = "partial: not hashed" if fill < bs else "not hashed (caching off)"
                rows.append({
                    "logical": j, "physical": b, "ref count": int(snap.block_ref[b]), "filled": f"{fill}/{bs}",
                    "parent hash": f"{parent & (2**64 - 1):016x}" if h else "",
                    "block hash = H(parent, tokens)": f"{h & (2**64 - 1):016x}" if h else "",
                    "recomputed here": check, "tokens": self.block_text(snap, b, 40),
                })
                parent = h
            break  # one sample is enough: they share every full block
        return rows

    def pool_figure(self, snap):
        return snapshot_heatmap(snap, self.ids, f"{snap.num_slots:,} KV slots at step {snap.step}", token_text=self.text_of,
                                height=430)[0]

    def tables_figure(self, snap):
        rows = [(self.seq_label(snap, i), snap.block_table(int(snap.seq_id[i]))) for i in range(len(snap.seq_id))
                if int(snap.seq_status[i]) == SequenceStatus.RUNNING]
        return block_tables_grid(rows, snap.block_ref, snap.block_fill, self.bs,
                                 f"Block tables of the running sequences at step {snap.step}",
                                 hover_extra=lambda b: "tokens: " + self.block_text(snap, b))

    def prefill_figure(self, snap):
        """Prompt tokens computed vs skipped of every request that has its first token by ``snap``'s step (None: none yet)."""
        rec = self.rec
        arrived = [rid for rid in self.ids if rec.requests[rid].arrival_step <= snap.step
                   and rec.first_token_step(rid) is not None and rec.first_token_step(rid) <= snap.step]
        if not arrived:
            return None
        comp = [rec.prefill_tokens(r)[0] for r in arrived]
        skip = [rec.prefill_tokens(r)[1] for r in arrived]
        parts = {"computed (forward pass)": comp, "skipped (prefix-cache hit)": skip}
        return split_bars([f"{r}: {c} computed" for r, c in zip(arrived, comp)], parts,
                          {"computed (forward pass)": "#1d4ed8", "skipped (prefix-cache hit)": "#93c5fd"},
                          "Prompt tokens at admission: computed vs skipped", "prompt tokens")

    def slide(self, show: dict) -> None:
        """Presenter mode: the step's one figure: the block tables (default), the pool or the prefill bars."""
        snap = self.rec.at(int(show["step"]))
        which = show.get("figure", "tables")
        fig = self.prefill_figure(snap) if which == "prefill" else None
        if fig is None and which == "pool":
            fig = self.pool_figure(snap)
        presenter.slide(fig if fig is not None else self.tables_figure(snap), KEY,
                        SLIDE_LEGEND if which == "pool" else None)

    def draw(self, step: int, focus: str) -> None:
        rec, ids, bs = self.rec, self.ids, self.bs
        snap = rec.at(step)
        m = snap.metrics
        shared = int((snap.block_ref > 1).sum()) if len(snap.block_ref) else 0
        c = st.columns(5)
        c[0].metric("step", f"{snap.step} of {rec.last_step}")
        c[1].metric("shared blocks (ref > 1)", shared, help="blocks referenced by more than one sequence right now")
        c[2].metric("highest ref count", int(snap.block_ref.max()) if len(snap.block_ref) else 0)
        c[3].metric("tokens from the cache", f"{m.prefix_hit_tokens:,}",
                    help="prompt tokens whose K/V came from the prefix cache instead of a forward pass")
        c[4].metric("copy-on-write so far", len(rec.events(COW, upto=step)))

        lines = [t for t in (self.describe(e) for e in snap.events) if t]
        left, right = st.columns([1, 1])
        with left:
            show_chart(self.pool_figure(snap), f"{KEY}_heat", config=export.png_config(f"{KEY}-pool"))
            st.caption(LEGEND + ". Hover a cell for the token it holds.")
        with right:
            st.markdown(f"**What happened in step {snap.step}** (the engine's events)")
            st.markdown("\n".join(f"- {t}" for t in lines) if lines else "- decode: every running sample added one token")

        show_chart(self.tables_figure(snap), f"{KEY}_tables", config=export.png_config(f"{KEY}-block-tables"))
        st.caption("Each row is one sequence's block table; a cell's number is the physical block it points to. "
                   "Pale blue blocks are private; orange and darker blocks are shared by 2, 3, … sequences.")
        self._prefill_bars(snap)

        st.markdown(f"**Chained hashes of {focus}'s blocks at step {snap.step}**: each full block's hash covers its "
                    "parent's hash and its own tokens, so equal hashes mean an equal *history*, not only equal tokens. "
                    "The *recomputed here* column hashes each block's tokens again, on this page.")
        rows = self.hash_rows(snap, focus)
        if rows:
            st.dataframe(rows, hide_index=True, width="stretch", height=260)
        else:
            st.caption(f"{focus} holds no blocks at step {snap.step} (not arrived yet, or finished).")

        outs = rec.outputs_at(step)
        st.markdown(f"**SmolLM2's answers at step {snap.step}**")
        cols = st.columns(len(ids))
        for col, rid in zip(cols, ids):
            info = rec.requests[rid]
            with col.container(border=True):
                st.markdown(f"**{rid}**: *{info.text}*")
                for k, toks in enumerate(outs[rid]):
                    tag = f"sample {k + 1}: " if info.n > 1 else ""
                    st.markdown(f"{tag}{self.decode(toks) if toks else '…'}")

    def _prefill_bars(self, snap) -> None:
        """Prompt tokens computed vs skipped, and the measured time to first token, of every request
        that has its first token by this step."""
        rec = self.rec
        arrived = [rid for rid in self.ids if rec.requests[rid].arrival_step <= snap.step
                   and rec.first_token_step(rid) is not None and rec.first_token_step(rid) <= snap.step]
        if not arrived:
            return
        left, right = st.columns(2)
        skip = [rec.prefill_tokens(r)[1] for r in arrived]
        with left:
            show_chart(self.prefill_figure(snap), f"{KEY}_prefill", config=export.png_config(f"{KEY}-prefill"))
        with right:
            ttft = [rec.ttft_s(r) for r in arrived]
            fig = value_bars(arrived, ttft, "Measured time to first token", "seconds (wall time of the engine steps)",
                             lambda v: f"{v:.2f} s", colors=["#1d4ed8" if s == 0 else "#60a5fa" for s in skip])
            show_chart(fig, f"{KEY}_ttft", config=export.png_config(f"{KEY}-ttft"))


# ---------------------------------------------------------------------------- guide
D_CACHE_OPTIONS = ("yes: all of the preamble's full blocks", "only part of it", "no: its blocks were freed with the requests")


def common_prefix(rec: TimedRun) -> int:
    """Tokens A's and B's prompts agree on from the start: the preamble with the chat template around it."""
    pa, pb = rec.requests["A"].prompt_ids, rec.requests["B"].prompt_ids
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    return n


def takeaways(rec: TimedRun) -> str:
    """The lesson's take-away points, their numbers read off the run."""
    bs = rec.config.block_size
    common = common_prefix(rec)
    _, b_skip = rec.prefill_tokens("B")
    return f"""
**What to take away**
- A block's hash chains its parent's hash and its own tokens, so a lookup of one hash certifies the whole prefix.
- Only **full blocks** are shared: with blocks of {bs}, A's and B's {common}-token common prefix (the system prompt in
  its chat template) shares {b_skip} tokens, {b_skip // bs} whole blocks; the other {common - b_skip} sit in a block
  that also holds the start of each question. Bigger blocks share less.
- Forked samples share every block for free; a shared block is copied only when one of them must write into it.
- Finished requests drop their references; shared and cached blocks stay until the pool needs the room.
"""


def guide_steps(rec: TimedRun) -> list[GuideStep]:
    """The walkthrough over the recorded run; every step number and every answer is read off it."""
    bs = rec.config.block_size
    a_comp, _ = rec.prefill_tokens("A")
    b_comp, b_skip = rec.prefill_tokens("B")
    _, d_skip = rec.prefill_tokens("D")
    pa, pb = rec.requests["A"].prompt_ids, rec.requests["B"].prompt_ids
    preamble_common = common_prefix(rec)
    fork_step = rec.events(FORK)[0][0]
    cow_step = rec.events(COW)[0][0]
    cows = [e for s, e in rec.events(COW) if s == cow_step]
    copies = " and ".join(f"block {e.detail['src']} → {e.detail['dst']}" for e in cows)
    n_c = rec.requests["C"].n
    a_done = rec.finish_step("A")
    c_done = rec.finish_step("C")
    b_done = rec.finish_step("B")
    d_arr = rec.requests["D"].arrival_step
    ta, tb, td = rec.ttft_s("A"), rec.ttft_s("B"), rec.ttft_s("D")
    d_answer = D_CACHE_OPTIONS[0] if d_skip >= b_skip > 0 else (D_CACHE_OPTIONS[1] if d_skip else D_CACHE_OPTIONS[2])
    return [
        GuideStep("A arrives", f"A's prompt is {len(pa)} tokens: the preamble plus a question. Nothing is cached yet, so "
                  f"the model computes all {a_comp} tokens in one prefill; its first token takes {ta:.2f} s (measured). "
                  f"Its {len(pa) // bs} full blocks are hashed as they fill. (The guide runs with blocks of {bs} on "
                  f"{rec.config.pool_slots:,} slots, whatever the sidebar says.)", {"step": 0, "focus": "A"}),
        GuideStep("A chain of hashes", "Each full block of A has a hash: block 1's hash is computed from block 0's hash and "
                  f"block 1's {bs} tokens, block 2's from block 1's, and so on. A block's hash therefore names its whole "
                  "history: the same tokens after a different preamble get a different hash. (Outside presenter mode "
                  "the page lists A's chain of hashes under the block tables.)", {"step": 0, "focus": "A"}),
        GuideStep("B arrives", f"B arrives with the same preamble and its own question: {len(pb)} prompt tokens. A's "
                  f"full blocks are in the pool, each under its chained hash; the engine looks B's blocks up, {bs} "
                  "tokens at a time, before it computes anything.", {"step": 0, "focus": "A", "figure": "prefill"},
                  predict=Prediction(
                      "prefix_b_computed", f"Predict: how many of B's {len(pb)} prompt tokens will the model compute?",
                      b_comp, f"B's first {b_skip // bs} block hashes match A's, so {b_skip} tokens come from the cache "
                      f"and only {b_comp} are computed: the block where the preamble meets B's own question, and the "
                      f"question: {b_comp} tokens of work instead of A's {a_comp}. (Its first token came "
                      f"after {tb:.2f} s of measured wall time, A's after {ta:.2f} s: a wall time also counts "
                      "the other requests' work in the same step and the machine's load.)", tolerance=bs,
                      unit="tokens"),
                  reveal={"step": 1, "focus": "B"}),
        GuideStep("B reuses A's blocks", f"B's block table points at A's physical blocks (ref count 2) for its first "
                  f"{b_skip // bs} blocks: {b_comp} tokens computed instead of {a_comp}. Measured wall time to its "
                  f"first token: {tb:.2f} s, against {ta:.2f} s for A (a step's wall time also counts the other "
                  "requests decoding in it and the machine's load).",
                  {"step": 1, "focus": "B", "figure": "prefill"}),
        GuideStep("Only whole blocks are shared", f"A and B agree on their first {preamble_common} tokens, but only "
                  f"{b_skip} = {b_skip // bs} × {bs} are shared: the last {preamble_common - b_skip} common tokens sit in a "
                  "block that also holds the start of each question, and a block is shared whole or not at all.",
                  {"step": 1, "focus": "B"}),
        GuideStep(f"C forks into {n_c} samples", f"C asks for {n_c} samples (n = {n_c}, temperature "
                  f"{PARALLEL_TEMPERATURE}). It reuses the preamble too; after its prefill it forks: the samples share "
                  "every block, including the partly filled tail block (the rows C sample 1 to "
                  f"{n_c} point at the same physical blocks). Next, each sample writes its own next token.",
                  {"step": fork_step, "focus": "C"},
                  predict=Prediction(
                      "prefix_cow_copies", f"Predict: when C's {n_c} samples each write their next token, how many "
                      "blocks will be copied?", len(cows),
                      f"Only the partly filled tail block is written, and a shared block must be copied before a write: "
                      f"{copies}; the last sample keeps the original, now private, and the full blocks stay shared.",
                      unit="blocks"),
                  reveal={"step": cow_step}),
        GuideStep("Copy-on-write", "Each sample must now write its own next token into the shared tail block (even two "
                  "samples that drew the same token are separate sequences from here on). Writing into a shared block would "
                  f"change it for the others, so the block manager copies it first: {copies}; the last sample keeps the "
                  "original, now private. Only the partly filled tail is copied: the full blocks stay shared.",
                  {"step": cow_step, "focus": "C"}),
        GuideStep("A finishes", "A is done. Its private blocks (the tail with its question and its answer) go back to the "
                  "pool; the preamble blocks survive because B and C still reference them: their ref counts drop by one.",
                  {"step": a_done, "focus": "B"}),
        GuideStep("B continues alone", "C has finished too. B keeps running on the shared preamble blocks, now with ref "
                  "count 1: sharing costs nothing once the others leave.", {"step": c_done, "focus": "B"}),
        GuideStep("The cache outlives the requests", "B finished: no request runs. The preamble's blocks are free, yet "
                  "still hashed (pale blue in the pool): reusable until a new allocation needs the room. D, with the "
                  "same preamble, arrives next.", {"step": b_done, "focus": "B", "figure": "pool"},
                  predict=Prediction(
                      "prefix_d_cached", "Predict: D arrives after every other request has finished. Will it find the "
                      "preamble in the prefix cache?", d_answer,
                      f"D skipped {d_skip} prompt tokens (B skipped {b_skip}): freed blocks keep their hash until an "
                      f"allocation needs them, so D's first token came after {td:.2f} s.", options=D_CACHE_OPTIONS),
                  reveal={"step": d_arr, "focus": "D", "figure": "prefill"}),
        GuideStep("D finds the preamble cached", f"D arrives after everyone has left and still skips {d_skip} prompt "
                  f"tokens: its first token after {td:.2f} s. A shared system prompt is paid for once per server, not "
                  "once per request.", {"step": d_arr, "focus": "D", "figure": "prefill"}),
    ]


# ---------------------------------------------------------------------------- the page
def scenario(guided: bool) -> PrefixView:
    """A, B, C (n = 3) and D on SmolLM2: the guide's fixed config and seed, or the sidebar's. Stops
    (saying why) when the pool does not fit or the run has no step."""
    config, seed = (GUIDE_CONFIG, GUIDE_SEED) if guided else explore_settings()
    try:
        rec = cached(prefix_sharing_run, config, seed, spinner=SPINNER)
    except ConfigError as exc:  # the sidebar's pool does not fit the memory budget (BudgetError)
        st.error(str(exc))
        st.stop()
    if rec is None:
        st.stop()
    for rid, reason in rec.rejected.items():
        st.error(f"Request {rid} was rejected: {reason}")
    if not rec.num_steps:
        st.stop()
    return PrefixView(rec, token_text_lookup())


def lesson_steps(view: PrefixView) -> list[GuideStep]:
    try:
        return guide_steps(view.rec)
    except (IndexError, KeyError, TypeError):
        st.error("The guide's fixed run did not produce the expected events.")
        st.stop()


def guide_view(view: PrefixView, show: dict) -> None:
    view.draw(int(show["step"]), show["focus"])
    st.markdown(takeaways(view.rec))


def explore(view: PrefixView) -> None:
    n = view.rec.num_steps
    player.controls(KEY, n, runs=[view.rec])

    @st.fragment(run_every=player.interval(KEY))
    def show() -> None:
        step = player.tick(KEY, n)
        player.slider(KEY, n, runs=[view.rec])
        focus = st.radio("Hash chain of", view.ids, horizontal=True, key=f"{KEY}_focus")
        view.draw(step, focus)

    show()
    st.markdown(takeaways(view.rec))


def export_files(view: PrefixView) -> Export:
    return Export([view.rec], "Prefix sharing and copy-on-write: A, B, C (n = 3) and D on SmolLM2", "prefix-sharing")


LESSON = Lesson(key=KEY, title="Prefix sharing and copy-on-write", scenario=scenario, guide_steps=lesson_steps,
                guide_view=guide_view, slide=lambda view, show: view.slide(show), explore=explore, export=export_files)
