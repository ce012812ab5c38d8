"""The bundled model is real: it loads from the pip package, answers, and its cache is faithful."""
import contextlib
import os

import pytest
import torch

from pagedkv_core.sources.model.loader import bundled_gguf_path, load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return load_model(progress=lambda f, w: None)


def chat_ids(tokenizer, question):
    enc = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt")
    return enc["input_ids"] if not torch.is_tensor(enc) else enc


def test_bundled_model_answers_paris(smollm2):
    assert smollm2.config.model_type == "llama"
    assert (smollm2.config.num_hidden_layers, smollm2.config.num_key_value_heads) == (30, 3)
    ids = chat_ids(smollm2.tokenizer, "What is the capital of France?")
    with torch.inference_mode():
        out = smollm2.model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = smollm2.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


def test_cache_reload_gives_identical_logits(tmp_path, monkeypatch):
    """Convert into a fresh cache, reload from it, and compare with transformers reading the GGUF directly.

    The conversion reads the GGUF through transformers' own ``from_pretrained(gguf_file=...)``:
    a copy of that model, taken the moment transformers returns it (before the conversion touches
    it), is the direct reading, so the GGUF is de-quantized once here, not twice (a minute of CPU).
    This conversion runs as transformers alone would (the loader's read-once shortcut is off), and
    every file it writes is byte for byte the file of the shortcut's conversion (the model cache
    the rest of the suite uses)."""
    import copy

    from transformers import AutoModelForCausalLM

    from pagedkv_core.sources.model import loader

    gguf = bundled_gguf_path()
    loader.convert_once(gguf)  # the suite's own cache, converted with the shortcut (if no test has yet)
    shortcut = loader.gguf_cache_dir(gguf)
    monkeypatch.setenv("PAGEDKV_CACHE", str(tmp_path))
    monkeypatch.setattr(loader, "_gguf_read_once", contextlib.nullcontext)
    read_directly = []
    from_pretrained = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        model = from_pretrained(*args, **kwargs)
        if kwargs.get("gguf_file") == gguf.name:
            read_directly.append(copy.deepcopy(model))
        return model

    seen = []
    with monkeypatch.context() as m:
        m.setattr(AutoModelForCausalLM, "from_pretrained", spy)
        converted = load_model(progress=lambda f, what: seen.append(f))
    assert converted.converted and converted.weights_dir.parent == tmp_path
    assert seen[-1] == 1.0 and seen == sorted(seen), "progress must rise to 100%"
    reloaded = load_model(progress=lambda f, w: None)
    assert not reloaded.converted and reloaded.weights_dir == converted.weights_dir
    written = sorted(p.name for p in converted.weights_dir.iterdir())
    assert written == sorted(p.name for p in shortcut.iterdir()) and "model.safetensors" in written
    for name in written:
        assert (converted.weights_dir / name).read_bytes() == (shortcut / name).read_bytes(), name

    assert len(read_directly) == 1, "the conversion did not read the GGUF through transformers"
    direct = read_directly[0].eval()
    ids = chat_ids(reloaded.tokenizer, "Name three colours.")
    with torch.inference_mode():
        want = direct(ids).logits
        got = reloaded.model(ids).logits
    assert torch.equal(got, want)


def test_the_apps_first_conversion_then_every_later_page_loads_the_model(tmp_path, monkeypatch):
    """A fresh machine: the first page converts the GGUF (showing progress) and later runs in the
    same server process read the cached model. Streamlit replays the elements a cached function
    drew on every later hit, so a progress bar drawn inside the cached load broke every page after
    the first; the progress is drawn outside it (ui.models.loaded_model)."""
    from tests.apptest import app
    from ui import models

    monkeypatch.setenv("PAGEDKV_CACHE", str(tmp_path))
    models._load_cached.clear()
    try:
        at = app().run()  # the home page draws the loaded model's KV arithmetic
        assert not at.exception, [e.value for e in at.exception]
        assert (models.gguf_cache_dir(bundled_gguf_path()) / "config.json").is_file()
        for page in ("pages/block_size.py", "pages/home.py"):
            at.switch_page(page).run()
            assert not at.exception, (page, [e.value for e in at.exception])
    finally:
        models._load_cached.clear()
