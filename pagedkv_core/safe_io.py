"""Reading files a user hands us (workloads, prompts) without letting one of them take the machine.

Two things go wrong with naive ``json.loads(Path(p).read_text())``:

- the file: ``/dev/zero`` or a FIFO has no end, and a multi-GB file is read whole before anything
  can say no. :func:`read_text_capped` stats first, refuses anything that is not a regular file
  or is over the cap, and never reads more than the cap even if the file grows meanwhile;
- the JSON: nesting 100,000 deep raises RecursionError (not a JSONDecodeError), ``NaN``,
  ``Infinity`` and ``1e400`` decode to floats no bound check expects, a 5,000-digit integer
  raises a ValueError of its own, and ``"\\ud800"`` decodes to a string that cannot be encoded
  back. :func:`loads_json` turns each of these into one :class:`ConfigError` line, and bounds
  the nesting depth, so that callers only ever see decoded data made of finite numbers and
  valid text.

:func:`check_writable` is the other direction: an output path that cannot be written is
refused before the run that would fill it.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from typing import BinaryIO

from .config import ConfigError

DEFAULT_MAX_DEPTH = 64
_SCALARS = {int, float, bool, type(None)}
_LEAVES = _SCALARS | {str}
# A lone surrogate can only come from a \\u escape in the range D800-DFFF: without one in the
# text, no string needs checking (a pair is fine, and is rare enough to check the slow way).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def open_capped(path, max_bytes: int, what: str) -> BinaryIO:
    """``path`` opened for binary reading once it is known to be a regular file of at most
    ``max_bytes`` (a caller that streams it, line by line, still stops at the cap). ConfigError
    (one line naming ``what``, the file and the cap) for anything else: a missing or unreadable
    file, a directory, a device such as /dev/zero, a FIFO (which would block), a file over the cap."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {name!r} is not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(f"{what} {name!r} has {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
        # O_NONBLOCK: had the path been swapped for a FIFO since the stat, open() would not hang.
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        f = os.fdopen(fd, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {name!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise ConfigError(f"{what} {name!r} is not a regular file")
    return f


def read_bytes_capped(path, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them (see
    :func:`open_capped` for what is refused)."""
    name = os.fspath(path)
    with open_capped(path, max_bytes, what) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read {what} {name!r}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew after the stat
        raise ConfigError(f"{what} {name!r} has more than the {max_bytes:,} bytes allowed")
    return data


def decode_text(data: bytes, what: str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped). ConfigError naming the bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start:,})") from None


def read_text_capped(path, max_bytes: int, what: str) -> str:
    """:func:`read_bytes_capped`, decoded as UTF-8 (see :func:`decode_text`)."""
    return decode_text(read_bytes_capped(path, max_bytes, what), f"{what} {os.fspath(path)!r}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def loads_strict(text: str | bytes):
    """``json.loads`` that refuses NaN, Infinity and numbers that overflow to them (1e400) with a
    ValueError; for text this program wrote (trace files, step records). Untrusted text goes
    through :func:`loads_json`, which builds on it."""
    return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)


def loads_json(text: str | bytes, what: str, max_depth: int = DEFAULT_MAX_DEPTH):
    """``json.loads`` for untrusted text: ConfigError (one line, naming ``what``) for any
    parse error, nesting deeper than ``max_depth`` (RecursionError included), non-finite
    numbers (NaN, Infinity, 1e400), integers too long to convert, and strings holding lone
    surrogates (``"\\ud800"``)."""
    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), what)
    else:
        _check_text(text, what)  # a str may hold raw surrogates (never one decoded from UTF-8)
    try:
        data = loads_strict(text)
    except RecursionError:
        raise ConfigError(f"{what}: JSON nested more than {max_depth} deep") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # from loads_strict's number checks, or int() of a huge literal
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "integer string conversion" in reason:
            reason = "an integer has too many digits"
        raise ConfigError(f"{what} is not valid JSON: {reason}") from None
    _check_tree(data, what, max_depth, check_text=bool(_SURROGATE_ESCAPE.search(text)))
    return data


def _check_tree(data, what: str, max_depth: int, check_text: bool) -> None:
    """Depth (and, with ``check_text``, the strings) of decoded JSON, without recursion: the
    data may be nested about as deep as the interpreter's recursion limit."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            if check_text:
                for key in node:
                    _check_text(key, what)
            children = node.values()
        elif type(node) is list:
            children = node
        else:
            if check_text and type(node) is str:
                _check_text(node, what)
            continue
        if depth > max_depth:
            raise ConfigError(f"{what}: JSON nested more than {max_depth} deep")
        kinds = set(map(type, children))
        if kinds <= _SCALARS:
            continue  # the bulk of a workload (lists of token ids): nothing below, found in C
        if not check_text and kinds <= _LEAVES:
            continue
        stack.extend((child, depth + 1) for child in children if type(child) not in _SCALARS)


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what}: string {ascii(text[:20])} is not valid Unicode ({exc.reason})"
        ) from None


def check_writable(path, what: str) -> None:
    """ConfigError (one line) unless ``path`` can be created or overwritten as a regular file,
    so that a command fails before its run, not after it."""
    name = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(name))
    if os.path.isdir(name):
        raise ConfigError(f"{what} {name!r} is a directory")
    if not os.path.isdir(parent):
        raise ConfigError(f"cannot write {what} {name!r}: no directory {parent!r}")
    if os.path.exists(name) and not os.path.isfile(name):
        raise ConfigError(f"{what} {name!r} is not a regular file")
    if not os.access(name if os.path.exists(name) else parent, os.W_OK):
        raise ConfigError(f"cannot write {what} {name!r}: permission denied")
