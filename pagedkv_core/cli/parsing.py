"""The command-line conventions every pagedkv command shares: bad input is one line on stderr
and exit code 2, never a usage block or a traceback, and a closed pipe ends the command quietly.

``benchmarks`` reuses these, so that ``python -m benchmarks`` and ``python -m pagedkv_core``
fail the same way.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ..config import ConfigError

EXIT_USAGE = 2
PROG = "python -m pagedkv_core"


class UsageError(Exception):
    """Bad command line; the message is one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) and exit with code 2 (through
    :func:`run_command`)."""

    def error(self, message: str):  # noqa: D401
        raise UsageError(f"{self.prog}: {message}")


def run_command(command: Callable[[], int | None]) -> int:
    """Runs ``command`` (which parses the command line and acts); returns its exit code, or 2
    after one line on stderr for a usage or configuration error."""
    try:
        return int(command() or 0)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def trace_writer(path: str, header: dict):
    """A :class:`~pagedkv_core.record.trace_file.TraceWriter` streaming a run into ``path`` (``--trace-out``:
    only the last step stays in memory); a file that cannot be created is one line."""
    from ..record.trace_file import TraceWriter

    try:
        return TraceWriter(path, header)
    except OSError as exc:
        raise ConfigError(f"cannot write trace {path!r}: {exc.strerror}") from None
