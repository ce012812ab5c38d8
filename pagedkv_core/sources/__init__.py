"""Token sources (:class:`~pagedkv_core.batch.TokenSource`): the scripted source for instant
runs, the checking KV oracle, and the real model (SmolLM2 through the paged KV pool)."""
