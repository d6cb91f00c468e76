"""What the commands that read one dataset (``verify``, ``info``) share: their PATH and
``--json`` arguments, how PATH is taken, their usage errors and their JSON reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["PATH_HELP", "add_dataset_arguments", "check_path", "print_json", "usage_error"]

PATH_HELP = "a dataset root or a single shard: a directory or a URL (s3://, gs://, https://, ...)"


def add_dataset_arguments(parser, report: str) -> None:
    """PATH, and ``--json`` (print the ``report`` as JSON)."""
    parser.add_argument("path", metavar="PATH", help=PATH_HELP)
    parser.add_argument("--json", action="store_true", help=f"print the {report} as JSON")


def usage_error(command: str, message: str) -> int:
    """Print a usage problem of ``command`` on standard error; the exit status for it (2)."""
    print(f"atlas-fast {command}: error: {message}", file=sys.stderr)
    return 2


def check_path(command: str, path: str):
    """PATH of ``command`` as the commands take it: a local ``Path`` (a ``file://`` URL turned
    into the path it names) or a remote URL (str). A usage problem is printed, naming PATH,
    and None returned."""
    from ..storage import parse_url
    from ..storage._dataset import is_remote, to_local

    try:
        if is_remote(path):
            parse_url(path)
            return path
        local = Path(to_local(path))
    except ValueError as exc:
        usage_error(command, str(exc))
        return None
    if not local.is_dir():
        usage_error(command, f"{local} is not a directory")
        return None
    return local


def print_json(report: dict) -> None:
    """``report`` on standard output as indented JSON, ending with a newline."""
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
