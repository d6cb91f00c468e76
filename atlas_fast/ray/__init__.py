"""Writing and reading Atlas datasets on Ray Data (the ``atlas-fast[ray]`` extra).

``write_atlas(dataset, path, shard_size=..., block_size=...)`` writes a Ray Dataset as an
Atlas dataset: the dataset is cut into blocks of one shard's rows, each write task writes
one as a shard into a staging directory of its own (to a URL: uploads it under its final
name), and the driver commits them in task order (the root meta.json last, atomically).
``read_atlas(path)`` reads one back as a Ray Dataset, its read tasks over contiguous runs of
blocks. ``AtlasDatasink`` and ``AtlasDatasource`` are the ``ray.data.Datasink`` and
``ray.data.Datasource`` behind them. docs/ray.md has the guide.

Rows and examples. A dict example with string keys is a row whose columns are its keys;
any other example (a number, a string, a list, a numpy array, an object, a dict with a
non-string key or no key) is a row with one column, ``item_column`` (default ``"item"``),
as ``ray.data.from_items`` does. Writing reverses this: a row whose only column is
``item_column`` is stored as that column's value, any other row as a dict of its columns.
Values take the types Ray Data gives them (a tuple comes back as a list, a missing key of a
dict in a block where other examples have it as None).

Ray is imported only when these are used: without it, this module imports and each name
raises ``MissingExtraError`` naming the extra.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from .._checks import check_int
from .._errors import InvalidArgumentError
from .._extras import require
from .._format import CompressionStrategy
from .._writing.options import WriterOptions
from ._rows import example_to_row, row_to_example

if TYPE_CHECKING:  # defined on first use, by __getattr__ (they subclass Ray's classes)
    from ._data import AtlasDatasink, AtlasDatasource

__all__ = [
    "AtlasDatasink",
    "AtlasDatasource",
    "example_to_row",
    "read_atlas",
    "row_to_example",
    "write_atlas",
]

_EXTRA = "ray"
_LAZY = ("AtlasDatasink", "AtlasDatasource")


def _ray_data(feature: str):
    """The module of the Ray Data classes, once Ray is known to be there."""
    require("ray.data", _EXTRA, feature)
    from . import _data

    return _data


def __getattr__(name: str):
    # The classes subclass Ray's, so they exist only once Ray is importable. Not cached in
    # the module's globals: every access checks that Ray is (still) there.
    if name in _LAZY:
        return getattr(_ray_data(f"atlas_fast.ray.{name}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


def write_atlas(
    dataset,
    path,
    *,
    shard_size: int,
    block_size: int,
    compression_strategy: int = 2,
    compression_level: int = 3,
    compression_dict_size: float = 0.01,
    dict_sample_rows: int | None = None,
    item_column: str | None = "item",
    preserve_order: bool = True,
    ray_remote_args: dict | None = None,
    concurrency: int | None = None,
    storage_options: dict | None = None,
    overwrite: bool = False,
    expected_examples: int | None = None,
    mode: str = "create",
):
    """Write the Ray Dataset ``dataset`` as an Atlas dataset at ``path``; return its metadata.

    ``path`` must be absent or an empty directory on a file system every node of the cluster
    sees at the same path. The examples go into shards of ``shard_size`` examples in the
    dataset's order, the last one smaller, as ``AtlasDatasetWriter`` cuts them: the dataset
    is first repartitioned into blocks of exactly ``shard_size`` rows
    (``repartition(target_num_rows_per_block=shard_size, strict=True)``, streaming, no data
    through the driver), and each write task writes one of them as one shard of
    ``block_size`` examples per block, compressed per ``compression_strategy`` (0 none,
    1 zstd, 2 one dictionary shared by every shard, 3 one dictionary per shard) at
    ``compression_level``.

    Strategy 2: before the write, the driver takes the first ``dict_sample_rows`` rows
    (default: one shard's worth, at most 256 blocks) and trains the dictionary from them as
    the shard writer trains one (its size is ``compression_dict_size`` times the pickled
    sample); every task compresses with it. When no dictionary can be trained (fewer than
    7 blocks in the sample, as in the reference), the dataset is written with strategy 1.
    Taking the sample runs the dataset's pipeline for those rows; materialize an expensive
    pipeline first.

    ``preserve_order=True`` sets the dataset's ``preserve_order`` execution option for this
    write, so the examples are stored in the dataset's order; False lets Ray finish tasks in
    any order (the shards are still committed in task order). ``ray_remote_args`` (for
    example ``{"max_retries": 3, "retry_exceptions": True}``) and ``concurrency`` go to
    ``Dataset.write_datasink``.

    Nothing is a dataset until the end: the root meta.json is written last, atomically, once
    every task has succeeded. A failed write leaves no meta.json and no staging directory,
    and raises only once its tasks have stopped (those Ray cancelled are waited for, up to
    2 minutes: ``docs/ray.md``), so nothing of it appears later under ``path`` or inside a
    new write there. A task still running after that keeps the staging area in place (a
    ``RuntimeWarning`` names it) and a new write to ``path`` refuses (``FileExistsError``)
    until it is removed (``overwrite=True`` for a URL).

    ``path`` may be a URL (``s3://bucket/path``, ``gs://``, ``az://``): for a cluster without
    a shared disk. Each task writes its shard on its node's local disk, uploads it
    (multipart) under its final name and removes it; the driver then puts the root files,
    meta.json last: no data passes through the driver and nothing is copied within the
    store. A shard's final name is its number zero-padded to the width of the last: the
    count must be known before the tasks start. ``expected_examples`` gives it; otherwise it
    is the count Ray knows without running the dataset (``from_items``, ``range``, a
    materialized dataset, Parquet files read as they are), and when Ray does not know it
    either, the shards numbered below the final width's first number (``0``-``9`` of
    11-100 shards, ``0``-``99`` of 101-1,000, ...) are copied to their final names at the
    commit. A wrong ``expected_examples`` only costs those copies. ``storage_options`` (as
    for reading; given to every task: the tasks do not see the driver's environment
    variables unless Ray passes them on) and ``overwrite`` (objects already under ``path``
    are refused unless True) are for a URL.

    ``mode="append"`` adds the rows after the last example of the dataset at ``path``
    instead (as ``AtlasDatasetWriter(..., append=True)``: docs/growing.md): its new shards
    numbered after its last, its strategy kept (``compression_strategy`` must be the
    dataset's, or 2 for one stored with 1) and its shared dictionary reused (no sample is
    taken). The dataset is checked and locked first; locally the tasks stage their shards
    in a folder next to ``path`` and the commit swaps the grown dataset in at once; to a
    URL they upload under the numbers after the last and the root meta.json is the commit.
    A failed job leaves the dataset as it was.
    """
    impl = _ray_data("atlas_fast.ray.write_atlas")
    from .._writing.upload import is_remote

    if mode not in ("create", "append"):
        raise InvalidArgumentError(f"mode must be 'create' or 'append', not {mode!r}")
    if not is_remote(path):
        path = Path(path)
    writer_options = WriterOptions.from_arguments(locals())
    shard_size, block_size = writer_options.shard_size, writer_options.block_size
    grow = None
    if mode == "append":
        if overwrite:
            raise InvalidArgumentError("mode='append' and overwrite=True: choose one")
        grow, strategy, dict_bytes = _open_growing(path, storage_options, writer_options)
        writer_options = dataclasses.replace(writer_options, compression_strategy=strategy)
    elif not is_remote(path):
        impl.check_destination(path)
    if expected_examples is not None:
        expected_examples = check_int("expected_examples", expected_examples, minimum=0)
    elif is_remote(path):
        expected_examples = impl.known_count(dataset)
    zdict = None
    if grow is not None and dict_bytes is not None:
        zdict = dict_bytes  # the dataset's shared dictionary: no sample, no training
    elif writer_options.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        if dict_sample_rows is None:
            dict_sample_rows = min(shard_size, impl.MAX_SAMPLE_BLOCKS * block_size)
        dict_sample_rows = check_int("dict_sample_rows", dict_sample_rows, minimum=1)
        sample = dataset.limit(dict_sample_rows).take_all()
        zdict = impl.train_shared_dictionary(
            (row_to_example(row, item_column) for row in sample),
            block_size=block_size,
            compression_level=writer_options.compression_level,
            compression_dict_size=writer_options.compression_dict_size,
            where=path,
        )
        if zdict is None:  # fewer than 7 blocks: the reference's fallback
            writer_options = dataclasses.replace(
                writer_options, compression_strategy=CompressionStrategy.STANDARD_COMPRESSION
            )
    # The checked options go on as they are: the sink takes all of them but checksums and
    # workers (write_atlas has neither: a task picks its own threads).
    sink = impl.AtlasDatasink(
        path,
        **writer_options.as_dict(exclude=("checksums", "workers")),
        compression_dict=zdict,
        item_column=item_column,
        storage_options=storage_options,
        overwrite=overwrite,
        expected_examples=expected_examples,
        _grow=grow,
    )
    # Blocks of exactly shard_size rows (the last one smaller): a write task each, so the
    # shards are cut where AtlasDatasetWriter cuts them and task i writes shard i.
    shards = dataset.repartition(target_num_rows_per_block=shard_size, strict=True)
    options = shards.context.execution_options
    previous = options.preserve_order
    options.preserve_order = previous or preserve_order
    try:
        shards.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    except BaseException:
        left = impl._GROWING.pop(sink.job, None)  # the sink's on_write_failed takes it
        if left is not None:  # Ray failed before calling it
            left.abandon()
        raise
    finally:
        options.preserve_order = previous
    return sink.metadata


def _open_growing(path, storage_options, options) -> tuple:
    """``mode="append"``: the dataset at ``path`` opened for growing (a ``LocalAppend``,
    locked, or a URL's ``RemoteGrowth``), the strategy its new shards take, and its shared
    dictionary's bytes (None when it has none)."""
    from .._writing.grow import LocalAppend
    from .._writing.grow_remote import RemoteGrowth
    from .._writing.upload import is_remote

    asked = options.compression_strategy
    if is_remote(path):
        grow = RemoteGrowth.open(path, storage_options, "write_atlas")
        return grow, grow.strategy_for(asked), grow.dict_bytes
    grow = LocalAppend(path, "write_atlas", asked)
    return grow, grow.strategy, grow.existing.dict_bytes


def read_atlas(
    path,
    *,
    override_num_blocks: int | None = None,
    parallelism: int = -1,
    item_column: str = "item",
    trusted: bool = True,
    allowed_globals=(),
    ray_remote_args: dict | None = None,
    concurrency: int | None = None,
):
    """Read the Atlas dataset at ``path`` (or an open ``AtlasDataset``) as a Ray Dataset.

    The examples are split into read tasks over contiguous runs of whole blocks, as evenly
    as block boundaries allow: ``override_num_blocks`` (or the older ``parallelism``) tasks
    when the dataset has at least that many blocks, one per block otherwise; by default Ray
    decides. Rows are as described in the module docstring (dict examples as columns, others
    under ``item_column``). ``trusted=False`` and ``allowed_globals`` unpickle with the
    restricted unpickler (see ``AtlasDataset``); an open dataset passed in keeps its own
    settings and backend. Iterate with ``DataContext``'s ``preserve_order`` set to get the
    examples in dataset order.
    """
    impl = _ray_data("atlas_fast.ray.read_atlas")
    source = impl.AtlasDatasource(
        path, item_column=item_column, trusted=trusted, allowed_globals=allowed_globals
    )
    kwargs = {"ray_remote_args": ray_remote_args, "concurrency": concurrency}
    if override_num_blocks is not None:
        kwargs["override_num_blocks"] = override_num_blocks
    elif parallelism != -1:
        kwargs["override_num_blocks"] = parallelism
    return impl.read_datasource(source, **kwargs)
