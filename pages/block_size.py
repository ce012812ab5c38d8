"""Block size and pool sizing: a sweep of block sizes 1..128 on one workload (scripted, instant), and a
pool calculator from a model's architecture (the loaded SmolLM2's real config, or a preset)."""
import streamlit as st

from ui import guide, presenter
from ui.lessons import block_size as lesson

guided = guide.mode(lesson.KEY, title="Block size and pool sizing")
if not presenter.on(lesson.KEY):
    st.markdown(
        "How many token slots should one block hold? Small blocks waste little of each sequence's last block but make "
        "long block tables; large blocks waste up to a block per sequence and share prefixes only in big steps. "
        f"Below, one workload runs at every block size from {lesson.BLOCK_SIZES[0]} to {lesson.BLOCK_SIZES[-1]} (on the "
        "scripted token source, so the sweep takes "
        "a moment), then a calculator turns a model's architecture and a memory budget into a pool."
    )
all_presets = lesson.presets()
config, workload, seed = lesson.sweep_settings(guided)
with st.spinner(f"Running the workload at {len(lesson.BLOCK_SIZES)} block sizes…"):
    points = lesson.sweep(config, workload, seed)

if guided:
    show = guide.nav(lesson.KEY, lesson.guide_steps(points, all_presets)).show
    if presenter.on(lesson.KEY):
        lesson.slide(points, all_presets, show, workload.name)
        st.stop()
    highlight, hidden = int(show["block_size"]), show.get("hide", ())
    fixed = all_presets.get(show["preset"]) or next(iter(all_presets.values()))
else:
    highlight, fixed, hidden = int(config.block_size), None, ()

st.header(f"One workload, {len(lesson.BLOCK_SIZES)} block sizes")
if guided:
    st.caption(f"Guide mode: {lesson.SHORT_CHAT_REQUESTS} short chat turns, a {config.pool_slots:,}-slot pool, the "
               "engine's default settings, whatever the sidebar says.")
else:
    st.caption(f"Workload: {workload.name} ({len(workload.requests)} requests). Other settings from the sidebar "
               f"({config.pool_slots:,} slots, watermark {config.watermark:.0%}, {config.preemption}). The dotted line "
               f"marks the sidebar's block size, {config.block_size}.")
lesson.sweep_charts(points, highlight, workload.name, hidden)
st.caption("Token utilization and waste are averaged over the steps in which anything was allocated. The prefix chart "
           f"runs a separate small workload: {len(lesson.preamble_workload().requests)} requests sharing a "
           f"{lesson.PREAMBLE_TOKENS}-token preamble, each with "
           "its own question; it counts the tokens each later request took from the prefix cache.")

st.header("Pool calculator")
st.markdown("How many blocks fit, and how many sequences run at once? Block size: "
            f"**{highlight}** ({'this guide step' if guided else 'the sidebar'}).")
lesson.calculator(all_presets, highlight, fixed=fixed)
