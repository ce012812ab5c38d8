"""Chained hashes of full blocks: the keys of the prefix cache.

The hash of block ``i`` covers the hash of block ``i - 1``, the block's own token ids and
extra keys (an adapter id, a cache salt): a match certifies the whole history, not only
this block's tokens. BLAKE2b with an 8-byte digest makes the value stable across processes
(a trace written today reads back with the same hashes) and collisions negligible.
"""
from __future__ import annotations

from array import array
from hashlib import blake2b

NO_HASH = 0  # "not hashed" in snapshot arrays; a real hash is never 0


def hash_block(parent_hash: int, token_ids, extra_keys: tuple = ()) -> int:
    """Signed 64-bit hash of one full block, chained to its parent's hash (0 for the first)."""
    h = blake2b(digest_size=8)
    h.update(parent_hash.to_bytes(8, "little", signed=True))
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(tuple(extra_keys)).encode())
    value = int.from_bytes(h.digest(), "little", signed=True)
    return value or 1


def extend_block_hashes(hashes: list[int], token_ids: list[int], block_size: int, num_blocks: int, extra_keys: tuple = ()) -> list[int]:
    """Grow ``hashes`` (in place) to cover the first ``num_blocks`` full blocks of ``token_ids``:
    the values of :func:`hash_block`, chained, with the new blocks' tokens converted to bytes at once."""
    num_blocks = min(num_blocks, len(token_ids) // block_size)
    first = len(hashes)
    if first >= num_blocks:
        return hashes
    parent = hashes[-1] if hashes else NO_HASH
    data = array("q", token_ids[first * block_size : num_blocks * block_size]).tobytes()
    width = 8 * block_size
    extra = repr(tuple(extra_keys)).encode() if extra_keys else b""
    from_bytes = int.from_bytes
    for at in range(0, len(data), width):
        h = blake2b(parent.to_bytes(8, "little", signed=True), digest_size=8)
        h.update(data[at : at + width])
        if extra:
            h.update(extra)
        parent = from_bytes(h.digest(), "little", signed=True) or 1
        hashes.append(parent)
    return hashes
