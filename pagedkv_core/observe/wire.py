"""vLLM's KV-cache event wire format: msgpack batches of BlockStored, BlockRemoved, AllBlocksCleared.

One ZMQ message is ``[topic, seq, payload]``: ``seq`` is an 8-byte big-endian signed counter (one
per batch, from 0; -1 ends a replay) and ``payload`` is msgpack of ``EventBatch = [ts, events,
data_parallel_rank]`` (the rank may be missing). vLLM declares its events as msgspec structs with
``tag=True, array_like=True``, so an event is an array whose first item is its type name::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Other producers send the same fields as a tagged map, ``{"type": "BlockStored", "block_hashes":
[...], ...}``. :func:`decode_batch` takes both. A block hash is an int (unsigned 64-bit from vLLM;
a signed one is read modulo 2**64) or bytes (a sha256 digest: its last 8 bytes, big-endian, the
key Dynamo's router uses too), so every hash here is an unsigned 64-bit int. Fields and event
types this module does not know are counted and skipped; a payload that is not a batch at all
raises :class:`WireError` (one line), which the observer counts and survives.

:func:`encode_batch` writes what vLLM writes (tag-first arrays; ``encoding="map"`` for the tagged
maps), for pagedkv's own publisher.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

U64 = (1 << 64) - 1
END_SEQ = -1
STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"
EVENT_TYPES = (STORED, REMOVED, CLEARED)


class BlockStored(msgspec.Struct, frozen=True):
    """Full blocks that entered the cache: ``block_hashes`` in chain order, the first one's parent
    (None: a chain root), and their tokens, ``block_size`` per block, concatenated."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: Any = None
    group_idx: Any = None

    def block_tokens(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]


class BlockRemoved(msgspec.Struct, frozen=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True):
    medium: str | None = None


EVENT_STRUCTS = {STORED: BlockStored, REMOVED: BlockRemoved, CLEARED: AllBlocksCleared}
# Positional order of the tag-first arrays (vLLM's struct field order); later additions go last.
EVENT_FIELDS = {name: tuple(cls.__struct_fields__) for name, cls in EVENT_STRUCTS.items()}
EVENT_FIELDS[CLEARED] = ()  # vLLM's AllBlocksCleared has no fields; a map may still name a medium
_MAP_ONLY = {CLEARED: ("medium",)}
_HASH_FIELDS = ("block_hashes", "parent_block_hash")


class WireError(ValueError):
    """A payload or frame that is not a readable event batch. The message is one line."""


@dataclass
class DecodedBatch:
    ts: float
    events: list = field(default_factory=list)  # BlockStored | BlockRemoved | AllBlocksCleared
    data_parallel_rank: int | None = None
    unknown_fields: int = 0  # fields skipped, over all events
    unknown_events: dict[str, int] = field(default_factory=dict)  # type name -> events skipped
    bad_events: int = 0  # events of a known type whose fields did not fit it


def unsigned_hash(value) -> int:
    """A block hash as an unsigned 64-bit int: ints modulo 2**64, bytes by their last 8 bytes."""
    if isinstance(value, bool):
        raise TypeError("a block hash is an int or bytes, not a bool")
    if isinstance(value, int):
        return value & U64
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(value)[-8:], "big")
    raise TypeError(f"a block hash is an int or bytes, not {type(value).__name__}")


def signed_hash(value: int) -> int:
    """An unsigned 64-bit hash back as the signed int64 that numpy arrays store."""
    value &= U64
    return value - (1 << 64) if value >> 63 else value


def _fields_of(raw) -> tuple[str | None, dict, int]:
    """(type name, fields by name, unknown field count) of one raw event, tagged map or array."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            return None, {}, 0
        known = EVENT_FIELDS.get(tag, ()) + _MAP_ONLY.get(tag, ())
        fields = {k: v for k, v in raw.items() if k in known}
        return tag, fields, len(raw) - 1 - len(fields)
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = EVENT_FIELDS.get(tag, ())
        values = raw[1:]
        return tag, dict(zip(names, values)), max(0, len(values) - len(names))
    return None, {}, 0


def decode_event(raw) -> tuple[str | None, Any, int]:
    """(type name, event or None, unknown fields). The event is None when its type is unknown or
    its fields do not fit (a type name of None: not an event at all)."""
    tag, fields, unknown = _fields_of(raw)
    cls = EVENT_STRUCTS.get(tag)
    if cls is None:
        return tag, None, unknown
    try:
        for name in _HASH_FIELDS:
            if name == "block_hashes" and name in fields:
                if not isinstance(fields[name], (list, tuple)):
                    return tag, None, unknown
                fields[name] = [unsigned_hash(h) for h in fields[name]]
            elif name in fields and fields[name] is not None:
                fields[name] = unsigned_hash(fields[name])
        event = msgspec.convert(fields, cls)
    except (msgspec.ValidationError, TypeError, ValueError):
        return tag, None, unknown
    if isinstance(event, BlockStored) and (
        event.block_size < 1 or len(event.token_ids) != len(event.block_hashes) * event.block_size
    ):
        return tag, None, unknown
    return tag, event, unknown


def decode_batch(payload: bytes) -> DecodedBatch:
    """One msgpack payload. Raises WireError when it is not an event batch; anything inside a
    batch that does not fit is counted in the result and skipped."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError) as exc:
        raise WireError(f"payload is not msgpack ({str(exc)[:60]})") from None
    if isinstance(raw, dict):
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank", raw.get("dp_rank"))]
    if not isinstance(raw, (list, tuple)) or len(raw) < 2:
        raise WireError("payload is not an event batch [ts, events, data_parallel_rank]")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(events, (list, tuple)):
        raise WireError("payload is not an event batch [ts, events, data_parallel_rank]")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        rank = None
    out = DecodedBatch(float(ts), data_parallel_rank=rank)
    for item in events:
        try:
            tag, event, unknown = decode_event(item)
        except RecursionError:
            tag, event, unknown = None, None, 0
        if tag in EVENT_STRUCTS:
            out.unknown_fields += unknown
        if event is not None:
            out.events.append(event)
        elif tag in EVENT_STRUCTS:
            out.bad_events += 1
        else:
            name = tag if isinstance(tag, str) else "(not an event)"
            out.unknown_events[name[:64]] = out.unknown_events.get(name[:64], 0) + 1
    return out


def _event_body(event) -> list:
    if isinstance(event, BlockStored):
        return [event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size, event.lora_id,
                event.medium]
    if isinstance(event, BlockRemoved):
        return [event.block_hashes, event.medium]
    return []


def encode_event(event, encoding: str = "array"):
    tag = type(event).__name__
    body = _event_body(event)
    if encoding == "map":
        names = EVENT_FIELDS[tag]
        return {"type": tag, **dict(zip(names, body))}
    return [tag, *body]


def encode_batch(ts: float, events, data_parallel_rank: int | None = None, encoding: str = "array") -> bytes:
    """msgpack of ``[ts, events, data_parallel_rank]``: events as vLLM sends them (``"array"``:
    tag-first arrays) or as tagged maps (``"map"``). Hashes must already be unsigned."""
    if encoding not in ("array", "map"):
        raise ValueError(f"encoding must be 'array' or 'map', got {encoding!r}")
    return msgspec.msgpack.encode([float(ts), [encode_event(e, encoding) for e in events], data_parallel_rank])


def seq_bytes(seq: int) -> bytes:
    return int(seq).to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    if len(frame) != 8:
        raise WireError(f"a sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)
