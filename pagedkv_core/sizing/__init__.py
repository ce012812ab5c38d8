"""Sizing: KV bytes per token and per block, memory budgets and byte-bounded caches, and the
plan of a real model's KV pools before anything is allocated."""
