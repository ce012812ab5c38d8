"""The model's tokenizer without transformers: ``tokenizer.json`` through the ``tokenizers`` library,
and the chat template through a sandboxed Jinja environment set up as transformers sets up its own.

:class:`ChatTokenizer` answers the calls pagedkv makes of a transformers tokenizer, with the same
ids and text: ``tok(text)["input_ids"]``, ``tok.decode(ids, skip_special_tokens=...)`` and
``tok.apply_chat_template(messages, add_generation_prompt=..., tokenize=...)``. It reads a
directory whose tokenizer transformers would load unchanged (a ``TokenizersBackend`` or
``PreTrainedTokenizerFast`` with no option that makes transformers rebuild or post-process it);
:func:`open_tokenizer` names what it does not cover. The bundled SmolLM2's converted
copy is such a directory; ``tests/test_direct_load.py`` checks it against transformers.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys that change nothing transformers does to tokenizer.json (beyond naming the
# special tokens and the template); any other key, or another class, may, and is left to transformers.
PLAIN_KEYS = frozenset({"backend", "tokenizer_class", "is_local", "local_files_only", "model_max_length",
                        "added_tokens_decoder", "chat_template", "clean_up_tokenization_spaces",
                        "model_input_names", "padding_side", "truncation_side", *SPECIAL_TOKENS})
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
LARGE_VOCAB = 100_000  # above it transformers may adjust the pre-tokenizer on load


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_template(folder: Path, config: dict) -> str | None:
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    return template if isinstance(template, str) else None


def tokenizer_unsupported_reason(folder: Path) -> str | None:
    """None when :meth:`ChatTokenizer.from_dir` reads ``folder``'s tokenizer as transformers does."""
    return open_tokenizer(folder)[1]


def open_tokenizer(folder: Path) -> tuple["ChatTokenizer | None", str | None]:
    """``(the tokenizer, None)`` when ``folder``'s tokenizer reads here as transformers reads it,
    else ``(None, what stops it, in words)``."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return None, "no tokenizer.json"
    config_path = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    except (OSError, ValueError) as exc:
        return None, f"tokenizer_config.json unreadable ({exc})"
    if not isinstance(config, dict):
        return None, "tokenizer_config.json is not an object"
    if config.get("tokenizer_class", PLAIN_CLASSES[0]) not in PLAIN_CLASSES:
        return None, f"tokenizer class {config.get('tokenizer_class')!r}"
    extra = sorted(set(config) - PLAIN_KEYS)
    if extra:
        return None, f"tokenizer options {', '.join(extra)}"
    if config.get("clean_up_tokenization_spaces"):
        return None, "clean_up_tokenization_spaces"
    if not isinstance(config.get("chat_template", ""), str):
        return None, "several named chat templates"
    try:
        tok = ChatTokenizer.from_dir(folder)
    except Exception as exc:  # a template that does not compile here (a transformers-only tag), a bad file
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if tok.vocab_size > LARGE_VOCAB:
        return None, f"a vocabulary of {tok.vocab_size:,} tokens"
    return tok, None


def _compile_template(source: str):
    """The template in a sandbox as transformers renders chat templates: blocks trimmed, ``tojson``
    without HTML escaping, ``raise_exception`` and ``strftime_now``, loop controls."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTokenizer:
    """``tokenizer.json`` and the chat template of a model directory (see the module docstring)."""

    def __init__(self, tokenizer, special_tokens: dict[str, str], chat_template: str | None):
        self._tokenizer = tokenizer
        self.special_tokens_map = dict(special_tokens)
        self.chat_template = chat_template
        self._template = _compile_template(chat_template) if chat_template else None
        for name in SPECIAL_TOKENS:
            setattr(self, name, self.special_tokens_map.get(name))

    @classmethod
    def from_dir(cls, folder: Path) -> "ChatTokenizer":
        from tokenizers import Tokenizer

        folder = Path(folder)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        special = {name: text for name in SPECIAL_TOKENS if (text := _token_text(config.get(name))) is not None}
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), special, _read_template(folder, config))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self._tokenizer.token_to_id(self.eos_token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        """``{"input_ids": [...]}`` for one text, as a transformers tokenizer answers."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True):
        """One conversation rendered with the chat template: its token ids (``tokenize``, the
        rendered text tokenized without special tokens added), else the text."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        messages = list(messages)
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        plain = []
        for message in messages:
            if not isinstance(message, dict):
                raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
            plain.append({k: v for k, v in message.items() if v is not None})
        text = self._template.render(messages=plain, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens_map)
        return self.encode(text, add_special_tokens=False) if tokenize else text
