"""A GGUF's model shape from its metadata header alone (pagedkv_core/sources/model/gguf_header.py)."""
from __future__ import annotations

import struct

import pytest

from pagedkv_core.sizing.pool_plan import model_kv_shape
from pagedkv_core.sources.model.gguf_header import read_gguf_config
from pagedkv_core.sources.model.loader import bundled_gguf_path

U32, I32, F32, STRING, ARRAY, U64 = 4, 5, 6, 8, 9, 10


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def entry(key: str, kind: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", kind) + payload


def gguf(*entries: bytes, version: int = 3, count: int | None = None) -> bytes:
    n = len(entries) if count is None else count
    return b"GGUF" + struct.pack("<IQQ", version, 0, n) + b"".join(entries)


ARCH = entry("general.architecture", STRING, s("llama"))
VOCAB = entry("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3) + s("a") + s("bc") + s("<s>"))
SCORES = entry("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", F32, 3) + struct.pack("<3f", 0.0, -1.0, -2.0))
SHAPE = [
    entry("llama.block_count", U32, struct.pack("<I", 2)),
    entry("llama.attention.head_count", U32, struct.pack("<I", 4)),
    entry("llama.attention.head_count_kv", U32, struct.pack("<I", 2)),
    entry("llama.embedding_length", U32, struct.pack("<I", 256)),
    entry("llama.context_length", U64, struct.pack("<Q", 1024)),
]
WANT = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_size": 256, "max_position_embeddings": 1024}


def test_the_bundled_model_reads_as_the_facts_say():
    """SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, head size 64 (576 / 9), a context of 8,192
    tokens: 46,080 bytes of fp32 KV a token, as its converted config.json gives."""
    config = read_gguf_config(bundled_gguf_path())
    assert config == {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
                      "num_key_value_heads": 3, "hidden_size": 576, "max_position_embeddings": 8192}


def test_an_unconverted_gguf_has_its_shape_before_any_conversion(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PAGEDKV_CACHE", str(cache))
    shape = model_kv_shape(None)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.max_position_embeddings) == (30, 3, 64, 8192)
    assert shape.bytes_per_token() == 46_080
    assert not cache.exists()  # read, not converted


def test_arrays_and_long_strings_are_skipped_and_every_value_type_is_read(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(ARCH, VOCAB, SCORES, entry("general.name", STRING, s("tiny")),
                          entry("general.license", STRING, s("x" * 70_000)),
                          entry("general.file_type", I32, struct.pack("<i", 3)), *SHAPE))
    assert read_gguf_config(path) == WANT


def test_a_key_length_is_the_head_size_and_the_reading_stops_once_all_is_found(tmp_path):
    """With every key it reads found, the header is not read further: what follows may be anything."""
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(ARCH, *SHAPE, entry("llama.attention.key_length", U32, struct.pack("<I", 80)),
                          count=100) + b"\xff" * 64)
    assert read_gguf_config(path) == {**WANT, "head_dim": 80}


@pytest.mark.parametrize("data, message", [
    (b"GGML" + bytes(20), "is not a GGUF file"),
    (gguf(ARCH, version=99), "GGUF version 99 is not read here"),
    (gguf(ARCH, count=1 << 40), "metadata entries, over"),
    (gguf(ARCH, *SHAPE)[:60], "runs past the end of the file"),
    (gguf(struct.pack("<Q", 1 << 40) + b"x"), "GGUF key of 1,099,511,627,776 bytes"),
    (gguf(entry("general.architecture", 99, b"")), "value type 99 is unknown"),
    (gguf(entry("x", ARRAY, struct.pack("<IQ", STRING, 1 << 40))), "runs past the end of the file"),
    (gguf(entry("x", ARRAY, struct.pack("<IQ", ARRAY, 1))), "GGUF array of value type 9"),
    (gguf(*SHAPE), "names no general.architecture"),
    (gguf(ARCH, *SHAPE[1:]), "lacks llama.block_count"),
    (gguf(ARCH, entry("llama.block_count", F32, struct.pack("<f", 2.0)), *SHAPE[1:]),
     "llama.block_count is 2.0, not a positive integer"),
    (gguf(ARCH, entry("llama.block_count", U32, struct.pack("<I", 0)), *SHAPE[1:]),
     "llama.block_count is 0, not a positive integer"),
], ids=["magic", "version", "entries", "truncated", "key-length", "value-type", "array-length", "nested-array",
        "no-architecture", "no-layers", "float-layers", "zero-layers"])
def test_a_damaged_header_is_one_line(tmp_path, data, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        read_gguf_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_damaged_gguf_leaves_the_shape_to_the_loader(tmp_path, monkeypatch):
    """model_kv_shape gives None (the loader then says what is wrong) rather than raising."""
    monkeypatch.setenv("PAGEDKV_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf(ARCH, *SHAPE)[:60])
    assert model_kv_shape(path) is None
