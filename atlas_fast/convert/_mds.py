"""MosaicML MDS directories as conversion sources, read through mosaicml-streaming.

A local MDS directory is ``index.json`` and the shard files it lists. Each sample becomes one
example: the dict of its columns exactly as mosaicml-streaming's ``MDSReader.decode_sample``
returns it (``LocalDataset``/``StreamingDataset`` return the same), for every column encoding
the library has, each shard compression (zstd, gz, bz2, br, snappy) undone with the library's
own ``decompress``. One ``Part`` per shard, in index order.

A shard is read whole into memory (MDS shards are bounded by their writer's ``size_limit``),
decompressed if needed, and checked before any sample is decoded: its size and, where
index.json records them, its hashes; the sample count and offset table of its header; then,
for each sample, that its column sizes add up to the sample's length. Any failure, and any
exception the library raises decoding a sample, is a ``SourceError`` naming the shard file
and the sample.

Pickled columns (``pkl``) run code when decoded: like mosaicml-streaming, the converter
refuses them unless ``allow_unsafe_types=True``. A sample whose one column is
``__atlas_pickle__`` (``pkl``), how ``atlas-fast export --pickle`` stores an example MDS
cannot hold, is that column's value.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .._extras import MissingExtraError, require
from ._pickled import PICKLED
from ._source import Part, Source, SourceError

__all__ = ["sources"]

_FEATURE = "the mds converter"
# Columns the library decodes to PIL images (one, or a list).
_IMAGES = {"pil", "jpeg", "png", "list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray"}
_KEYS = ("column_names", "column_encodings", "column_sizes", "raw_data", "samples")


def _streaming():
    """mosaicml-streaming's format and compression modules. ``import streaming`` imports
    torchvision, which can fail for reasons other than a missing module (a build that does
    not match the installed torch): said in one line, not as a traceback."""
    try:
        fmt = require("streaming.base.format", "mds", _FEATURE)
        compression = require("streaming.base.compression", "mds", _FEATURE)
        hashing = require("streaming.base.hashing", "mds", _FEATURE)
        encodings = require("streaming.base.format.mds.encodings", "mds", _FEATURE)
    except MissingExtraError:
        raise
    except Exception as exc:
        raise ImportError(
            f"{_FEATURE}: import streaming failed: {type(exc).__name__}: {exc} (mosaicml-streaming "
            "imports torchvision: install a torchvision build that matches your torch)"
        ) from None
    return fmt, compression, hashing, encodings


def sources(src, allow_unsafe_types: bool = False) -> list[Source]:
    """One ``Source`` of the MDS directory ``src``: a ``Part`` per shard of its index.json."""
    root = Path(src)
    _, compression, _, encodings = _streaming()
    if not root.exists():
        raise SourceError(f"{root}: no such file or directory")
    index = root / "index.json"
    try:
        obj = json.loads(index.read_bytes())
    except FileNotFoundError:
        raise SourceError(f"{index}: not found (an MDS directory holds index.json)") from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{index}: not readable JSON: {exc}") from None
    shards = obj.get("shards") if isinstance(obj, dict) else None
    if not isinstance(shards, list):
        raise SourceError(f"{index}: no 'shards' list")
    parts = []
    for i, shard in enumerate(shards):
        where = f"{index}: shard {i}"
        if not isinstance(shard, dict):
            raise SourceError(f"{where}: not an object")
        if shard.get("format") != "mds" or shard.get("version") != 2:
            raise SourceError(
                f"{where}: format {shard.get('format')!r} version {shard.get('version')!r}: "
                "only MDS version 2 shards are converted"
            )
        missing = [k for k in _KEYS if k not in shard]
        if not missing and "basename" not in (shard["raw_data"] or {}):
            missing = ["raw_data.basename"]
        if missing:
            raise SourceError(f"{where}: incomplete entry (no {', '.join(missing)})")
        names, codes = shard["column_names"], shard["column_encodings"]
        raw, zipped, algo = shard["raw_data"], shard.get("zip_data"), shard.get("compression")
        for name, code in zip(names, codes):
            if not encodings.is_mds_encoding(code):
                raise SourceError(f"{where}: column {name!r}: unknown encoding {code!r}")
            if not allow_unsafe_types and not encodings.is_mds_encoding_safe(code):
                raise SourceError(
                    f"{where}: column {name!r} is {code!r}, which runs code when decoded: "
                    "pass allow_unsafe_types=True to convert it"
                )
        if algo is not None and not compression.is_compression(algo):
            raise SourceError(f"{where}: unknown compression {algo!r}")
        if algo is not None and not zipped:
            raise SourceError(f"{where}: compression {algo!r} but no zip_data")
        path = root / (zipped["basename"] if algo else raw["basename"])
        try:
            nbytes = path.stat().st_size
        except OSError as exc:
            raise SourceError(
                f"{path}: cannot read shard {i} of index.json: {exc.strerror}"
            ) from None
        parts.append(Part(str(path), nbytes, functools.partial(_read_shard, str(root), shard)))
    return [Source(parts, None)]


def _read_shard(root: str, shard: dict) -> Iterator[dict]:
    """The samples of one MDS shard, in order, decoded by the library's MDSReader."""
    fmt, compression, hashing, _ = _streaming()
    algo = shard.get("compression")
    info = shard["zip_data"] if algo else shard["raw_data"]
    path = os.path.join(root, info["basename"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the shard: {exc.strerror}") from None
    _check_file(path, data, info, hashing)
    if algo:
        try:
            data = compression.decompress(algo, data)
        except Exception as exc:
            raise SourceError(f"{path}: cannot decompress ({algo}): {exc}") from None
        _check_file(f"{path} (decompressed)", data, shard["raw_data"], hashing)
    try:
        reader = fmt.reader_from_json(root, None, shard)
    except Exception as exc:
        raise SourceError(f"{path}: its index.json entry: {type(exc).__name__}: {exc}") from None
    offsets = _offsets(path, data, shard["samples"])
    fixed = list(reader.column_sizes)
    images = [n for n, c in zip(shard["column_names"], shard["column_encodings"]) if c in _IMAGES]
    for j in range(shard["samples"]):
        sample = data[offsets[j] : offsets[j + 1]]
        _check_sizes(path, j, sample, fixed)
        try:
            example = reader.decode_sample(sample)
            for name in images:  # PIL decodes lazily: load now, while the error is ours
                for image in example[name] if isinstance(example[name], list) else [example[name]]:
                    image.load()
        except Exception as exc:
            raise SourceError(
                f"{path}: sample {j}: cannot decode: {type(exc).__name__}: {exc}"
            ) from None
        if len(example) == 1 and PICKLED in example:
            example = example[PICKLED]
        yield example


def _check_file(path: str, data: bytes, info: dict, hashing) -> None:
    expected = info.get("bytes")
    if expected is not None and len(data) != expected:
        raise SourceError(f"{path}: {len(data)} bytes, index.json says {expected}: truncated?")
    for algo, digest in (info.get("hashes") or {}).items():
        if hashing.get_hash(algo, data) != digest:
            raise SourceError(f"{path}: {algo} hash differs from index.json's: corrupt")


def _offsets(path: str, data: bytes, samples: int) -> np.ndarray:
    """The offset table of an MDS shard (a uint32 sample count, then count + 1 uint32 offsets
    of the samples' starts and the end), checked against the data."""
    head = 4 * (samples + 2)
    if len(data) < head:
        raise SourceError(f"{path}: {len(data)} bytes, too short for {samples} samples' offsets")
    count = int(np.frombuffer(data, np.uint32, 1)[0])
    if count != samples:
        raise SourceError(f"{path}: header: {count} samples, index.json says {samples}")
    offsets = np.frombuffer(data, np.uint32, samples + 1, 4).astype(np.int64)
    outside = np.flatnonzero((offsets < head) | (offsets > len(data)))
    backwards = np.flatnonzero(np.diff(offsets) < 0)
    if len(outside) or len(backwards) or offsets[-1] != len(data):
        k = min([*outside[:1], *(backwards[:1] + 1), samples])
        raise SourceError(
            f"{path}: sample {min(k, samples - 1)}: offset table corrupt (offset {k} is "
            f"{int(offsets[k])}, in a {len(data)}-byte shard whose samples start at {head})"
        )
    return offsets


def _check_sizes(path: str, j: int, sample: bytes, fixed: list) -> None:
    """A sample is the uint32 sizes of its variable-size columns, then the columns."""
    variable = sum(1 for size in fixed if not size)
    if len(sample) < 4 * variable:
        raise SourceError(f"{path}: sample {j}: {len(sample)} bytes, shorter than its header")
    sizes = np.frombuffer(sample, np.uint32, variable).astype(np.int64)
    total = 4 * variable + int(sizes.sum()) + sum(size for size in fixed if size)
    if total != len(sample):
        raise SourceError(
            f"{path}: sample {j}: its column sizes add up to {total} bytes, the sample has "
            f"{len(sample)}"
        )
