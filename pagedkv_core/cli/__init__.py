"""Command line: ``python -m pagedkv_core <subcommand> ...``.

One module per subcommand, each with ``register(subparsers)``: it calls
``subparsers.add_parser(...)`` and sets ``func=handler`` with ``set_defaults`` (``handler(args)
-> int``, the exit code). Adding a subcommand is that module and one line in
:data:`SUBCOMMANDS`. The engine flags shared by every subcommand that builds an engine come from
:mod:`.flags` (:func:`add_engine_args`, :func:`config_from_args`). A subcommand that hands its
arguments to another program sets ``passes_through=True``: it then gets them all, unparsed,
in ``args.rest``.

Any invalid setting or workload exits with code 2 and one line on stderr naming the bad
value, never a traceback (:mod:`.parsing`).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

# The shared flag helpers first: a subcommand module may import them from here.
from .flags import add_engine_args, config_from_args, engine_settings
from .parsing import EXIT_USAGE, PROG, OneLineParser, UsageError, run_command
from . import replay  # noqa: E402  (a subcommand that lives beside the trace code it reads)
from . import bench  # noqa: E402  (after the helpers they use)
from . import generate
from . import observe
from . import simulate

__all__ = ["main", "build_parser", "SUBCOMMANDS", "add_engine_args", "config_from_args", "engine_settings",
           "EXIT_USAGE", "UsageError"]

SUBCOMMANDS: list[Callable] = [
    simulate.register,
    generate.register,
    bench.register,
    replay.register,
    observe.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="pagedkv: a paged KV-cache engine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    def command() -> int | None:
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        if getattr(args, "passes_through", False):
            args.rest = rest
        elif rest:  # what parse_args itself would say
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.func(args)

    return run_command(command)
