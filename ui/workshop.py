"""Workshop mode: one server shared by a room of visitors, none of whom may take it over.

Turned on by ``PAGEDKV_WORKSHOP=1`` in the environment (``make app WORKSHOP=1`` sets it). The
default ``make app`` (one person, on 127.0.0.1) is unchanged. In workshop mode:

- **Models.** The sidebar offers a select box: the bundled SmolLM2 and the models in the folder
  named by ``PAGEDKV_MODEL_DIR`` (its ``.gguf`` files and its subfolders holding a
  ``config.json``). No free-form path: a visitor cannot probe the server's files ("not a .gguf
  file" for the shadow password file, "has no config.json" for root's home) or load whatever
  model lies on it.
- **Uploads** are capped at ``PAGEDKV_MAX_UPLOAD_MB`` (default :data:`WORKSHOP_UPLOAD_MB`;
  outside workshop mode :data:`UPLOAD_MB`, a workload file's own cap, rather than Streamlit's 200):
  Streamlit's ``server.maxUploadSize`` (set by the launcher, :mod:`ui.serve`, and in
  ``.streamlit/config.toml``, and enforced by the server on the upload request itself), the
  uploader's own cap (shown in the browser), and our own check of the file's size before it is
  parsed (:func:`check_upload`).
- **Memory per session**: ``PAGEDKV_SESSION_BUDGET`` defaults to :data:`WORKSHOP_SESSION_BUDGET`
  instead of a share of the machine (:func:`apply_defaults`).
- **Live real-model sessions** at once: at most ``PAGEDKV_MAX_MODEL_SESSIONS`` (default
  :data:`WORKSHOP_MODEL_SESSIONS`); see :mod:`ui.sessions` for the seats (and
  :class:`ui.models.CoreShare` for the torch threads each engine's step may use).

The model-path rule outside workshop mode. The free-form *Model* box is offered only when the
server listens on loopback alone (``server.address`` is ``127.0.0.1``, another ``127.x``
address, ``::1`` or ``localhost``): then every visitor is someone with a shell on the machine
already. A server that listens on any other address, or on every address (a blank
``server.address``, ``0.0.0.0``, ``::``), offers the same select box as workshop mode.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from pagedkv_core.config import ConfigError
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.workloads.scenarios import MAX_WORKLOAD_FILE_BYTES

ENV_FLAG = "PAGEDKV_WORKSHOP"
ENV_MODEL_DIR = "PAGEDKV_MODEL_DIR"
ENV_MAX_UPLOAD_MB = "PAGEDKV_MAX_UPLOAD_MB"
ENV_MAX_MODEL_SESSIONS = "PAGEDKV_MAX_MODEL_SESSIONS"
ENV_SESSION_BUDGET = "PAGEDKV_SESSION_BUDGET"

WORKSHOP_UPLOAD_MB = 16  # a workload file or a trace of a few thousand steps; Streamlit's default is 200
UPLOAD_MB = MAX_WORKLOAD_FILE_BYTES >> 20  # 64: outside workshop mode, what the workload reader takes
WORKSHOP_SESSION_BUDGET = "512MiB"  # two live SmolLM2 pools at the default 2,048 slots take 283 MB
WORKSHOP_MODEL_SESSIONS = 4  # live SmolLM2 sessions stepping at once on a small server's cores
BUNDLED_LABEL = "SmolLM2-135M-Instruct (bundled)"
_FALSE = ("", "0", "off", "false", "no")


def enabled() -> bool:
    """Whether workshop mode is on (``PAGEDKV_WORKSHOP``). A value that is neither on nor off
    turns it on: a typo must not leave a shared server open."""
    return os.environ.get(ENV_FLAG, "").strip().lower() not in _FALSE


def _positive_int_env(name: str, default: int | None) -> int | None:
    """A positive whole number from the environment; ConfigError (one line) for anything else."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(f"{name} must be a positive whole number, got {text!r}")
    return int(text)


def upload_cap_mb() -> int:
    """The upload cap in MB (Streamlit's unit, 2**20 bytes): ``PAGEDKV_MAX_UPLOAD_MB``, else
    :data:`WORKSHOP_UPLOAD_MB` in workshop mode, else :data:`UPLOAD_MB` (the workload reader's
    64 MiB; Streamlit's own default of 200 would promise files the app then refuses)."""
    return _positive_int_env(ENV_MAX_UPLOAD_MB, WORKSHOP_UPLOAD_MB if enabled() else UPLOAD_MB)


def check_upload(upload, what: str = "upload") -> None:
    """ConfigError (one line, with the numbers) when the uploaded file is over the upload cap:
    checked on the size Streamlit reports, before its bytes are read or parsed."""
    cap = upload_cap_mb()
    if int(upload.size) > cap << 20:
        raise ConfigError(f"{what} {upload.name} has {format_bytes(int(upload.size))}, over this server's upload cap "
                          f"of {cap} MB ({ENV_MAX_UPLOAD_MB})")


def max_model_sessions() -> int | None:
    """How many sessions may run the real model at once: ``PAGEDKV_MAX_MODEL_SESSIONS``, else
    :data:`WORKSHOP_MODEL_SESSIONS` in workshop mode, else None (no cap)."""
    return _positive_int_env(ENV_MAX_MODEL_SESSIONS, WORKSHOP_MODEL_SESSIONS if enabled() else None)


def apply_defaults() -> None:
    """In workshop mode, the smaller per-session memory budget unless one is set already.
    Idempotent; the launcher calls it before Streamlit starts and app.py on every run, so
    ``PAGEDKV_WORKSHOP=1 streamlit run app.py`` gets it too."""
    if enabled():
        os.environ.setdefault(ENV_SESSION_BUDGET, WORKSHOP_SESSION_BUDGET)


# ---------------------------------------------------------------------------- models
def is_loopback(address: str | None) -> bool:
    """Whether a ``server.address`` listens on this machine's loopback interface alone
    (blank means every interface)."""
    host = (address or "").strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_model_paths(address: str | None) -> bool:
    """Whether the sidebar may offer the free-form Model box (see the module's rule)."""
    return not enabled() and is_loopback(address)


def model_dir() -> Path | None:
    """The folder of extra models (``PAGEDKV_MODEL_DIR``), or None."""
    text = os.environ.get(ENV_MODEL_DIR, "").strip()
    return Path(text).expanduser() if text else None


def model_choices() -> dict[str, str]:
    """The models a visitor may pick: path -> label, the bundled model (path "") first, then the
    ``.gguf`` files and the folders with a ``config.json`` directly inside PAGEDKV_MODEL_DIR,
    by name. A missing or unreadable folder offers the bundled model alone."""
    choices = {"": BUNDLED_LABEL}
    folder = model_dir()
    if folder is None:
        return choices
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError:
        return choices
    for entry in entries:
        try:
            if (entry.is_file() and entry.suffix == ".gguf") or (entry.is_dir() and (entry / "config.json").is_file()):
                choices[str(entry)] = entry.name
        except OSError:
            continue
    return choices
