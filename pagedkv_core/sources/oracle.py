"""A checking token source: simulates what the KV pool holds and verifies every read.

Each slot of a simulated device pool (and host pool) records the (token id, position) whose
K/V a real model would have written there. Every step applies the batch's swap-out, swap-in
and copy-on-write copies in the documented order, writes the new tokens at their slots, and
then checks that every sequence's context, read through its block table, is exactly its own
tokens at their positions. That certifies block tables, prefix-cache hits, copy-on-write and
swapping end to end, for either allocator. Tokens come from a wrapped source (scripted by
default). Used by the tests; handy for a new token source too.
"""
from __future__ import annotations

import numpy as np

from ..batch import ScheduledBatch
from .scripted import ScriptedSource


class KVCheckError(AssertionError):
    pass


class KVOracleSource:
    def __init__(self, inner=None):
        self.inner = inner if inner is not None else ScriptedSource()
        self.eos_token_id = self.inner.eos_token_id
        self.max_model_len = self.inner.max_model_len
        self.vocab_size = self.inner.vocab_size
        self.engine = None
        self.reads_checked = 0

    def attach(self, engine) -> "KVOracleSource":
        """The engine whose sequences hold the true token lists."""
        self.engine = engine
        return self

    def bind(self, num_slots: int, num_host_slots: int) -> None:
        self.dev_tok = np.full(num_slots, -1, dtype=np.int64)
        self.dev_pos = np.full(num_slots, -1, dtype=np.int64)
        self.host_tok = np.full(max(num_host_slots, 1), -1, dtype=np.int64)
        self.host_pos = np.full(max(num_host_slots, 1), -1, dtype=np.int64)
        self.inner.bind(num_slots, num_host_slots)

    def execute(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        if self.engine is None:
            raise KVCheckError("KVOracleSource.attach(engine) was not called")
        bs = batch.block_size
        for d, h in batch.swap_out:
            self.host_tok[h * bs : (h + 1) * bs] = self.dev_tok[d * bs : (d + 1) * bs]
            self.host_pos[h * bs : (h + 1) * bs] = self.dev_pos[d * bs : (d + 1) * bs]
        for h, d in batch.swap_in:
            self.dev_tok[d * bs : (d + 1) * bs] = self.host_tok[h * bs : (h + 1) * bs]
            self.dev_pos[d * bs : (d + 1) * bs] = self.host_pos[h * bs : (h + 1) * bs]
        for s, d in batch.copies:
            self.dev_tok[d * bs : (d + 1) * bs] = self.dev_tok[s * bs : (s + 1) * bs]
            self.dev_pos[d * bs : (d + 1) * bs] = self.dev_pos[s * bs : (s + 1) * bs]
        written: set[int] = set()
        contexts = []
        for w in batch.seqs:
            seq = self.engine.sequence(w.seq_id)
            tokens = seq.token_ids
            k = len(w.token_ids)
            if k < 1 or len(w.slots) != k:
                raise KVCheckError(f"seq {w.seq_id}: {k} tokens but {len(w.slots)} slots")
            if w.token_ids != tokens[w.start_pos : w.start_pos + k]:
                raise KVCheckError(f"seq {w.seq_id}: batch tokens differ from the sequence's at {w.start_pos}")
            if w.num_output_tokens != seq.num_output_tokens:
                raise KVCheckError(f"seq {w.seq_id}: num_output_tokens {w.num_output_tokens} != {seq.num_output_tokens}")
            ctx = w.context_len
            table = np.asarray(w.block_table, dtype=np.int64)
            if len(table) != -(-ctx // bs):
                raise KVCheckError(f"seq {w.seq_id}: block table of {len(table)} blocks for context {ctx}")
            pos = np.arange(ctx)
            slots = table[pos // bs] * bs + pos % bs
            if (slots < 0).any() or (slots >= len(self.dev_tok)).any():
                raise KVCheckError(f"seq {w.seq_id}: slot out of range")
            if slots[w.start_pos :].tolist() != list(w.slots):
                raise KVCheckError(f"seq {w.seq_id}: slots {w.slots} do not follow the block table")
            for s in w.slots:
                if s in written:
                    raise KVCheckError(f"slot {s} written twice in step {batch.step}")
                written.add(s)
            self.dev_tok[w.slots] = w.token_ids
            self.dev_pos[w.slots] = np.arange(w.start_pos, ctx)
            contexts.append((w.seq_id, slots, tokens[:ctx]))
        for seq_id, slots, want in contexts:
            got_tok = self.dev_tok[slots]
            got_pos = self.dev_pos[slots]
            if got_tok.tolist() != want or (got_pos != np.arange(len(slots))).any():
                bad = int(np.flatnonzero((got_tok != np.asarray(want)) | (got_pos != np.arange(len(slots))))[0])
                raise KVCheckError(
                    f"step {batch.step}: seq {seq_id} reads token {int(got_tok[bad])}@{int(got_pos[bad])} "
                    f"at position {bad} (slot {int(slots[bad])}), expected {want[bad]}"
                )
            self.reads_checked += len(slots)
        return self.inner.execute(batch)
