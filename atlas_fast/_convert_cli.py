"""``atlas-fast convert SRC DST --from FORMAT``: bring a dataset in from another format.

Writes a new Atlas dataset at DST (complete or absent: see ``atlas_fast.convert.convert``),
shows a progress bar on a terminal and prints a one-line summary at the end. Exit status 0
on success, 1 when the source is malformed, DST is in the way, a dependency is missing or
``--verify`` finds a difference, 130 when interrupted.
"""

from __future__ import annotations

import sys

__all__ = ["add_arguments", "run"]

# The registry's names, repeated here so building the parser imports no converter;
# tests/convert/test_cli.py checks that they match ``atlas_fast.convert.FORMATS``.
FORMAT_NAMES = ("parquet", "hf", "jsonl", "dolma", "mds", "wds", "energon", "flat-tokens")


def add_arguments(parser) -> None:
    parser.add_argument("src", metavar="SRC", help="the dataset to convert (file or directory)")
    parser.add_argument("dst", metavar="DST", help="the Atlas dataset to write (must not exist)")
    parser.add_argument(
        "--from",
        dest="fmt",
        required=True,
        choices=FORMAT_NAMES,
        metavar="FORMAT",
        help=f"the format of SRC: {', '.join(FORMAT_NAMES)}",
    )
    writer = parser.add_argument_group("writer options (as AtlasDatasetWriter's)")
    writer.add_argument(
        "--shard-size",
        type=int,
        default=10_000,
        metavar="N",
        help="examples per shard (default 10000)",
    )
    writer.add_argument(
        "--block-size",
        type=int,
        default=100,
        metavar="N",
        help="examples per compressed block (default 100)",
    )
    writer.add_argument(
        "--strategy",
        type=int,
        default=2,
        choices=(0, 1, 2, 3),
        help="compression strategy: 0 none, 1 zstd, 2 shared dictionary "
        "(default), 3 a dictionary per shard",
    )
    writer.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    writer.add_argument(
        "--dict-size",
        type=float,
        default=0.01,
        metavar="FRACTION",
        help="dictionary size as a fraction of the bytes it is trained on (default 0.01)",
    )
    writer.add_argument(
        "--checksums",
        action="store_true",
        help="write checksums.npy per shard (for atlas-fast verify)",
    )
    run_group = parser.add_argument_group("running")
    run_group.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes, each writing a contiguous run of the source's files (default 1)",
    )
    run_group.add_argument(
        "--verify",
        action="store_true",
        help="read every converted example back and compare it with the source before DST appears",
    )
    run_group.add_argument("--quiet", action="store_true", help="no progress bar")
    run_group.add_argument(
        "--ray", action="store_true", help="run on Ray Data through atlas_fast.ray (when available)"
    )
    fmt_group = parser.add_argument_group("format options")
    fmt_group.add_argument(
        "--attributes",
        metavar="A,B",
        help="dolma: merge attributes/A/..., attributes/B/... into each document's attributes",
    )
    fmt_group.add_argument(
        "--decode", action="store_true", help="wds/energon: decode .json/.txt/.cls/.npy members"
    )


def _error(message: str) -> int:
    print(f"atlas-fast convert: error: {message}", file=sys.stderr)
    return 1


def run(args) -> int:
    from ._errors import AtlasFormatError
    from ._extras import MissingExtraError
    from .convert import FormatUnavailableError, SourceError, VerifyError, convert

    if args.ray:
        return _error(
            "--ray is not available yet: it runs through atlas_fast.ray (the Ray Data "
            "datasink), which this build does not have; convert with --workers N instead"
        )
    if args.workers < 1:
        return _error(f"--workers must be at least 1, not {args.workers}")
    options = {}
    if args.attributes is not None:
        if args.fmt != "dolma":
            return _error("--attributes applies to --from dolma only")
        options["attributes"] = args.attributes
    if args.decode:
        if args.fmt not in ("wds", "energon"):
            return _error("--decode applies to --from wds and --from energon only")
        options["decode"] = True
    show_bar = not args.quiet and sys.stderr.isatty()
    try:
        summary = convert(
            args.src,
            args.dst,
            args.fmt,
            workers=args.workers,
            verify=args.verify,
            progress=show_bar or None,
            shard_size=args.shard_size,
            block_size=args.block_size,
            compression_strategy=args.strategy,
            compression_level=args.level,
            compression_dict_size=args.dict_size,
            checksums=args.checksums,
            **options,
        )
    except KeyboardInterrupt:
        print(
            f"atlas-fast convert: interrupted; nothing was written at {args.dst} "
            "(the partial output was removed)",
            file=sys.stderr,
        )
        return 130
    except (
        SourceError,
        VerifyError,
        AtlasFormatError,
        FileExistsError,
        MissingExtraError,
        FormatUnavailableError,
        ValueError,
    ) as exc:
        if isinstance(exc, FileExistsError):
            return _error(str(exc))
        return _error(f"{exc}\nno dataset was written at {args.dst}")
    print(summary)
    return 0
