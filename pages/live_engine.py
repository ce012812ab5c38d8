"""Live engine: submit prompts to the paged engine running SmolLM2 and watch the text stream while
the blocks fill the pool. Select a request to see its block table as logical -> physical arrows."""
from ui.lesson import page
from ui.lessons import live_engine as lesson

page(
    lesson.LESSON,
    about=(
        "Submit a few prompts and press **Play**: the paged engine runs SmolLM2 one step at a time. Each step every "
        "running request gets one more token, and its K/V lands in a slot of the pool. When a request's last block is "
        "full the block manager hands it another one, from wherever the free list has one. **Hover** a cell to read the "
        "token it holds; **select** a request to see its block table."
    ),
)
