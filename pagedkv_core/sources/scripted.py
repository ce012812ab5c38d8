"""An instant token source: deterministic token ids, no model.

The token at output position ``p`` of sample ``i`` of request ``r`` is a pure function of
``(r, i, p)``, so a request's token stream is the same whatever the allocator, block size,
watermark or preemption mode; the scheduler stops it at the request's ``output_len`` (or
``max_tokens``, whichever comes first). It never emits an end-of-sequence token.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..batch import ScheduledBatch
from ..config import MAX_TOKEN_ID

VOCAB_SIZE = 49152
FIRST_TOKEN = 3  # ids below are special tokens (bos/eos/pad) in SmolLM2's vocabulary
_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The splitmix64 finaliser: a 64-bit integer to a well-mixed 64-bit integer (also the seed mixer
    of the real model's sampler and of the hashed request log's prompts)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


_request_keys: dict[str, int] = {}
MAX_KEPT_KEYS = 1 << 16


def _request_key(request_id: str) -> int:
    key = _request_keys.get(request_id)
    if key is None:
        key = splitmix64(zlib.crc32(request_id.encode("utf-8")) | (len(request_id) << 32))
        if len(_request_keys) >= MAX_KEPT_KEYS:
            # Full: start again, so that the requests running now are the ones kept (a log of a
            # million requests would otherwise compute every later request's key at every step).
            _request_keys.clear()
        _request_keys[request_id] = key
    return key


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """:func:`splitmix64` of each of a uint64 array (numpy's uint64 arithmetic wraps as ``& _MASK`` does)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _keys(request_ids: list[str]) -> np.ndarray:
    """The requests' keys (uint64): a dict lookup each, a call only for a key not kept."""
    known = _request_keys.get
    keys = [known(r) for r in request_ids]
    if None in keys:
        keys = [k if k is not None else _request_key(r) for k, r in zip(keys, request_ids)]
    return np.array(keys, dtype=np.uint64)


def scripted_tokens(request_ids: list[str], sample_indices: list[int], positions: list[int]) -> list[int]:
    """:func:`scripted_token` of each ``(request_ids[i], sample_indices[i], positions[i])``, computed
    for all of them at once (a step's plain decodes)."""
    return scripted_token_runs(request_ids, sample_indices, positions, 1).ravel().tolist()


def scripted_token_runs(request_ids: list[str], sample_indices: list[int], positions: list[int], steps: int) -> np.ndarray:
    """``(len(request_ids), steps)`` int64: row ``i`` holds :func:`scripted_token` of
    ``(request_ids[i], sample_indices[i], positions[i] + j)`` for ``j`` in ``range(steps)``."""
    base = _keys(request_ids) + np.array(sample_indices, dtype=np.uint64) * _GOLDEN
    at = np.array(positions, dtype=np.uint64)[:, None] + np.arange(steps, dtype=np.uint64)
    x = splitmix64_array(base[:, None] + (at << np.uint64(20)))
    return (x % np.uint64(VOCAB_SIZE - FIRST_TOKEN) + np.uint64(FIRST_TOKEN)).astype(np.int64)


def scripted_token(request_id: str, sample_index: int, position: int) -> int:
    """The scripted token id (in [FIRST_TOKEN, VOCAB_SIZE)) at an output position."""
    x = splitmix64((_request_key(request_id) + sample_index * 0x9E3779B97F4A7C15 + (position << 20)) & _MASK)
    return FIRST_TOKEN + x % (VOCAB_SIZE - FIRST_TOKEN)


class ScriptedSource:
    """TokenSource that writes no K/V and answers instantly. It reads a step's plain decodes as
    columns (``batch.lane``) and draws their tokens with numpy, all at once."""

    eos_token_id = None
    max_model_len = 1 << 20
    vocab_size = MAX_TOKEN_ID + 1  # prompts may carry any id an int32 slot can hold; answers use VOCAB_SIZE

    def __init__(self) -> None:
        self.num_slots = 0
        self.num_host_slots = 0
        self.steps = 0

    @property
    def reads_lane(self) -> bool:
        """True unless a subclass overrides :meth:`execute` (it then sees every sequence in ``batch.seqs``)."""
        return type(self).execute is ScriptedSource.execute

    @property
    def reads_slots(self) -> bool:
        """False unless a subclass overrides :meth:`execute`: this one writes no K/V, so it needs
        no slots nor block tables."""
        return type(self).execute is not ScriptedSource.execute

    @property
    def answers_runs(self) -> bool:
        """Whether :meth:`decode_run` gives the tokens :meth:`execute` would: unless a subclass
        overrides :meth:`execute`."""
        return type(self).execute is ScriptedSource.execute

    def decode_run(self, seqs: list, steps: int) -> np.ndarray:
        """The next ``steps`` tokens of each of ``seqs`` (running sequences that only decode), as
        ``steps`` calls of :meth:`execute` would answer them: ``(len(seqs), steps)`` int64."""
        self.steps += steps
        return scripted_token_runs([s.request.request_id for s in seqs], [s.sample_index for s in seqs],
                                   [len(s.token_ids) - s.num_prompt_tokens for s in seqs], steps)

    def bind(self, num_slots: int, num_host_slots: int) -> None:
        self.num_slots = num_slots
        self.num_host_slots = num_host_slots

    def execute(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        self.steps += 1
        out: dict[int, list[int]] = {}
        for work in batch.seqs:
            n = work.num_samples
            if n == 0:
                continue
            pos = work.num_output_tokens
            rid = work.request_id
            if n == 1:  # scripted_token, inlined for the common case
                x = splitmix64((_request_key(rid) + work.sample_index * 0x9E3779B97F4A7C15 + (pos << 20)) & _MASK)
                out[work.seq_id] = [FIRST_TOKEN + x % (VOCAB_SIZE - FIRST_TOKEN)]
            else:
                out[work.seq_id] = [scripted_token(rid, i, pos) for i in range(n)]
        lane = batch.lane
        if lane:
            lane.tokens = scripted_tokens(lane.request_ids, lane.sample_indices, lane.num_output_tokens)
        return out
