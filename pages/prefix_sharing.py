"""Prefix sharing and copy-on-write: requests A, B, C (three parallel samples) and D share a
~620-token system prompt on the real model. Every number is read from the recorded run."""
import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.events import ADMIT, CACHE_HIT, COW, FINISH, FORK
from pagedkv_core.prefix_hash import hash_block
from pages import guide, lesson_runs, player
from pages.common import token_text_lookup
from pages.guide import GuideStep
from pages.lesson_viz import block_tables_grid, short_text, split_bars, value_bars
from pages.runs import settings_config
from pages.viz import LEGEND, pool_heatmap, slot_hover_text

KEY = "prefix"
# the sidebar's defaults, so that explore mode with default settings reuses the guide's run
GUIDE_CONFIG = EngineConfig(block_size=16, pool_slots=2048, watermark=0.01, swap_slots=1024, prefix_caching=True, seed=0)
GUIDE_SEED = 0

st.title("Prefix sharing and copy-on-write")
st.markdown(
    "Four requests to a library help desk start with the **same ~620-token system prompt**. "
    "**A** arrives first and pays for all of it. **B** follows with the same preamble: the engine finds "
    "A's blocks by their chained hash and skips their prefill. **C** asks for **three samples** (n = 3), "
    "which share every block until each writes its own token: copy-on-write. **D** comes after everyone "
    "has finished and still finds the preamble cached. SmolLM2 runs every step for real."
)

guided = guide.mode(KEY)
if guided:
    config, seed = GUIDE_CONFIG, GUIDE_SEED
else:
    try:
        config = settings_config("paged")
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    seed = int(st.session_state.get("seed", 0))
    st.caption(f"Explore mode: sidebar settings (blocks of {config.block_size}, {config.pool_slots:,} slots, prefix "
               f"caching {'on' if config.prefix_caching else 'off'}, seed {seed}). Guide mode uses blocks of 16, "
               "2,048 slots, caching on.")

rec = lesson_runs.cached("prefix", config, seed,
                         spinner="Running A, B, C (n = 3) and D on SmolLM2: a 640-token prefill, then about 30 steps…")
if rec is None:
    st.stop()
for rid, reason in rec.rejected.items():
    st.error(f"Request {rid} was rejected: {reason}")
if not rec.snapshots:
    st.stop()

ids = rec.request_ids
label_of = {rid: rec.requests[rid].label for rid in ids}
text_of = token_text_lookup()
bs = config.block_size


def seq_label(snap, i: int) -> str:
    rid = ids[int(snap.seq_request[i])]
    n = rec.requests[rid].n
    return f"{rid} sample {int(snap.seq_sample[i]) + 1}" if n > 1 else rid


def block_text(snap, b: int, limit: int = 48) -> str:
    fill = int(snap.block_fill[b])
    toks = snap.slot_token[b * bs: b * bs + fill]
    return short_text("".join(text_of(int(t)) for t in toks if t >= 0), limit)


def describe(e, snap) -> str:
    d = e.detail
    who = e.request_id
    if e.kind == CACHE_HIT:
        return f"**{who}**: prefix-cache hit on {len(d['blocks'])} blocks = {d['tokens']} tokens whose K/V is already in the pool"
    if e.kind == ADMIT:
        p = len(rec.requests[who].prompt_ids)
        return (f"**{who}** admitted: {p} prompt tokens, {d['cached_tokens']} from the cache, "
                f"{p - d['cached_tokens']} computed in this step")
    if e.kind == FORK:
        return f"**{who}** forks a sample: it shares all {len(d['blocks'])} blocks (ref counts go up, nothing is copied)"
    if e.kind == COW:
        return (f"**{who}** copy-on-write: block {d['src']} is shared, so it is copied to block {d['dst']} "
                f"before this sample writes its own token into it")
    if e.kind == FINISH:
        return f"**{who}** finished ({d['reason']}, {d['output_tokens']} tokens): its references are dropped"
    if e.kind == "allocate":
        return f"**{who}** allocated {len(d['blocks'])} fresh block(s)" if d["blocks"] else ""
    if e.kind == "append":
        return f"**{who}** appended block {', '.join(map(str, d['blocks']))} (its last block was full)"
    return f"**{who}** {e.kind.replace('_', ' ')}"


