"""pagedkv: a vLLM-style paged KV-cache engine, small enough to read.

The engine (:mod:`.engine`) steps requests through a scheduler (:mod:`.scheduler`) over a KV
allocator chosen from :data:`.allocator.ALLOCATORS`, with every setting and its rule in
:mod:`.config`. Tokens come from a :class:`~.batch.TokenSource`: the scripted source
(:mod:`.scripted`) for instant runs, or the real model (:mod:`.model`) behind :class:`.llm.LLM`.
The command line is :mod:`.cli` (``python -m pagedkv_core`` or ``pagedkv``).

Nothing is imported here, so that ``import pagedkv_core.config`` stays cheap and torch loads
only with the model.
"""

__version__ = "0.1.0"
