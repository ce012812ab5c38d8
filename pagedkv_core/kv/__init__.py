"""KV allocation: the allocator contract and registry, the block pool with its prefix-cache
index and eviction policies, the paged allocator, the contiguous baselines, and the change log
in which every allocator records what it changed."""
