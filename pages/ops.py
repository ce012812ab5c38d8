"""Ops: the signals an operator watches on a serving loop, over the steps of the current run."""
from ui.lesson import page
from ui.lessons import ops as lesson

page(
    lesson.LESSON,
    intro=(
        "The signals of a healthy serving loop, named as vLLM exports them, for the current settings and "
        "workload on both allocators. Each chart says what healthy looks like and what a bad pattern means."
    ),
)
