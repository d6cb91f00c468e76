"""The registry of ``convert``'s formats: each name's module of this package, imported on
first use (with its optional dependencies)."""

from __future__ import annotations

import importlib

__all__ = ["FORMATS", "FormatUnavailableError", "format_module"]

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
    name = f"{__package__}.{FORMATS[fmt]}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise FormatUnavailableError(
            f"--from {fmt}: this build of atlas_fast has no converter for it yet "
            f"(module {name} is missing)"
        ) from None
