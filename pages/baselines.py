"""Real traffic: the paper's baselines. Azure's production requests on the vLLM paper's three
contiguous Orca baselines and on paged blocks, with the memory-waste breakdown measured on each."""
from ui.lesson import page
from ui.lessons import baselines as lesson

page(
    lesson.LESSON,
    takeaways=(
        "The vLLM paper (Kwon et al., SOSP 2023) compares paging with three contiguous allocators in the style of "
        "Orca. **Orca Max** reserves room for the longest answer a request may write; **Orca Pow2** reserves the "
        "answer's real length rounded up to a power of two; **Orca Oracle** reserves exactly the answer's length. "
        "Pow2 and Oracle know each answer in advance, which no real server does: they bound how well reserving ahead "
        "could ever do. Here the same real requests, from Azure's production request log, run on all four."
    ),
)
