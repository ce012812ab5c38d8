"""Home: what pagedkv teaches, how to use it, and the KV-cache arithmetic of the loaded model."""
import pandas as pd
import streamlit as st

from pagedkv_core.sizing.kv_math import format_bytes
from ui import settings
from ui.models import loaded_model, model_kv_shape
from ui.pages_registry import lessons

st.title("pagedkv: see how an LLM server spends its KV-cache memory")
CARDS_PER_ROW = 4
lesson_pages = lessons()
for row in range(0, len(lesson_pages), CARDS_PER_ROW):  # the lessons first: something to click above the fold
    for col, page in zip(st.columns(CARDS_PER_ROW), lesson_pages[row:row + CARDS_PER_ROW]):
        with col.container(border=True, height="stretch"):
            st.markdown(f"**{page.lesson}. {page.title}**")
            st.caption(page.description)
            with st.container(horizontal=True, gap=None):
                st.page_link(page.path, label="Open", icon=page.icon, help="Free play: the sidebar's settings.")
                st.page_link(page.path, label="Guide", icon=":material/school:", query_params={"guide": "on"},
                             help="Open the lesson in guide mode: a fixed walkthrough with Next / Previous.")
                st.page_link(page.path, label="Slides", icon=":material/slideshow:", query_params={"present": "on"},
                             help="Open the guide as slides for a projector (presenter mode).")
st.markdown(
    """
Every token a language model has read or written leaves a **key** and a **value** vector in every
layer: the *KV cache*. A serving engine must find room for it before it can run a request, and how
it hands out that room decides how many requests fit at once.

This tool runs a **real** paged KV-cache engine (the design behind vLLM) on a real model,
SmolLM2-135M-Instruct, and draws its memory step by step, next to the older answer: reserve the
longest possible answer for each request in one contiguous piece.

**What you will see**
- *Reserve or page*: the same requests on the same memory, contiguous reservations beside paged blocks.
- Internal fragmentation (the unfilled end of a block), external fragmentation (holes between
  reservations) and reservation waste (space kept for tokens that never come).
- Prefix sharing, copy-on-write, preemption by swap or recompute, and how block size changes all of it.
- Real production traffic: how much of it a prefix cache can serve, how big the cache must be, and why a hit
  rate is low.

**How to use it**
1. Pick the engine settings in the sidebar; they apply to every page on its next run.
2. Open a page from the menu, press *Play* or *Step*, and drag the slider to scrub through the run.
3. Hover a cell of a heatmap to see which request owns it and the tokens it holds.
4. Set the player's speed (1 to 50 steps per second), or jump with *Next event* to the next admission,
   finish, preemption, swap-in, copy-on-write, cache hit or rejection; the strip under the slider marks them all.
5. In *Guide mode*, answer each **Predict:** question before the run shows the answer; the page then reveals
   what the run measured, and keeps count of your right answers. *Presenter mode* (or `?present=on` in a
   lesson's URL) turns the guide into slides for a projector, with ← and → for Previous and Next.
6. Every chart saves as a PNG (the camera in its toolbar), and each lesson's run downloads as one HTML file
   that plays its heatmaps offline.
"""
)

st.caption("The lessons above, in teaching order, each run on the real engine and each have a **Guide mode** (a fixed, "
           "seeded walkthrough with Next / Previous, so a workshop sees the same thing on every screen) and slides. "
           "The README's *40-minute workshop script* says which to open, in which mode, for how long.")

st.header("The KV-cache arithmetic of the loaded model")
lm = loaded_model()
if lm is not None:
    shape = model_kv_shape(lm)
    block_size = settings.current("block_size")
    per_token = {d: shape.bytes_per_token(d) for d in ("float32", "float16")}
    st.markdown(
        f"**{lm.name}**: {shape.num_layers} layers, {shape.num_heads} query heads sharing "
        f"{shape.num_kv_heads} KV heads (grouped-query attention, {shape.gqa_ratio} query heads per KV head), "
        f"head dimension {shape.head_dim}. Read from the model's own config."
    )
    st.latex(r"\text{bytes per token} = 2 \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim} \times \text{bytes per element}")
    rows = []
    for dtype, label in (("float32", "fp32 (4 B, the CPU engine)"), ("float16", "fp16 / bf16 (2 B, a GPU)")):
        b = per_token[dtype]
        rows.append({
            "element type": label,
            "bytes per token": f"2 × {shape.num_layers} × {shape.num_kv_heads} × {shape.head_dim} × {b // (2 * shape.num_layers * shape.num_kv_heads * shape.head_dim)} = {b:,} B",
            f"bytes per block ({block_size} tokens)": f"{shape.bytes_per_block(block_size, dtype):,} B ({format_bytes(shape.bytes_per_block(block_size, dtype))})",
            "tokens per GiB": f"{(1 << 30) // b:,}",
        })
    st.table(pd.DataFrame(rows).set_index("element type"))
    st.caption(
        f"A 2,048-slot pool of this model holds {format_bytes(2048 * per_token['float32'])} in fp32. "
        f"The block size comes from the sidebar (now {block_size}). Weights loaded from "
        f"{'a fresh conversion' if lm.converted else 'the local cache'} in {lm.load_seconds:.1f} s."
    )
