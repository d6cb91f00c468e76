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


def _size(text: str) -> int:
    """``--staging-bytes``: an integer of bytes, or with a K, M, G or T suffix (1024s)."""
    import argparse

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(value[-1:], 1)
    if scale > 1:
        value = value[:-1]
    try:
        number = int(value) * scale
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a size (a positive number of bytes, or with a K, M, G or T suffix)"
        )
    return number


# The flags of a DST in object storage, shared by the commands that write one (convert,
# tokenize, export): each takes those its function accepts, by ``object_storage_options``'s
# names, through ``add_object_storage_arguments``.
_OBJECT_STORAGE_FLAGS = {
    "--overwrite": {
        "action": "store_true",
        "help": "replace the objects already under DST (deleted first); without it, DST "
        "holding any object is refused",
    },
    "--staging-dir": {
        "metavar": "DIR",
        "help": "local directory in which the files are written before their upload "
        "(default: the system's temporary directory)",
    },
    "--staging-bytes": {
        "metavar": "SIZE",
        "type": _size,
        "help": "finished shards waiting on local disk for their upload hold at most this "
        "much, plus a shard per process: bytes, or with a K, M, G or T suffix (powers of "
        "1024: 512M); default 2G",
    },
}

# add_argument's keywords of each argument, by group in --help's order: the parser's own
# (SRC, DST, --from), then the writer options (from WriterOptions), then these groups, the
# object storage flags after the first.
_OWN = {
    "src": {"metavar": "SRC", "help": "the dataset to convert (file or directory)"},
    "dst": {
        "metavar": "DST",
        "help": "the Atlas dataset to write (must not exist; with --append, the one to grow): a "
        "path, or a URL (s3://, gs://, "
        "az://) to write to object storage",
    },
    "--from": {
        "dest": "fmt",
        "required": True,
        "choices": FORMAT_NAMES,
        "metavar": "FORMAT",
        "help": f"the format of SRC: {', '.join(FORMAT_NAMES)}",
    },
}
_GROUPS = {
    "running": {
        "--workers": {
            "type": int,
            "metavar": "N",
            "help": "cores to use in total, as make -j N: N processes, each writing a contiguous "
            "run of the source's files and compressing on one thread; 1 converts serially "
            "(default: the usable cores, at most 8)",
        },
        "--verify": {
            "action": "store_true",
            "help": "read every converted example back and compare it with the source before DST "
            "appears",
        },
        "--quiet": {"action": "store_true", "help": "no progress bar"},
        "--append": {
            "action": "store_true",
            "help": "add the examples after the last one of the Atlas dataset at DST (its "
            "compression strategy and shared dictionary kept; atomic: DST holds the old "
            "dataset or the grown one); not with --ray or --overwrite",
        },
        "--ray": {
            "action": "store_true",
            "help": "write on Ray Data through atlas_fast.ray.write_atlas (the ray extra; Ray "
            "decides the parallelism: not with --workers)",
        },
    },
    "format options": {
        "--attributes": {
            "metavar": "A,B",
            "help": "dolma: merge attributes/A/..., attributes/B/... into each document's "
            "attributes",
        },
        "--decode": {
            "action": "store_true",
            "help": "wds/energon: decode .json/.txt/.cls/.npy members",
        },
        "--allow-unsafe-types": {
            "action": "store_true",
            "help": "mds: convert columns whose encoding unpickles (pkl): only for trusted data",
        },
        "--unpickle": {
            "action": "store_true",
            "help": "parquet/hf/jsonl/wds: read back the examples atlas-fast export --pickle "
            "stored pickled (unpickling runs code: only for trusted data)",
        },
    },
}


# The object storage flags convert takes, as object_storage_options names them.
_REMOTE = ("overwrite", "staging_dir", "staging_bytes")


def add_arguments(parser) -> None:
    _add(parser, _OWN)
    _add(parser.add_argument_group("writer options (as AtlasDatasetWriter's)"), _writer_flags())
    _add(parser.add_argument_group("running"), _GROUPS["running"])
    add_object_storage_arguments(parser, _REMOTE)
    _add(parser.add_argument_group("format options"), _GROUPS["format options"])


