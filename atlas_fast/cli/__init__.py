"""The ``atlas-fast`` command line.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; ``COMMANDS`` maps command names to (module, one-line help). Building the
parser imports every command module, so their top-level imports must stay light (import heavy
things such as torch or plotting libraries inside ``run``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .._version import __version__

COMMANDS: dict = {
    "bench": (".bench", "time atlas_fast side by side with the peers, on the same data"),
    "verify": (".verify", "check a dataset completely: metadata, every block, checksums"),
    "info": (".info", "describe a dataset: shards, examples, strategy, sizes, compression"),
    "convert": (".convert", "bring a dataset in from Parquet, HF, JSON lines, Dolma, ..."),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atlas-fast", description="Fast, safe tools for Atlas datasets."
    )
    parser.add_argument("--version", action="version", version=f"atlas-fast {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        importlib.import_module(module_name, __package__).add_arguments(sub)
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 for usage errors)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return importlib.import_module(args._module, __package__).run(args)
