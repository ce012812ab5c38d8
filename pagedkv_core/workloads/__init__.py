"""Requests to run: seeded scenarios, JSON workload files, request logs (Azure CSV, Mooncake
JSONL with prefix hashes), the prompts made for them, and the ideal-prefix-cache replay."""
