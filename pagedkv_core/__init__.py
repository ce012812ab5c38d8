"""pagedkv: a vLLM-style paged KV-cache engine, small enough to read.

The engine, in reading order, lives at the top: :mod:`.config`, :mod:`.sequence`,
:mod:`.sampling`, :mod:`.batch`, :mod:`.scheduler`, :mod:`.engine`, :mod:`.outputs`,
:mod:`.metrics`, :mod:`.events` and :mod:`.llm` (the offline API over the real model).
The folders group the rest by job:

- :mod:`.kv`: the allocator contract and registry, the block pool, prefix hashes, eviction,
  the paged and contiguous allocators, and the change log;
- :mod:`.record`: snapshots, delta recordings and their codec, trace files, waste, pool view;
- :mod:`.workloads`: scenarios, JSON workloads, request logs (CSV, JSONL) and their prompts;
- :mod:`.sources`: token sources (scripted, the KV oracle, the real model);
- :mod:`.sizing`: KV arithmetic, memory budgets, pool plans;
- :mod:`.observe`: a real vLLM server's KV events and metrics, and our own publisher;
- :mod:`.cli`: ``python -m pagedkv_core`` (or ``pagedkv``).

Nothing is imported here, so that ``import pagedkv_core.config`` stays cheap and torch loads
only with the model.
"""

__version__ = "0.1.0"
