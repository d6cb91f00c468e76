"""``atlas-fast convert``: datasets brought in from other formats (see docs/convert.md).

``convert(src, dst, fmt, ...)`` reads the source through the format's module (``FORMATS``
maps each format name to it; they are imported on first use, with their optional
dependencies), writes Atlas shards into a staging directory next to ``dst`` and moves the
finished dataset into place at the end: ``dst`` is complete or absent.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from .._checks import check_int
from .._writing.options import WriterOptions
from ._run import WRITER_DEFAULTS, ConvertSummary, VerifyError
from ._source import Part, Source, SourceError

__all__ = [
    "FORMATS",
    "WRITER_DEFAULTS",
    "ConvertSummary",
    "FormatUnavailableError",
    "Part",
    "Source",
    "SourceError",
    "VerifyError",
    "convert",
    "convert_dolma",
    "convert_energon",
    "convert_flat_tokens",
    "convert_hf",
    "convert_jsonl",
    "convert_mds",
    "convert_parquet",
    "convert_wds",
    "format_module",
]

# Format name -> module of this package exposing ``sources(src, **options) -> list[Source]``.
FORMATS = {
    "parquet": "_parquet",
    "hf": "_hf",
    "jsonl": "_jsonl",
    "dolma": "_dolma",
    "mds": "_mds",
    "wds": "_wds",
    "energon": "_energon",
    "flat-tokens": "_flat_tokens",
}


class FormatUnavailableError(ImportError):
    """The format is registered but its converter is not part of this installation."""


def format_module(fmt: str):
    """The module converting ``fmt``; a clear error for an unknown or absent one."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    name = f"{__name__}.{FORMATS[fmt]}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise FormatUnavailableError(
            f"--from {fmt}: this build of atlas_fast has no converter for it yet "
            f"(module {name} is missing)"
        ) from None


def convert(
    src,
    dst,
    fmt,
    *,
    workers=None,
    verify=False,
    progress=None,
    ray=False,
    storage_options=None,
    overwrite=False,
    staging_dir=None,
    staging_bytes=None,
    **options,
):
    """Convert the dataset at ``src``, in format ``fmt`` (a key of ``FORMATS``), into a new
    Atlas dataset at ``dst``; returns a ``ConvertSummary``.

    ``options`` holds writer options (``shard_size``, ``block_size``, ``compression_strategy``,
    ``compression_level``, ``compression_dict_size``, ``checksums``: their defaults, also in
    ``WRITER_DEFAULTS``, and their checks are ``atlas_fast.writer.WriterOptions``') and the
    format's own (``attributes`` for dolma, ``decode`` for wds/energon,
    ``allow_unsafe_types`` for mds, ``unpickle`` for parquet/hf/jsonl/wds: the examples
    ``atlas-fast export --pickle`` stored pickled; see docs/convert.md).

    ``dst`` must not exist, or be an empty directory. The shards are written into a staging
    directory next to it and moved in at the end, so ``dst`` is complete or absent: on any
    error or interrupt the staging directory is removed and ``dst`` left as it was.
    ``workers=N`` is the cores the conversion uses in total, as ``make -j N``: N processes,
    each writing a contiguous run of the source's parts and compressing on one thread (the
    same examples in the same order as with one); ``workers=1`` is a serial conversion, on
    one thread; None (the default) is the usable cores, at most 8 (the writer's
    ``default_workers()``). ``verify=True`` reads every converted
    example back and compares it with the source read again (``VerifyError`` names the
    first that differs) before the dataset is moved into place. ``progress``: True for a tqdm
    bar on stderr (if tqdm is installed), or a callable given ``(examples, nbytes)``
    increments. ``ray=True`` writes through ``atlas_fast.ray.write_atlas`` on Ray Data
    instead of worker processes (a task per part, in part order; the ``ray`` extra; no
    ``checksums``; ``dst`` must be on a file system every node sees; Ray decides the
    parallelism: ``workers`` > 1 with it is an error).

    ``dst`` may be a URL (``s3://bucket/path``, ``gs://``, ``az://``; ``storage_options``
    as for reading, over the standard environment variables): each shard is written into a
    temporary directory under ``staging_dir`` (default: the system's), uploaded as soon as
    it is finished and its place in the dataset is known (with ``verify``, once verified)
    and removed locally; finished shards waiting there hold at most ``staging_bytes``
    (default 2 GiB) plus a shard per process (a process whose shards cannot be named yet
    pauses meanwhile). Each dataset's root meta.json is put last, once every shard is
    stored. Objects already under ``dst`` are refused unless ``overwrite=True``, which
    deletes them first. With ``ray=True`` the Ray tasks upload their shards
    (``atlas_fast.ray.write_atlas`` to the URL, given ``storage_options``); with
    ``verify=True`` too, the dataset is converted into that directory whole, verified, then
    uploaded.

    Malformed input raises ``SourceError``, whose message starts with the file and position.
    """
    from ._run import run_conversion

    module = format_module(fmt)
    accepted = set(inspect.signature(module.sources).parameters) - {"src"}
    writer_options = {k: v for k, v in options.items() if k in WRITER_DEFAULTS}
    format_options = {k: v for k, v in options.items() if k not in WRITER_DEFAULTS}
    for key in format_options:
        if key not in accepted:
            hint = ", ".join(sorted(accepted)) or "none"
            raise TypeError(
                f"convert() got an unexpected option {key!r} (writer options: "
                f"{', '.join(WRITER_DEFAULTS)}; options of {fmt}: {hint})"
            )
    if workers is None:
        from ..writer import default_workers

        workers = 1 if ray else default_workers()
    else:
        workers = check_int("workers", workers, minimum=1, none=True)
        if ray and workers > 1:
            raise ValueError(
                f"ray=True and workers={workers} exclude each other (Ray decides the parallelism)"
            )
    summary = run_conversion(
        lambda: module.sources(src, **format_options),
        dst,
        fmt=fmt,
        workers=workers,
        verify=verify,
        progress=progress,
        options=WriterOptions(**writer_options).as_dict(exclude=("workers",)),
        ray=bool(ray),
        storage_options=storage_options,
        overwrite=bool(overwrite),
        staging_dir=staging_dir,
        staging_bytes=(
            None if staging_bytes is None else check_int("staging_bytes", staging_bytes, minimum=1)
        ),
    )
    if fmt == "flat-tokens" and "://" not in str(dst):
        # Token sequences: each dataset written gets its token index (TokenSequences).
        from .._token_index import index_dataset

        dst = Path(dst)
        split = [] if (dst / "meta.json").is_file() else sorted(dst.iterdir())
        for root in [dst] if not split else split:
            if (root / "meta.json").is_file():
                index_dataset(root, progress=progress)
    return summary


def _for_format(fmt: str):
    def convert_format(src, dst, **options):
        return convert(src, dst, fmt, **options)

    convert_format.__name__ = convert_format.__qualname__ = f"convert_{fmt.replace('-', '_')}"
    convert_format.__doc__ = (
        f"``convert(src, dst, {fmt!r}, **options)``: the {fmt} source at ``src`` into a new "
        "Atlas dataset at ``dst`` (options: see ``convert``)."
    )
    return convert_format


convert_parquet = _for_format("parquet")
convert_hf = _for_format("hf")
convert_jsonl = _for_format("jsonl")
convert_dolma = _for_format("dolma")
convert_mds = _for_format("mds")
convert_wds = _for_format("wds")
convert_energon = _for_format("energon")
convert_flat_tokens = _for_format("flat-tokens")
