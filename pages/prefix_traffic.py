"""Prefix cache on real traffic: Mooncake's production conversation log on the paged engine. Why a
hit rate is low: the cache is too small, or the reuse is shorter than one block."""
from ui.lesson import page
from ui.lessons import prefix_traffic as lesson

page(
    lesson.LESSON,
    intro=(
        "How much of real traffic can a prefix cache serve, how big must the cache be, and why is a hit rate low? "
        "Mooncake's FAST'25 release publishes an hour of Kimi's production conversation requests with one hash id per "
        "512-token prompt block, so equal ids mean a reusable prefix. Here those requests run on the paged engine, and "
        "a replay of their hash ids measures every cache size."
    ),
    takeaways="""
**What to take away**
- A hit rate is low for one of two reasons: the cache is **too small** for how late the reuse comes back, or the reuse
  is **shorter than one block** (a block is cached only when full, found only when all of it matches).
- The capacity curve tells them apart: a curve that keeps climbing wants a bigger cache; a low ceiling with no limit
  means there is little reuse, or it is cut into blocks too big to share.
- Belady's optimum knows the future: the gap between it and LRU is all a cleverer eviction could win.
- Running sequences hold part of the pool, so a serving engine's cache is always smaller than its pool.
""",
)
