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


def _extra_bytes(extra_keys: tuple) -> bytes:
    return repr(tuple(extra_keys)).encode() if extra_keys else b""


def _chain(parent_hash: int, block: bytes, extra: bytes) -> int:
    """The hash of a block whose token ids are ``block`` (int64 bytes), under ``parent_hash``."""
    h = blake2b(parent_hash.to_bytes(8, "little", signed=True), digest_size=8)
    h.update(block)
    if extra:
        h.update(extra)
    return int.from_bytes(h.digest(), "little", signed=True) or 1


def hash_block(parent_hash: int, token_ids, extra_keys: tuple = ()) -> int:
    """Signed 64-bit hash of one full block, chained to its parent's hash (0 for the first)."""
    return _chain(parent_hash, array("q", token_ids).tobytes(), _extra_bytes(extra_keys))


def extend_block_hashes(hashes: list[int], token_ids: list[int], block_size: int, num_blocks: int, extra_keys: tuple = ()) -> list[int]:
    """Grow ``hashes`` (in place) to cover the first ``num_blocks`` full blocks of ``token_ids``:
    :func:`hash_block` chained, the new blocks' tokens converted to bytes at once."""
    num_blocks = min(num_blocks, len(token_ids) // block_size)
    first = len(hashes)
    if first >= num_blocks:
        return hashes
    parent = hashes[-1] if hashes else NO_HASH
    data = array("q", token_ids[first * block_size : num_blocks * block_size]).tobytes()
    width = 8 * block_size
    extra = _extra_bytes(extra_keys)
    for at in range(0, len(data), width):
        parent = _chain(parent, data[at : at + width], extra)
        hashes.append(parent)
    return hashes
