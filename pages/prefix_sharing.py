"""Prefix sharing and copy-on-write: requests A, B, C (three parallel samples) and D share a
~620-token system prompt on the real model. Every number is read from the recorded run."""
from ui.lesson import page
from ui.lessons import prefix_sharing as lesson

page(
    lesson.LESSON,
    about=(
        "Four requests to a library help desk start with the **same long system prompt** (its length in tokens "
        "is measured below). "
        "**A** arrives first and pays for all of it. **B** follows with the same preamble: the engine finds "
        "A's blocks by their chained hash and skips their prefill. **C** asks for **three samples** (n = 3), "
        "which share every block until each writes its own token: copy-on-write. **D** comes after everyone "
        "has finished and still finds the preamble cached. SmolLM2 runs every step for real."
    ),
)
