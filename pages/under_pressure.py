"""Under pressure: the same load spike on a pool too small for it, run twice on the real model,
once preempting by swap and once by recompute. Every cost on the page is measured from the runs."""
from ui.lesson import page
from ui.lessons import under_pressure as lesson

page(
    lesson.LESSON,
    about=(
        f"A load spike on a small KV pool, run **twice** on SmolLM2 with the same requests and greedy decoding: "
        f"{lesson.PRESSURE_FIRST} requests start at step 0 and {len(lesson.PRESSURE_QUESTIONS) - lesson.PRESSURE_FIRST} "
        f"more arrive together at step {lesson.PRESSURE_SPIKE_STEP}, each answering up to {lesson.PRESSURE_MAX_TOKENS} "
        "tokens. When the running sequences need a block that is not there, the scheduler must **preempt** one of "
        "them (which one? the guide asks you to predict it). **Swap** copies its blocks to host memory and back later; "
        "**recompute** frees them and prefills its tokens again when it returns. The two runs are stepped in turn, so "
        "both share the machine's load."
    ),
)
