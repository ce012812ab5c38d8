"""A GGUF file's model shape, read from its metadata header alone: no weights, no torch, no gguf package.

Before a GGUF's first conversion (:mod:`.loader`) there is no ``config.json`` to read, and the
conversion de-quantizes every weight (seconds, or a minute on a slow machine). Yet the pool
and the answer lengths can be checked against the model at once: the few numbers they need
(layers, attention heads, KV heads, head size, context length) sit in the file's first
kilobytes, as ``{architecture}.*`` metadata keys. :func:`read_gguf_config` reads them into the
``config.json`` names transformers' conversion gives them (``num_hidden_layers``, ...).

Layout (GGUF versions 2 and 3, little-endian): ``b"GGUF"``, the version (uint32), the tensor
count and the metadata count (uint64 each), then each metadata entry: its key (uint64 length,
UTF-8 bytes), its value type (uint32) and its value. A string is a uint64 length and its bytes;
an array is its element type (uint32), its length (uint64) and its elements. Arrays and long
strings (the tokenizer's vocabulary, its merges) are skipped, not read; the reading stops once
every key it wants has been seen, else at the end of the metadata (the bundled file has no
``key_length``: its header is walked whole, in about 0.1 s). Every length is checked against the
file's size, so a damaged file raises ValueError (one line) instead of reading far or allocating much.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_ENTRIES = 1 << 20  # metadata entries: far above any real file (the bundled one has 33)
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 16  # a longer string value is skipped: none read here is that long
# value type -> struct format of one fixed-size value (8: string and 9: array are read apart)
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# config.json name <- the metadata key after "{architecture}."
_KEYS = {
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "hidden_size": "embedding_length",
    "max_position_embeddings": "context_length",
    "head_dim": "attention.key_length",
}
_WANTED = frozenset(_KEYS.values())
_REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size")


class _Reader:
    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def _within(self, n: int) -> int:
        if n < 0 or self.f.tell() + n > self.size:
            raise ValueError(f"GGUF header runs past the end of the file ({self.size:,} bytes)")
        return n

    def take(self, n: int) -> bytes:
        return self.f.read(self._within(n))

    def skip(self, n: int) -> None:
        self.f.seek(self._within(n), os.SEEK_CUR)

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def key(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_KEY_BYTES:
            raise ValueError(f"GGUF key of {n:,} bytes, over {MAX_KEY_BYTES:,}")
        return self.take(n).decode("utf-8", "replace")

    def value(self, kind: int):
        """The value of type ``kind``; an array or a string over :data:`MAX_STRING_BYTES` is
        skipped (None): no key read here is one."""
        if kind in _FIXED:
            return self.unpack(_FIXED[kind])
        if kind == _STRING:
            n = self.unpack("<Q")
            if n > MAX_STRING_BYTES:
                self.skip(n)
                return None
            return self.take(n).decode("utf-8", "replace")
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _FIXED:
                self.skip(count * struct.calcsize(_FIXED[item]))
            elif item == _STRING:
                for _ in range(count):
                    self.skip(self.unpack("<Q"))
            else:  # arrays of arrays: none in a model file
                raise ValueError(f"GGUF array of value type {item}, which is not read here")
            return None
        raise ValueError(f"GGUF metadata value type {kind} is unknown")


def read_gguf_config(path: str | os.PathLike) -> dict:
    """The model shape of the GGUF file at ``path`` as ``config.json`` keys (``model_type``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``,
    ``head_dim``, ``max_position_embeddings``: those the file has). Raises ValueError (one line)
    for a file that is not GGUF or whose header is damaged, and OSError where it cannot be read."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size)
        if r.take(4) != MAGIC:
            raise ValueError(f"{path.name} is not a GGUF file (it does not start with {MAGIC!r})")
        version = r.unpack("<I")
        if version not in VERSIONS:
            raise ValueError(f"{path.name}: GGUF version {version} is not read here (versions {VERSIONS})")
        r.unpack("<Q")  # tensor count
        entries = r.unpack("<Q")
        if entries > MAX_ENTRIES:
            raise ValueError(f"{path.name}: {entries:,} metadata entries, over {MAX_ENTRIES:,}")
        found: dict[str, object] = {}
        arch = None
        for _ in range(entries):
            key = r.key()
            value = r.value(r.unpack("<I"))
            if value is not None and (key == "general.architecture" or key.partition(".")[2] in _WANTED):
                found[key] = value
            if key == "general.architecture":
                arch = value
            if arch is not None and all(f"{arch}.{k}" in found for k in _KEYS.values()):
                break
    if not isinstance(arch, str):
        raise ValueError(f"{path.name}: its GGUF header names no general.architecture")
    config = {"model_type": arch}
    for name, key in _KEYS.items():
        value = found.get(f"{arch}.{key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path.name}: its GGUF header's {arch}.{key} is {value!r}, not a positive integer")
        config[name] = value
    missing = [f"{arch}.{_KEYS[k]}" for k in _REQUIRED if k not in config]
    if missing:
        raise ValueError(f"{path.name}: its GGUF header lacks {', '.join(missing)}")
    return config
