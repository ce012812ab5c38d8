"""Finished real-model lesson runs kept on disk, so that a server restart, a second server or a
test worker on the same machine reads a guide's run back instead of running SmolLM2 again.

A lesson's run (:func:`ui.timed_runs.cached`) is a pure function of its scenario, its config and
arguments, the model file, the precision, the device and pagedkv's own code; its measured step
times are of this machine. The key is a hash of all of them: the source of every module under
``pagedkv_core/``, ``kernels/`` and ``ui/`` (an edit anywhere runs the lessons again), the CPU
model and the torch version. A run is stored only once it has ended and let go of its engine
(``TimedRun.release``), with its recorded steps, outputs and step times.

The files live in ``$PAGEDKV_RUN_STORE``, else ``runs/`` of the model cache (``$PAGEDKV_CACHE``,
default ``~/.cache/pagedkv``), made so that only its owner may read or write it: a file there is
read back with pickle, so it is trusted as the model cache is, and a folder that others may write
into is neither read nor written. ``PAGEDKV_RUN_STORE=off`` turns the
store off. A file that cannot be read (cut short, another version) is run again and replaced; a
store that cannot be written is skipped without a word: the run is in memory either way.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

ENV = "PAGEDKV_RUN_STORE"
ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("pagedkv_core", "kernels", "ui")


def store_dir() -> Path | None:
    """Where runs are kept; None when the store is off."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() in ("off", "0", "no"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    from pagedkv_core.sources.model.loader import cache_root

    return cache_root() / "runs"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of every module's source under :data:`CODE_DIRS`: what a run was computed with."""
    h = hashlib.sha256()
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """The CPU model, the settings that choose torch's kernels, and torch's version."""
    import torch

    from pagedkv_core.sources.model import cpu_model_name

    model = cpu_model_name()
    chosen = [os.environ.get(v, "") for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "PAGEDKV_CPU_FLAGS")]
    return f"{model}|{chosen}|torch {torch.__version__}"


def run_key(name: str, config, args: tuple, model_id: str, precision: str) -> str:
    """The file name of a run: a hash of everything the run depends on (module docstring)."""
    parts = (name, repr(config), repr(args), model_id, precision, code_fingerprint(), _machine())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _private(folder: Path) -> bool:
    """Whether ``folder`` is this user's own and nobody else may write into it: only then are its
    files read with pickle."""
    try:
        st = folder.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def load(key: str):
    """The stored run under ``key``, or None (missing, unreadable, the store is off, or its folder
    is one that others may write into)."""
    folder = store_dir()
    if folder is None or not _private(folder):
        return None
    try:
        with open(folder / f"{key}.pkl", "rb") as f:
            return pickle.load(f)
    except Exception:  # missing, cut short, written by other code: run it again
        return None


def save(key: str, value) -> bool:
    """Store ``value`` under ``key`` (written whole, then renamed into place). False when it was
    not stored: the store is off, cannot be written or is not private, or a run in it still holds
    its engine."""
    folder = store_dir()
    if folder is None or not _finished(value):
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _private(folder):
            return False
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, folder / f"{key}.pkl")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _finished(value) -> bool:
    """Whether every run in ``value`` (a run, or a dict, list or tuple of runs) has let go of its engine."""
    if isinstance(value, dict):
        return all(_finished(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finished(v) for v in value)
    return getattr(value, "engine", None) is None
