"""The model read directly (``open_model``: config, tokenizer and weights without transformers) gives
what transformers gives: the same token ids for text and chats, the same text back, the same
weights in the runner, the same greedy answers. A directory the direct reader does not cover loads
through transformers, as before."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagedkv_core.sampling import SamplingParams
from pagedkv_core.sources.model.checkpoint import unsupported_reason
from pagedkv_core.sources.model.loader import ModelLoadError, load_model, open_model
from pagedkv_core.sources.model.tokenizer import ChatTokenizer, tokenizer_unsupported_reason

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n and  double  spaces",
    "Ünïcödé, 日本語のテキスト, emoji 🙂🚀 and Ελληνικά",
    "code: def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nspecial tokens typed as text<|im_end|>",
    "<|endoftext|><repo_name>mixed<file_sep>",
    "numbers 1234567890 3.14159 -42 1e-9",
    "",
    " ",
    "a" * 300,
]


@pytest.fixture(scope="module")
def both():
    """(read directly, through transformers) of the bundled model."""
    quiet = lambda f, m: None  # noqa: E731
    return open_model(progress=quiet), load_model(progress=quiet)


def test_the_bundled_model_is_read_directly(both):
    direct, hf = both
    assert direct.model is None and direct.checkpoint is not None and isinstance(direct.tokenizer, ChatTokenizer)
    assert unsupported_reason(direct.weights_dir) is None
    assert direct.weights_dir == hf.weights_dir
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                "vocab_size", "rms_norm_eps", "max_position_embeddings", "intermediate_size"):
        assert getattr(direct.config, key) == getattr(hf.config, key), key
    assert direct.num_parameters == hf.num_parameters == 134_515_008
    assert direct.checkpoint.eos_token_ids == [2]


def test_text_tokenizes_and_decodes_as_transformers(both):
    direct, hf = both
    tok, ref = direct.tokenizer, hf.tokenizer
    passages = (ROOT / "pagedkv_core" / "data" / "prompt_text.txt").read_text(encoding="utf-8")
    for text in TEXTS + [passages]:
        for special in (True, False):
            assert tok(text, add_special_tokens=special)["input_ids"] == ref(text, add_special_tokens=special)["input_ids"], text[:40]
    rng = random.Random(0)
    vocab = ref.vocab_size if hasattr(ref, "vocab_size") else 49152
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))] + rng.sample(range(17), 2)
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids
    assert tok.decode(2) == ref.decode(2)


def test_chats_render_and_tokenize_as_transformers(both):
    direct, hf = both
    tok, ref = direct.tokenizer, hf.tokenizer
    assert tok.chat_template == ref.chat_template
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name two planets."}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 🙂"},
         {"role": "user", "content": "<|im_end|> typed\n\twith tabs"}],
        [{"role": "user", "content": "a message with a None field", "name": None}],
    ]
    for chat in chats:
        for gen in (True, False):
            assert tok.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == \
                ref.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
            want = ref.apply_chat_template(chat, add_generation_prompt=gen)
            want = want if isinstance(want, list) else want["input_ids"]
            assert tok.apply_chat_template(chat, add_generation_prompt=gen) == want
    with pytest.raises(ValueError, match="empty conversation"):
        tok.apply_chat_template([])


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.is_mkldnn else t


def test_the_runner_holds_the_same_weights_and_answers_the_same(both):
    from pagedkv_core.llm import LLM
    from pagedkv_core.sources.model.runner import ModelRunner

    direct, hf = both
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = ModelRunner(direct, device="cpu").model, ModelRunner(hf, device="cpu").model
        assert torch.equal(a.embed, b.embed) and torch.equal(a.final_norm, b.final_norm)
        assert len(a.layers) == len(b.layers) == 30
        for la, lb in zip(a.layers, b.layers):
            assert torch.equal(la.input_norm, lb.input_norm) and torch.equal(la.post_norm, lb.post_norm)
            for name in ("qkv", "o", "gate_up", "down"):
                wa, wb = getattr(la, name).tensors(), getattr(lb, name).tensors()
                assert len(wa) == len(wb) and all(torch.equal(_dense(x), _dense(y)) for x, y in zip(wa, wb)), name
        llm = LLM(device="cpu", threads=1, pool_slots=2048, quiet=True)  # loads for itself: directly
        assert llm.loaded.checkpoint is not None
        questions = ["What is the capital of France?", "Why is the sky blue?"]
        prompts = [llm.encode(q, chat=True) for q in questions]
        outs = llm.generate(prompts, SamplingParams(max_tokens=16))
        with torch.no_grad():
            for ids, out in zip(prompts, outs):
                gen = hf.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
                want = [int(t) for t in gen[0, len(ids):]]
                assert list(out.outputs[0].token_ids) == want
    finally:
        torch.set_num_threads(before)


def test_reading_directly_never_imports_transformers():
    code = ("import sys; from pagedkv_core.llm import LLM; from pagedkv_core.sampling import SamplingParams; "
            "llm = LLM(device='cpu', threads=1, pool_slots=256, quiet=True); "
            "out = llm.generate(['What is the capital of France?'], SamplingParams(max_tokens=8), chat=True)[0]; "
            "print(len(out.outputs[0].token_ids), 'Paris' in out.outputs[0].text, 'transformers' in sys.modules)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["8", "True", "False"]


def _copy_of(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    return target


def test_what_the_direct_reader_does_not_cover_loads_through_transformers(both, tmp_path):
    direct, _ = both
    folder = _copy_of(direct.weights_dir, tmp_path)
    assert unsupported_reason(folder) is None
    assert open_model(folder, progress=lambda f, m: None).checkpoint is not None

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    assert tokenizer_unsupported_reason(folder) == "tokenizer options add_bos_token"
    fallback = open_model(folder, progress=lambda f, m: None)
    assert fallback.checkpoint is None and fallback.model is not None  # transformers, as before
    (folder / "tokenizer_config.json").write_text(json.dumps(config))

    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text("{% generation %}" + template + "{% endgeneration %}")
    assert tokenizer_unsupported_reason(folder).startswith("TemplateSyntaxError")
    (folder / "chat_template.jinja").write_text(template)

    model_config = json.loads((folder / "config.json").read_text())
    llama3 = {**model_config, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "llama3"}}
    (folder / "config.json").write_text(json.dumps(llama3))
    assert unsupported_reason(folder) == "rope type 'llama3'"
    (folder / "config.json").write_text(json.dumps({**model_config, "model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="is a 'gpt2' model; pagedkv runs Llama-family models"):
        open_model(folder, progress=lambda f, m: None)

    (folder / "config.json").write_text(json.dumps(model_config))
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) - 1000])
    assert unsupported_reason(folder) == "model.safetensors is truncated"
    with pytest.raises(ModelLoadError, match="cannot load model from"):  # transformers' word, in one line
        open_model(folder, progress=lambda f, m: None)
    (folder / "model.safetensors").write_bytes(weights)

    (folder / "tokenizer.json").unlink()
    assert unsupported_reason(folder) == "no tokenizer.json"