def hash_rows(snap, focus: str) -> list[dict]:
    """The focus request's blocks with their chained hashes, each checked here by recomputing
    hash(parent hash, the block's tokens) from the tokens the snapshot says the block holds."""
    idx = ids.index(focus)
    rows = []
    for i in range(len(snap.seq_id)):
        if int(snap.seq_request[i]) != idx:
            continue
        table = snap.block_table(int(snap.seq_id[i]))
        parent = 0
        for j, b in enumerate(table):
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
                "recomputed here": check, "tokens": block_text(snap, b, 40),
            })
            parent = h
        break  # one sample is enough: they share every full block
    return rows


def lesson(step: int, focus: str) -> None:
    snap = rec.at(step)
    m = snap.metrics
    shared = int((snap.block_ref > 1).sum()) if len(snap.block_ref) else 0
    cows = len(rec.events(COW, upto=step))
    c = st.columns(5)
    c[0].metric("step", f"{snap.step} of {len(rec.snapshots) - 1}")
    c[1].metric("shared blocks (ref > 1)", shared, help="blocks referenced by more than one sequence right now")
    c[2].metric("highest ref count", int(snap.block_ref.max()) if len(snap.block_ref) else 0)
    c[3].metric("tokens from the cache", f"{m.prefix_hit_tokens:,}",
                help="prompt tokens whose K/V came from the prefix cache instead of a forward pass")
    c[4].metric("copy-on-write so far", cows)

    lines = [t for t in (describe(e, snap) for e in snap.events) if t]
    left, right = st.columns([1, 1])
    with left:
        hover = slot_hover_text(snap, ids, text_of)
        fig = pool_heatmap(snap.slot_state, snap.slot_owner, hover, bs, f"{snap.num_slots:,} KV slots at step {snap.step}",
                           shared_mask=snap.slot_state == 4, height=430)
        st.plotly_chart(fig, width="stretch", key=f"{KEY}_heat", config={"displayModeBar": False})
        st.caption(LEGEND + ". Hover a cell for the token it holds.")
    with right:
        st.markdown(f"**What happened in step {snap.step}** (the engine's events)")
        st.markdown("\n".join(f"- {t}" for t in lines) if lines else "- decode: every running sample added one token")

    rows = [(seq_label(snap, i), snap.block_table(int(snap.seq_id[i]))) for i in range(len(snap.seq_id))
            if int(snap.seq_status[i]) == 1]
    fig = block_tables_grid(rows, snap.block_ref, snap.block_fill, bs,
                            f"Block tables of the running sequences at step {snap.step}",
                            hover_extra=lambda b: "tokens: " + block_text(snap, b))
    st.plotly_chart(fig, width="stretch", key=f"{KEY}_tables", config={"displayModeBar": False})
    st.caption("Each row is one sequence's block table; a cell's number is the physical block it points to. "
               "Pale blue blocks are private; orange and darker blocks are shared by 2, 3, … sequences.")

    arrived = [rid for rid in ids if rec.requests[rid].arrival_step <= snap.step and rec.first_token_step(rid) is not None
               and rec.first_token_step(rid) <= snap.step]
    if arrived:
        left, right = st.columns(2)
        comp = [rec.prefill_tokens(r)[0] for r in arrived]
        skip = [rec.prefill_tokens(r)[1] for r in arrived]
        with left:
            fig = split_bars([f"{r}: {c} computed" for r, c in zip(arrived, comp)], {"computed (forward pass)": comp, "skipped (prefix-cache hit)": skip},
                             {"computed (forward pass)": "#1d4ed8", "skipped (prefix-cache hit)": "#93c5fd"},
                             "Prompt tokens at admission: computed vs skipped", "prompt tokens")
            st.plotly_chart(fig, width="stretch", key=f"{KEY}_prefill", config={"displayModeBar": False})
        with right:
            ttft = [rec.ttft_s(r) for r in arrived]
            fig = value_bars(arrived, ttft, "Measured time to first token", "seconds (wall time of the engine steps)",
                             lambda v: f"{v:.2f} s", colors=["#1d4ed8" if s == 0 else "#60a5fa" for s in skip])
            st.plotly_chart(fig, width="stretch", key=f"{KEY}_ttft", config={"displayModeBar": False})

    st.markdown(f"**Chained hashes of {focus}'s blocks at step {snap.step}**: each full block's hash covers its "
                "parent's hash and its own tokens, so equal hashes mean an equal *history*, not only equal tokens. "
                "The *recomputed here* column hashes each block's tokens again, on this page.")
    rows = hash_rows(snap, focus)
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
                body = rec_tokenizer_decode(toks) if toks else "…"
                st.markdown(f"{tag}{body}")


