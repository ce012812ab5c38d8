"""The command-line conventions every pagedkv command shares: bad input is one line on stderr
and exit code 2, never a usage block or a traceback, and a closed pipe ends the command quietly.

``benchmarks`` reuses these, so that ``python -m benchmarks`` and ``python -m pagedkv_core``
fail the same way.

A flag that was renamed keeps its former spelling as a hidden alias (:func:`add_renamed`): the
old spelling still parses, ``--help`` and error messages show the new one only.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from fractions import Fraction

from ..config import ConfigError
from ..record.trace_process import TraceWriterError, open_trace_writer

EXIT_USAGE = 2
PROG = "python -m pagedkv_core"


class UsageError(Exception):
    """Bad command line; the message is one line."""


def add_renamed(group, new: str, old: str, **kwargs) -> argparse.Action:
    """An option documented as ``new`` that still accepts its former spelling ``old``: one
    argument with both option strings (one dest, from ``new``), ``old`` left out of ``--help``."""
    action = group.add_argument(new, old, **kwargs)
    action.hidden_aliases = (old,)
    return action


def _shown(action: argparse.Action) -> list[str]:
    hidden = getattr(action, "hidden_aliases", ())
    return [s for s in action.option_strings if s not in hidden]


class AliasHidingFormatter(argparse.HelpFormatter):
    """argparse's help, without the former spellings :func:`add_renamed` keeps working."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if getattr(action, "hidden_aliases", ()):
            action = copy.copy(action)
            action.option_strings = _shown(action)
        return super()._format_action_invocation(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) and exit with code 2 (through
    :func:`run_command`); a renamed flag's hidden alias appears in neither help nor errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", AliasHidingFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401
        for action in self._actions:  # "argument --new/--old: ..." names the new spelling only
            if getattr(action, "hidden_aliases", ()):
                message = message.replace("/".join(action.option_strings), "/".join(_shown(action)))
        raise UsageError(f"{self.prog}: {message}")


def run_command(command: Callable[[], int | None]) -> int:
    """Runs ``command`` (which parses the command line and acts); returns its exit code, or 2
    after one line on stderr for a usage or configuration error."""
    try:
        return int(command() or 0)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TraceWriterError as exc:  # a trace that could not be written (a full disk): one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def length_scale(text: str) -> float:
    """``--length-scale``: a number or a fraction (``0.0625``, ``1/16``)."""
    try:
        return float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"must be a number or a fraction such as 1/16, got {text!r}") from None


def trace_writer(path: str, header: dict, *, background: bool = False):
    """A :class:`~pagedkv_core.record.trace_file.TraceWriter` streaming a run into ``path`` (``--trace-out``:
    only the last step stays in memory); a file that cannot be created is one line. ``background``:
    written by a process of its own where a second core is there
    (:func:`~pagedkv_core.record.trace_process.open_trace_writer`), for a long scripted run."""
    from ..record.trace_file import TraceWriter

    try:
        return open_trace_writer(path, header) if background else TraceWriter(path, header)
    except OSError as exc:
        raise ConfigError(f"cannot write trace {path!r}: {exc.strerror}") from None