def add_object_storage_arguments(parser, names: tuple) -> None:
    """The group of --help of a DST in object storage, with the flags of ``names`` (as
    ``object_storage_options`` takes them: ``"staging_dir"`` for ``--staging-dir``)."""
    group = parser.add_argument_group("object storage (DST a URL)")
    _add(group, {_flag(name): _OBJECT_STORAGE_FLAGS[_flag(name)] for name in names})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add(group, arguments: dict) -> None:
    for name, keywords in arguments.items():
        group.add_argument(name, **keywords)


def _writer_flags() -> dict:
    """The writer options' flags, defaults and help are WriterOptions'; an option not given is
    not passed on (convert's default is the same)."""
    from .._writing.options import WriterOptions

    flags = {}
    for flag, key, default, metavar, text in WriterOptions.flags():
        if isinstance(default, bool):
            flags[flag] = {"dest": key, "action": "store_true", "default": None, "help": text}
        else:
            flags[flag] = {
                "dest": key,
                "type": type(default),
                "metavar": metavar,
                "help": f"{text} (default {default})",
            }
    return flags


def _error(message: str) -> int:
    print(f"atlas-fast convert: error: {message}", file=sys.stderr)
    return 1


def object_storage_options(args, names: tuple) -> tuple:
    """``(options, problem)``: the flags ``names`` given (those of a DST in object storage),
    as keyword arguments, and what is wrong with them (given for a local DST), or None."""
    given = {name: getattr(args, name) for name in names}
    options = {k: v for k, v in given.items() if v is not None and v is not False}
    if options:
        from .._writing.upload import is_remote

        if not is_remote(args.dst):
            flags = ", ".join(_flag(key) for key in options)
            return options, f"{flags}: for a DST in object storage (a URL), not {args.dst}"
    return options, None


def run(args) -> int:
    from .._checks import check_int
    from .._errors import AtlasFormatError
    from .._extras import MissingExtraError
    from .._writing.options import WriterOptions
    from ..convert import FormatUnavailableError, SourceError, VerifyError, convert

    if args.ray and args.workers is not None:
        return _error("--ray and --workers exclude each other (Ray decides the parallelism)")
    if args.append and (args.ray or args.overwrite):
        return _error("--append excludes --ray and --overwrite")
    if args.workers is not None:
        try:
            check_int("--workers", args.workers, minimum=1)
        except ValueError as exc:
            return _error(str(exc))
    options = {
        key: getattr(args, key)
        for _, key, *_ in WriterOptions.flags()
        if getattr(args, key) is not None
    }
    if args.attributes is not None:
        if args.fmt != "dolma":
            return _error("--attributes applies to --from dolma only")
        options["attributes"] = args.attributes
    if args.decode:
        if args.fmt not in ("wds", "energon"):
            return _error("--decode applies to --from wds and --from energon only")
        options["decode"] = True
    if args.allow_unsafe_types:
        if args.fmt != "mds":
            return _error("--allow-unsafe-types applies to --from mds only")
        options["allow_unsafe_types"] = True
    if args.unpickle:
        if args.fmt not in ("parquet", "hf", "jsonl", "wds"):
            return _error("--unpickle applies to --from parquet, hf, jsonl and wds only")
        options["unpickle"] = True
    remote, problem = object_storage_options(args, _REMOTE)
    if problem:
        return _error(problem)
    show_bar = not args.quiet and sys.stderr.isatty()
    unchanged = (
        f"the dataset at {args.dst} is unchanged"
        if args.append
        else f"no dataset was written at {args.dst}"
    )
    try:
        summary = convert(
            args.src,
            args.dst,
            args.fmt,
            workers=args.workers,
            verify=args.verify,
            progress=show_bar or None,
            ray=args.ray,
            append=args.append,
            **remote,
            **options,
        )
    except KeyboardInterrupt:
        print(
            f"atlas-fast convert: interrupted; {unchanged} (the partial output was removed)",
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
            return _error(exc.strerror or str(exc))  # the sentence, without "[Errno 17]"
        return _error(f"{exc}\n{unchanged}")
    except Exception as exc:
        if not args.ray:
            raise
        # Ray wraps a task's error (its text keeps the file and line) in its own types.
        return _error(f"{exc}\n{unchanged}")
    print(summary)
    return 0
