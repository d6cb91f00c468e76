"""The ``atlas-fast`` command line.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; ``COMMANDS`` maps command names to (module, one-line help). Building the
parser imports every command module, so their top-level imports must stay light (import heavy
things such as torch or plotting libraries inside ``run``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .._version import __version__

COMMANDS: dict = {
    "bench": (".bench", "time atlas_fast side by side with the peers, on the same data"),
    "verify": (".verify", "check a dataset completely: metadata, every block, checksums"),
    "info": (".info", "describe a dataset: shards, examples, strategy, sizes, compression"),
    "convert": (".convert", "bring a dataset in from Parquet, HF, JSON lines, Dolma, ..."),
    "merge": (".merge", "one dataset of the examples of several, shards linked, not recompressed"),
    "export": (".export", "write a dataset out as Parquet, JSON lines, HF, webdataset or MDS"),
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


# The exit status when whoever reads our output closed it early (``atlas-fast info --json DS |
# head``): 128 + SIGPIPE, the status a shell reports for a command that SIGPIPE ended, as it
# does for cat or seq there; apart from 1 (problems found) and 2 (usage error).
EXIT_CLOSED_PIPE = 141


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 for usage errors, 141 when standard
    output was closed before all of it was written).

    Run as the program (``argv`` None: the ``atlas-fast`` command, ``python -m atlas_fast``),
    the process never imports torch: none of the commands hands a reader to torch, and its
    import would cost most of a short command's time (``_compat.without_torch``).
    """
    if argv is None:
        from .._compat import without_torch

        without_torch()
    try:
        try:
            return _run(argv)
        finally:
            if sys.stdout is not None:  # None: started with file descriptor 1 closed
                sys.stdout.flush()  # here, not at exit: a closed pipe raises now
    except BrokenPipeError:
        # Python ignores SIGPIPE, so writing to a closed pipe raises. What is still buffered
        # can never be delivered: point stdout at devnull so that the interpreter's own flush
        # at exit does not fail again, and end quietly. Another pipe's error is not ours to
        # hide.
        if not _stdout_is_closed():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
        return EXIT_CLOSED_PIPE


def _stdout_is_closed() -> bool:
    """Whether standard output is a pipe whose reading end is closed (assumed so where
    ``poll`` cannot tell: Windows)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _run(argv) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return importlib.import_module(args._module, __package__).run(args)
