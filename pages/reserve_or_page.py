"""Reserve or page: the same requests on the same memory, contiguous reservations beside paged blocks."""
from ui.lesson import page
from ui.lessons import reserve_or_page as lesson

page(
    lesson.LESSON,
    free_play_note="The same requests on the same KV memory, twice. **Left**: each request reserves room for its "
                   "longest possible answer in one contiguous piece. **Right**: paging hands out small blocks as tokens "
                   "arrive. Press **Play** and watch who gets to run.",
    takeaways="""
**What you are looking at**
- **Reservation waste** (orange on the left): the contiguous allocator reserves prompt + `max_tokens`
  slots at admission. Most answers stop long before `max_tokens`, so most of each reservation never
  holds a token, yet nobody else may use it.
- **External fragmentation** (dusty red on the left): free runs shorter than the reservation the head of
  the waiting queue needs, whatever their size. The head is admitted only into one free run at least that
  long (grey), at the start of the next step; while every free run is shorter, the queue waits although
  memory is free. The line under each pool says what the head needs and the largest free run.
- **Internal fragmentation** (orange on the right): paging allocates one block at a time, so only the
  unfilled end of each sequence's last block is empty: less than one block per sequence.
- The result: the paged side runs many more requests at once (*running*) and finishes the same work in
  fewer steps.
""",
)
