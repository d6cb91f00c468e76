"""``atlas-fast tokenize SRC DST --tokenizer tokenizer.json``: documents into token arrays.

Writes a new Atlas dataset at DST whose examples are 1-D token arrays (complete or absent:
see ``atlas_fast.convert.tokenize``), shows a progress bar on a terminal and prints a one-line
summary at the end. Exit status 0 on success, 1 when the source or the tokenizer is unusable,
DST is in the way or a dependency is missing, 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

import sys

from .convert import (
    _GROUPS,
    _add,
    _writer_flags,
    add_object_storage_arguments,
    object_storage_options,
)

__all__ = ["add_arguments", "run"]

# ``atlas_fast.convert.TOKENIZE_FORMATS``, repeated so that building the parser imports no
# converter; tests/convert/test_tokenize.py checks that they match.
FORMAT_NAMES = ("atlas", "parquet", "hf", "jsonl", "dolma", "mds", "wds", "energon")

_OWN = {
    "src": {
        "metavar": "SRC",
        "help": "the documents: an Atlas dataset (directory or URL), or with --from a source "
        "convert reads",
    },
    "dst": {
        "metavar": "DST",
        "help": "the Atlas dataset of token arrays to write (must not exist, unless "
        "--overwrite): a path, or a URL (s3://, gs://, az://)",
    },
    "--tokenizer": {
        "required": True,
        "metavar": "FILE",
        "help": "a tokenizer.json of the Hugging Face tokenizers library",
    },
    "--field": {
        "default": "text",
        "metavar": "NAME",
        "help": "the field holding each example's text (default: text); '' when the example "
        "itself is the text",
    },
    "--from": {
        "dest": "fmt",
        "choices": FORMAT_NAMES,
        "metavar": "FORMAT",
        "help": f"the format of SRC: {', '.join(FORMAT_NAMES)} (default: atlas)",
    },
    "--add-special-tokens": {
        "action": "store_true",
        "help": "add what the tokenizer's post-processor adds (a BOS token, say) to each document",
    },
}
_RUNNING = {
    "--workers": {
        "type": int,
        "metavar": "N",
        "help": "tokenizing processes, one core each; this process reads and writes "
        "(default: the usable cores, at most 8). The output is the same whatever N",
    },
    "--quiet": {"action": "store_true", "help": "no progress bar"},
    "--overwrite": {
        "action": "store_true",
        "help": "replace the dataset at DST (a local one once the new one is complete; in "
        "object storage every object under DST is deleted first)",
    },
}

# The object storage flags tokenize takes (its --overwrite, local DST too, is in "running").
_REMOTE = ("staging_dir", "staging_bytes")


def add_arguments(parser) -> None:
    _add(parser, _OWN)
    eos = parser.add_mutually_exclusive_group()
    eos.add_argument(
        "--eos-token", metavar="TOKEN", help="append this token's id to every document"
    )
    eos.add_argument("--eos-id", type=int, metavar="N", help="append this id to every document")
    _add(parser.add_argument_group("writer options (as AtlasDatasetWriter's)"), _writer_flags())
    _add(parser.add_argument_group("running"), _RUNNING)
    add_object_storage_arguments(parser, _REMOTE)
    _add(parser.add_argument_group("format options"), _GROUPS["format options"])


def _error(message: str) -> int:
    print(f"atlas-fast tokenize: error: {message}", file=sys.stderr)
    return 1


def run(args) -> int:
    from .._errors import AtlasFormatError, StorageError
    from .._extras import MissingExtraError
    from .._writing.options import WriterOptions
    from ..convert import FormatUnavailableError, SourceError, tokenize

    if args.workers is not None and args.workers < 1:
        print(
            f"atlas-fast tokenize: error: --workers must be at least 1, not {args.workers}",
            file=sys.stderr,
        )
        return 2
    options = {
        key: getattr(args, key)
        for _, key, *_ in WriterOptions.flags()
        if getattr(args, key) is not None
    }
    fmt = args.fmt
    for flag, value, formats in (
        ("--attributes", args.attributes, ("dolma",)),
        ("--decode", args.decode or None, ("wds", "energon")),
        ("--allow-unsafe-types", args.allow_unsafe_types or None, ("mds",)),
    ):
        if value is not None:
            if fmt not in formats:
                return _error(f"{flag} applies to --from {' and --from '.join(formats)} only")
            options[flag[2:].replace("-", "_")] = value
    remote, problem = object_storage_options(args, _REMOTE)
    if problem:
        return _error(problem)
    show_bar = not args.quiet and sys.stderr.isatty()
    try:
        summary = tokenize(
            args.src,
            args.dst,
            args.tokenizer,
            field=args.field or None,
            fmt=fmt,
            eos_token=args.eos_token,
            eos_id=args.eos_id,
            add_special_tokens=args.add_special_tokens,
            workers=args.workers,
            progress=show_bar or None,
            overwrite=args.overwrite,
            **remote,
            **options,
        )
    except KeyboardInterrupt:
        print(
            f"atlas-fast tokenize: interrupted; nothing was written at {args.dst} "
            "(the partial output was removed)",
            file=sys.stderr,
        )
        return 130
    except FileExistsError as exc:
        return _error(exc.strerror or str(exc))  # the sentence, without "[Errno 17]"
    except (
        SourceError,
        AtlasFormatError,
        StorageError,
        MissingExtraError,
        FormatUnavailableError,
        ValueError,
    ) as exc:
        return _error(f"{exc}\nno dataset was written at {args.dst}")
    print(summary)
    return 0