def rec_tokenizer_decode(toks: list[int]) -> str:
    return "".join(text_of(t) for t in toks).replace("<|im_end|>", " ⟨end⟩").replace("\n", " ")


# ---------------------------------------------------------------------------- guide
def guide_steps() -> list[GuideStep]:
    a_comp, _ = rec.prefill_tokens("A")
    b_comp, b_skip = rec.prefill_tokens("B")
    _, d_skip = rec.prefill_tokens("D")
    preamble_common = 0
    pa, pb = rec.requests["A"].prompt_ids, rec.requests["B"].prompt_ids
    while preamble_common < min(len(pa), len(pb)) and pa[preamble_common] == pb[preamble_common]:
        preamble_common += 1
    fork_step = rec.events(FORK)[0][0]
    cow_step = rec.events(COW)[0][0]
    cows = [e for s, e in rec.events(COW) if s == cow_step]
    copies = " and ".join(f"block {e.detail['src']} → {e.detail['dst']}" for e in cows)
    a_done = rec.finish_step("A")
    c_done = rec.finish_step("C")
    b_done = rec.finish_step("B")
    d_arr = rec.requests["D"].arrival_step
    ta, tb, td = rec.ttft_s("A"), rec.ttft_s("B"), rec.ttft_s("D")
    return [
        GuideStep("A arrives", f"A's prompt is {len(pa)} tokens: the preamble plus a question. Nothing is cached yet, so "
                  f"the model computes all {a_comp} tokens in one prefill; its first token takes {ta:.2f} s (measured). "
                  f"Its {len(pa) // 16} full blocks are hashed as they fill.", {"step": 0, "focus": "A"}),
        GuideStep("A chain of hashes", "Look at the hash table below: block 1's hash is computed from block 0's hash and "
                  "block 1's 16 tokens, block 2's from block 1's, and so on. A block's hash therefore names its whole "
                  "history: the same 16 tokens after a different preamble get a different hash.", {"step": 0, "focus": "A"}),
        GuideStep("B reuses A's blocks", f"B arrives with the same preamble. Its first {b_skip // 16} block hashes match "
                  f"A's, so B's block table points at A's physical blocks (ref count 2) and only {b_comp} tokens are "
                  f"computed: first token after {tb:.2f} s instead of {ta:.2f} s.", {"step": 1, "focus": "B"}),
        GuideStep("Only whole blocks are shared", f"A and B agree on their first {preamble_common} tokens, but only "
                  f"{b_skip} = {b_skip // 16} × 16 are shared: the last {preamble_common - b_skip} common tokens sit in a "
                  "block that also holds the start of each question, and a block is shared whole or not at all.",
                  {"step": 1, "focus": "B"}),
        GuideStep("C forks into three samples", "C asks for three samples (n = 3, temperature 0.7). It reuses the preamble "
                  "too; after its prefill it forks: the three samples share every block, including the partly filled "
                  "tail block (the rows C sample 1-3 point at the same physical blocks).", {"step": fork_step, "focus": "C"}),
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
                  "still hashed (pale blue in the pool): reusable until a new allocation needs the room.",
                  {"step": b_done, "focus": "B"}),
        GuideStep("D finds the preamble cached", f"D arrives after everyone has left and still skips {d_skip} prompt "
                  f"tokens: its first token after {td:.2f} s. A shared system prompt is paid for once per server, not "
                  "once per request.", {"step": d_arr, "focus": "D"}),
    ]


if guided:
    try:
        steps = guide_steps()
    except (IndexError, KeyError, TypeError):
        st.error("The guide's fixed run did not produce the expected events.")
        st.stop()
    g = guide.nav(KEY, steps)
    lesson(int(g.show["step"]), g.show["focus"])
else:
    player.controls(KEY, len(rec.snapshots))

    @st.fragment(run_every=player.interval(KEY))
    def explore() -> None:
        step = player.tick(KEY, len(rec.snapshots))
        player.slider(KEY, len(rec.snapshots))
        focus = st.radio("Hash chain of", ids, horizontal=True, key=f"{KEY}_focus")
        lesson(step, focus)

    explore()

st.markdown(
    """
**What to take away**
- A block's hash chains its parent's hash and its own tokens, so a lookup of one hash certifies the whole prefix.
- Only **full blocks** are shared: with blocks of 16 a 637-token common prefix shares 624 tokens. Bigger blocks share less.
- Forked samples share every block for free; a shared block is copied only when one of them must write into it.
- Finished requests drop their references; shared and cached blocks stay until the pool needs the room.
"""
)
