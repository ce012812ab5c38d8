"""One module per lesson page: its scenario, the numbers it shows, its guide's narration and its
drawing. The page script in ``pages/`` keeps the prose and the flow (guide or explore) and calls in
here, so tests and benchmarks reach a lesson's logic without running a page."""
