"""``WriterOptions``: every option of the writers, its default and its check, in one place.

The writers (``AtlasDatasetWriter``, ``AtlasDatasetShardWriter``), ``atlas_fast.convert``,
``atlas-fast convert``'s flags and ``atlas_fast.ray`` all take their options through it, so
the same bad value gets the same error everywhere (see ``atlas_fast._checks``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import zstandard

from .._checks import check_fraction, check_int, shown
from .._errors import InvalidArgumentError
from .._format import CompressionStrategy

__all__ = ["MAX_DEFAULT_WORKERS", "WriterOptions", "default_workers"]

# workers=None: the cores this process may run on, at most this many.
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """The compression threads ``workers=None`` means: the usable cores, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def _shown_as(help: str, flag: str | None = None, metavar: str | None = None) -> dict:
    """A field's metadata: what ``atlas-fast convert`` shows for it (no flag: none)."""
    return {"help": help, "flag": flag, "metavar": metavar}


@dataclass(frozen=True)
class WriterOptions:
    """The options of the writers, checked and normalised when made.

    ``shard_size`` examples per shard (default 10,000) and ``block_size`` examples per
    compressed block (default 100): positive integers; the writers' own signatures, as the
    reference's, have no default for them. ``compression_strategy`` (default 2): 0 none,
    1 zstd, 2 one dictionary shared by all shards, 3 one per shard. ``compression_level``
    (default 3): zstd's level, an integer of at most 22. ``compression_dict_size`` (default
    0.01): the dictionary's size as a fraction of the bytes it is trained on, within [0, 1].
    ``checksums`` (default False): a ``checksums.npy`` per shard. ``workers`` (default None:
    the usable cores, at most 8): compression threads, a positive integer.

    A bad value raises ``InvalidArgumentError`` (a ``ValueError`` and an ``AssertionError``,
    as the reference's ``assert`` raised), a value of the wrong type
    ``InvalidArgumentTypeError`` (a ``TypeError`` too), naming the option and the value.
    """

    shard_size: int = field(
        default=10_000, metadata=_shown_as("examples per shard", "--shard-size", "N")
    )
    block_size: int = field(
        default=100, metadata=_shown_as("examples per compressed block", "--block-size", "N")
    )
    compression_strategy: CompressionStrategy = field(
        default=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        metadata=_shown_as(
            "compression: 0 none, 1 zstd, 2 a dictionary shared by all shards, 3 one per shard",
            "--strategy",
            "{0,1,2,3}",
        ),
    )
    compression_level: int = field(
        default=3, metadata=_shown_as("zstd compression level", "--level", "L")
    )
    compression_dict_size: float = field(
        default=0.01,
        metadata=_shown_as(
            "dictionary size, as a fraction of the bytes it is trained on",
            "--dict-size",
            "FRACTION",
        ),
    )
    checksums: bool = field(
        default=False,
        metadata=_shown_as("write checksums.npy per shard (for atlas-fast verify)", "--checksums"),
    )
    workers: int | None = field(
        default=None,
        metadata=_shown_as("compression threads (default: the usable cores, at most 8)"),
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "shard_size", check_int("shard_size", self.shard_size, minimum=1))
        set_(self, "block_size", check_int("block_size", self.block_size, minimum=1))
        set_(self, "compression_strategy", _strategy(self.compression_strategy))
        set_(
            self,
            "compression_level",
            check_int(
                "compression_level",
                self.compression_level,
                maximum=zstandard.MAX_COMPRESSION_LEVEL,
            ),
        )
        set_(
            self,
            "compression_dict_size",
            check_fraction("compression_dict_size", self.compression_dict_size),
        )
        set_(self, "checksums", bool(self.checksums))
        set_(self, "workers", check_int("workers", self.workers, minimum=1, none=True))

    @property
    def threads(self) -> int:
        """``workers``, None resolved: the usable cores, at most 8."""
        return default_workers() if self.workers is None else self.workers

    def as_dict(self, *, exclude=()) -> dict:
        """The options as plain values (the strategy as an int), but those in ``exclude``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["compression_strategy"] = int(out["compression_strategy"])
        return {k: v for k, v in out.items() if k not in exclude}

    @classmethod
    def defaults(cls, *, exclude=()) -> dict:
        """Every option's default, as ``as_dict`` gives them."""
        return cls().as_dict(exclude=exclude)

    @classmethod
    def flags(cls) -> list:
        """``(flag, option, default, metavar, help)`` of the options ``atlas-fast convert``
        has flags for, in order."""
        return [
            (f.metadata["flag"], f.name, f.default, f.metadata["metavar"], f.metadata["help"])
            for f in dataclasses.fields(cls)
            if f.metadata.get("flag")
        ]


def _strategy(value) -> CompressionStrategy:
    if not isinstance(value, bool):
        try:
            return CompressionStrategy(value)
        except (ValueError, TypeError):
            pass
    raise InvalidArgumentError(
        f"compression_strategy must be 0, 1, 2 or 3 (a CompressionStrategy), not {shown(value)}"
    )
