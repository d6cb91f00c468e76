"""``atlas-fast export SRC DST --to FORMAT``: an Atlas dataset written out in another format.

Writes DST (complete or as it was: see ``atlas_fast.export.export``), shows a progress bar on
a terminal and prints a one-line summary at the end. Exit status 0 on success, 1 when SRC is
not a dataset, DST is in the way, an example cannot be held or a dependency is missing, 130
when interrupted.
"""

from __future__ import annotations

import sys

from .convert import add_object_storage_arguments, object_storage_options

__all__ = ["add_arguments", "run"]

# The object storage flags export takes (its --overwrite, local DST too, is its own).
_REMOTE = ("staging_dir",)

# The registry's names, repeated here so building the parser imports no target;
# tests/test_export_cli.py checks that they match ``atlas_fast.export.TARGETS``.
TARGET_NAMES = ("parquet", "jsonl", "hf", "webdataset", "mds")


def add_arguments(parser) -> None:
    parser.add_argument(
        "src", metavar="SRC", help="the Atlas dataset to export: a path or a URL (s3://, ...)"
    )
    parser.add_argument(
        "dst",
        metavar="DST",
        help="the directory to write (absent or empty, unless --overwrite): a path, or a URL "
        "(s3://, gs://, az://) to write to object storage",
    )
    parser.add_argument(
        "--to",
        dest="target",
        required=True,
        choices=TARGET_NAMES,
        metavar="FORMAT",
        help=f"the format to write: {', '.join(TARGET_NAMES)}",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="cores to use in total: N processes, each writing the parts of the dataset it "
        "takes (default: the usable cores, at most 8)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what is at DST (a directory is exchanged with the new one at the end; "
        "the objects under a URL are deleted first)",
    )
    parser.add_argument(
        "--pickle",
        action="store_true",
        help="store the examples FORMAT cannot hold exactly whole, pickled, in the field "
        "__atlas_pickle__ (convert --unpickle reads them back), instead of stopping",
    )
    parser.add_argument(
        "--untrusted",
        action="store_true",
        help="read SRC with trusted=False: its pickles may only name safe types",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_object_storage_arguments(parser, _REMOTE)


def _error(message: str) -> int:
    print(f"atlas-fast export: error: {message}", file=sys.stderr)
    return 1


def run(args) -> int:
    from .._errors import AtlasFormatError, StorageError
    from .._extras import MissingExtraError
    from ..export import ExportError, export

    if args.workers is not None and args.workers < 1:
        return _error(f"--workers must be at least 1, not {args.workers}")
    remote, problem = object_storage_options(args, _REMOTE)
    if problem:
        return _error(problem)
    show_bar = not args.quiet and sys.stderr.isatty()
    try:
        summary = export(
            args.src,
            args.dst,
            args.target,
            workers=args.workers,
            progress=show_bar or None,
            overwrite=args.overwrite,
            pickle=args.pickle,
            trusted=not args.untrusted,
            **remote,
        )
    except KeyboardInterrupt:
        print(
            f"atlas-fast export: interrupted; {args.dst} was left as it was (the partial "
            "output was removed)",
            file=sys.stderr,
        )
        return 130
    except FileExistsError as exc:
        return _error(exc.strerror or str(exc))
    except (
        ExportError,
        AtlasFormatError,
        StorageError,
        MissingExtraError,
        ValueError,
        OSError,
    ) as exc:
        return _error(f"{exc}\n{args.dst} was left as it was")
    print(summary)
    return 0
