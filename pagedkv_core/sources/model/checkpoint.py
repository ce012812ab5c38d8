"""A converted model directory read directly: its config, its weights by name, its end tokens.

The GGUF conversion (:mod:`.loader`) writes a plain transformers directory: ``config.json``,
``generation_config.json``, one ``model.safetensors`` and the tokenizer's files. Reading those
needs neither transformers nor its model classes: the config is JSON, the weights are read one
tensor at a time by name from the safetensors file (its JSON header gives each tensor's dtype,
shape and offsets: :meth:`Checkpoint.tensors`), and the tokenizer is
:class:`~.tokenizer.ChatTokenizer`. It saves the few seconds transformers takes to import and build
its model on every load.

:func:`unsupported_reason` says when a directory holds something this reader does not cover (then
the loader goes through transformers, as before): several weight files, weights in a dtype read
nowhere here, a rope scaling that needs transformers' own initialisation, a tokenizer option that
transformers applies itself.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

WEIGHTS_FILE = "model.safetensors"
DIRECT_ROPE_TYPES = ("default", "linear")  # computed here; others take transformers' initialisation


class ModelConfig(SimpleNamespace):
    """``config.json`` as attributes: what the runner, the KV sizing and the rotary embedding read of
    transformers' config (they read optional keys with ``getattr(config, key, default)``)."""


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return data


def read_config(folder: Path) -> ModelConfig:
    return ModelConfig(**_read_json(Path(folder) / "config.json"))


def unsupported_reason(folder: Path) -> str | None:
    """None when :func:`read_checkpoint` and :class:`~.tokenizer.ChatTokenizer` read ``folder``
    as transformers would; else what stops them, in words."""
    from .tokenizer import tokenizer_unsupported_reason

    return weights_unsupported_reason(folder) or tokenizer_unsupported_reason(folder)


def weights_unsupported_reason(folder: Path) -> str | None:
    """:func:`unsupported_reason`, its config and weights only (not its tokenizer)."""
    folder = Path(folder)
    for name in ("config.json", WEIGHTS_FILE):
        if not (folder / name).is_file():
            return f"no {name}"
    try:
        config = read_config(folder)
    except (OSError, ValueError) as exc:
        return f"config.json unreadable ({exc})"
    try:
        with open(folder / WEIGHTS_FILE, "rb") as f:
            header, data_start = _read_header(f)
            size = os.fstat(f.fileno()).st_size
        end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{WEIGHTS_FILE} unreadable ({type(exc).__name__})"
    if data_start + end > size:
        return f"{WEIGHTS_FILE} is truncated"
    dtypes = {entry.get("dtype") for entry in header.values() if isinstance(entry, dict)}
    if not dtypes <= set(_DTYPE_NAMES):
        return f"weights in {', '.join(sorted(map(str, dtypes - set(_DTYPE_NAMES))))}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return "rope parameters that are not an object"
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in DIRECT_ROPE_TYPES:
        return f"rope type {rope_type!r}"
    return None


@dataclass
class Checkpoint:
    """A converted directory: ``config``, and the weights read by name from ``model.safetensors``."""

    folder: Path
    config: ModelConfig
    eos_token_ids: list[int]  # generation_config.json's end tokens, else config.json's
    num_parameters: int  # weights in the file (a tied LM head is not stored twice), from its header

    @contextlib.contextmanager
    def tensors(self):
        """``weight(name) -> tensor or None`` while the context is open: each tensor read from the
        file when asked for, into memory of its own (on the CPU, in the file's dtype). The file is
        read, not memory-mapped, so its pages never count in the process's resident memory."""
        import torch

        with open(self.folder / WEIGHTS_FILE, "rb") as f:
            header, data_start = _read_header(f)

            def weight(name: str):
                entry = header.get(name)
                if entry is None:
                    return None
                dtype = _DTYPE_NAMES.get(entry["dtype"])
                if dtype is None:
                    raise ValueError(f"{WEIGHTS_FILE}: tensor {name} has dtype {entry['dtype']}, which is not read here")
                begin, end = entry["data_offsets"]
                out = torch.empty(entry["shape"], dtype=getattr(torch, dtype))
                view = memoryview(out.view(torch.uint8).numpy()).cast("B") if out.numel() else memoryview(b"")
                if len(view) != end - begin:
                    raise ValueError(f"{WEIGHTS_FILE}: tensor {name} holds {end - begin} bytes, not {len(view)}")
                f.seek(data_start + begin)
                if f.readinto(view) != len(view):
                    raise ValueError(f"{WEIGHTS_FILE} is truncated")
                return out

            yield weight


_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}  # safetensors -> torch


def _read_header(f) -> tuple[dict, int]:
    """A safetensors file's tensor table (name -> dtype, shape, data offsets) and where its data starts."""
    size = int.from_bytes(f.read(8), "little")
    if not 2 <= size <= 100 << 20:
        raise ValueError(f"{WEIGHTS_FILE} has no safetensors header")
    header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{WEIGHTS_FILE} has no safetensors header")
    header.pop("__metadata__", None)
    return header, 8 + size


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(e) for e in value] if isinstance(value, (list, tuple)) else [int(value)]


def read_checkpoint(folder: Path) -> Checkpoint:
    """The config, end tokens and parameter count of ``folder`` (its weights are read later, by
    name). Raises OSError or ValueError for a file that cannot be read."""
    folder = Path(folder)
    config = read_config(folder)
    eos = []
    generation = folder / "generation_config.json"
    if generation.is_file():
        eos = _eos_ids(_read_json(generation).get("eos_token_id"))
    if not eos:
        eos = _eos_ids(getattr(config, "eos_token_id", None))
    with open(folder / WEIGHTS_FILE, "rb") as f:
        header, _ = _read_header(f)
    return Checkpoint(folder, config, eos, sum(math.prod(entry["shape"]) for entry in header.values()))
