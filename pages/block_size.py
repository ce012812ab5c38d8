"""Block size and pool sizing: a sweep of block sizes 1..128 on one workload (scripted, instant), and a
pool calculator from a model's architecture (the loaded SmolLM2's real config, or a preset)."""
from ui.lesson import page
from ui.lessons import block_size as lesson

page(
    lesson.LESSON,
    intro=(
        "How many token slots should one block hold? Small blocks waste little of each sequence's last block but make "
        "long block tables; large blocks waste up to a block per sequence and share prefixes only in big steps. "
        f"Below, one workload runs at every block size from {lesson.BLOCK_SIZES[0]} to {lesson.BLOCK_SIZES[-1]} (on the "
        "scripted token source, so the sweep takes "
        "a moment), then a calculator turns a model's architecture and a memory budget into a pool."
    ),
)
