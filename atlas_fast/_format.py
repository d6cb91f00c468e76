"""What the Atlas format is on disk: metadata, shard discovery and index validation.

This module is the one place that parses and validates files other than data.bin. Both
backends call it, so they accept the same datasets and raise the same errors for the same
files. Every problem is an ``AtlasFormatError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._errors import AtlasFormatError, UnsafePickleError

__all__ = [
    "VERSION",
    "META_FILE",
    "DATA_FILE",
    "INDEX_FILE",
    "DICT_FILE",
    "CompressionStrategy",
    "AtlasDatasetShardMetadata",
    "AtlasDatasetMetadata",
    "read_shard_metadata",
    "read_dataset_metadata",
    "find_shard_dirs",
    "widened_shard_dir",
    "shard_dir_names",
    "check_shard_sizes",
    "load_offsets",
    "read_dict_file",
    "parse_json_object",
    "json_object",
    "shard_metadata_from",
    "dataset_metadata_from",
    "check_offsets",
    "parse_npy",
    "check_dict_bytes",
    "NPY_HEADER_LIMIT",
    "block_count",
    "index_dtype",
    "dump_meta",
    "meta_text",
    "max_block_bytes",
    "check_zstd_content_size",
    "CHECKSUM_FILE",
    "block_checksum",
    "corrupt_frame_error",
    "load_checksums",
    "check_checksums",
    "expected_block_length",
    "check_block_examples",
    "unpickle_error",
    "truncated_block_error",
    "zstd_dictionary_mismatch",
]

VERSION = 1
META_FILE = "meta.json"
DATA_FILE = "data.bin"
INDEX_FILE = "index.npy"
DICT_FILE = "zstd_dict.bin"
# Optional sidecar written by ``checksums=True`` writers and read only by ``atlas-fast verify``:
# a 1-D little-endian uint64 array, one entry per block, each the 8-byte BLAKE2b digest (hashlib,
# ``digest_size=8``) of the block's *stored* bytes (compressed, as in data.bin), read as a
# little-endian integer. The reference never opens it.
CHECKSUM_FILE = "checksums.npy"

# zstd can squeeze at most about 32,768 decoded bytes into one encoded byte (an RLE block of
# 128 KiB costs 4 bytes): a frame that declares more than this per byte it occupies is lying.
MAX_ZSTD_RATIO = 32768
_DEFAULT_MAX_BLOCK_BYTES = 4 << 30


class CompressionStrategy(IntEnum):
    """How the blocks of a dataset or shard are compressed."""

    NO_COMPRESSION = 0
    STANDARD_COMPRESSION = 1
    SHARED_DICTIONARY_COMPRESSION = 2
    DICTIONARY_COMPRESSION = 3


class AtlasDatasetShardMetadata(NamedTuple):
    """The contents of a shard's meta.json."""

    version: int
    block_size: int
    stored_examples: int
    compression_strategy: int
    compression_level: int
    compression_dict_size: float


class AtlasDatasetMetadata(NamedTuple):
    """The contents of a dataset root's meta.json."""

    version: int
    shard_sizes: list
    compression_strategy: int


def _environ_value(name: str):
    """``os.environ.get(name)``, read per block by the Python core as the compiled core calls
    getenv: through the mapping's own dict, by its encoded key (CPython's ``os._Environ``),
    which spares ``get``'s key encoding and KeyError (about 1.7 us a call)."""
    env = os.environ
    data = getattr(env, "_data", None)
    if type(data) is not dict:
        return env.get(name)
    known = _environ_keys.get(name)
    if known is None or known[0] is not env:
        known = _environ_keys[name] = (env, env.encodekey(name))
    raw = data.get(known[1])
    return None if raw is None else env.decodevalue(raw)


_environ_keys: dict = {}  # name -> (os.environ, its encoded key)


def max_block_bytes() -> int:
    """The largest decoded block a reader will allocate (``ATLAS_FAST_MAX_BLOCK_BYTES``)."""
    raw = _environ_value("ATLAS_FAST_MAX_BLOCK_BYTES")
    if not raw:
        return _DEFAULT_MAX_BLOCK_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ATLAS_FAST_MAX_BLOCK_BYTES must be an integer, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"ATLAS_FAST_MAX_BLOCK_BYTES must be positive, not {value}")
    return value


# A meta.json is a few hundred bytes (a root lists one size per shard): anything this large is
# not one, and is refused before it is read into memory.
MAX_META_BYTES = 64 << 20


def _regular_size(path: Path) -> int:
    """The size of ``path``, which must be a regular file (a FIFO or device would block or
    never end); raises ``FileNotFoundError``/``OSError`` as ``os.stat`` does."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise AtlasFormatError(f"{path}: not a regular file")
    return st.st_size


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_regular_file(path, limit: int | None = None, what: str = "") -> bytes:
    """The whole of ``path``, which must be a regular file of at most ``limit`` bytes.

    One open (non-blocking, so a FIFO cannot hang it), one fstat and the reads: the files read
    on every shard's first use (meta.json, index.npy) are read this way, without a separate
    stat(2) or a buffered file object. Raises ``FileNotFoundError``/``OSError`` as ``open`` does.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AtlasFormatError(f"{path}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise AtlasFormatError(f"{path}: larger than {limit} bytes{what}")
        data = os.read(fd, st.st_size + 1)
        if len(data) != st.st_size:  # a short read, or a file that changed since fstat
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
            if limit is not None and len(data) > limit:
                raise AtlasFormatError(f"{path}: larger than {limit} bytes{what}")
        return data
    finally:
        os.close(fd)


def _read_json_object(path: Path, what: str) -> dict:
    """The JSON object in ``path``, the meta.json of ``what`` ("dataset" or "shard")."""
    try:
        text = _read_regular_file(path, MAX_META_BYTES, ": not a meta.json")
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise AtlasFormatError(f"{parent}: the {what} directory does not exist") from None
        raise AtlasFormatError(
            f"{path}: meta.json is missing: the {what} was not completed (its writer did not "
            f"finish: it writes meta.json last) or this is not an Atlas {what} directory"
        ) from None
    except OSError as exc:
        raise AtlasFormatError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    return parse_json_object(text, path)


def parse_json_object(text: bytes, path) -> dict:
    """The JSON object in ``text``, the bytes of the meta.json at ``path`` (a path or URL)."""
    if len(text) > MAX_META_BYTES:
        raise AtlasFormatError(f"{path}: larger than {MAX_META_BYTES} bytes: not a meta.json")
    return json_object(text, path, AtlasFormatError)


def json_object(text: bytes, path, error: type) -> dict:
    """The JSON object in ``text`` (read from ``path``); anything else raises ``error`` naming
    ``path`` and what is wrong (a meta.json's AtlasFormatError, a converter's SourceError)."""
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(path: Path, value: dict, fields: tuple) -> None:
    missing = [f for f in fields if f not in value]
    extra = sorted(k for k in value if k not in fields)
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing key(s) " + ", ".join(map(repr, missing)))
        if extra:
            parts.append("unexpected key(s) " + ", ".join(map(repr, extra)))
        raise AtlasFormatError(f"{path}: " + "; ".join(parts))


# Counts are C ``int64`` in the compiled backend: anything larger is corrupt, not big.
MAX_COUNT = 2**63 - 1


def _check_int(
    path: Path, value: dict, key: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    item = value[key]
    if not _is_int(item):
        raise AtlasFormatError(f"{path}: {key!r} must be an integer, not {item!r}")
    if minimum is not None and item < minimum:
        raise AtlasFormatError(f"{path}: {key!r} must be >= {minimum}, not {item}")
    if maximum is not None and item > maximum:
        raise AtlasFormatError(f"{path}: {key!r} must be <= {maximum}, not {item}")
    return item


def _check_version(path: Path, value: dict) -> int:
    version = _check_int(path, value, "version")
    if version != VERSION:
        raise AtlasFormatError(
            f"{path}: unsupported format version {version} (this reader supports {VERSION})"
        )
    return version


def _check_strategy(path: Path, value: dict) -> int:
    strategy = _check_int(path, value, "compression_strategy")
    if strategy not in CompressionStrategy._value2member_map_:
        raise AtlasFormatError(
            f"{path}: unknown compression_strategy {strategy} (expected 0, 1, 2 or 3)"
        )
    return strategy


def read_shard_metadata(shard_dir: Path) -> AtlasDatasetShardMetadata:
    """Parse and validate ``shard_dir/meta.json``."""
    path = os.path.join(shard_dir, META_FILE)  # a string: read on every shard's first use
    return shard_metadata_from(_read_json_object(path, "shard"), path)


def shard_metadata_from(value: dict, path) -> AtlasDatasetShardMetadata:
    """Validate a shard's parsed meta.json (``path`` names it in errors)."""
    _check_keys(path, value, AtlasDatasetShardMetadata._fields)
    version = _check_version(path, value)
    block_size = _check_int(path, value, "block_size", minimum=1, maximum=MAX_COUNT)
    stored = _check_int(path, value, "stored_examples", minimum=0, maximum=MAX_COUNT)
    strategy = _check_strategy(path, value)
    level = _check_int(path, value, "compression_level")
    dict_size = value["compression_dict_size"]
    if not isinstance(dict_size, (int, float)) or isinstance(dict_size, bool):
        raise AtlasFormatError(
            f"{path}: 'compression_dict_size' must be a number, not {dict_size!r}"
        )
    return AtlasDatasetShardMetadata(version, block_size, stored, strategy, level, dict_size)


def read_dataset_metadata(root: Path) -> AtlasDatasetMetadata:
    """Parse and validate ``root/meta.json``."""
    path = Path(root) / META_FILE
    return dataset_metadata_from(_read_json_object(path, "dataset"), path)


def dataset_metadata_from(value: dict, path) -> AtlasDatasetMetadata:
    """Validate a dataset root's parsed meta.json (``path`` names it in errors)."""
    _check_keys(path, value, AtlasDatasetMetadata._fields)
    version = _check_version(path, value)
    sizes = value["shard_sizes"]
    if not isinstance(sizes, list) or not all(_is_int(s) and 0 <= s <= MAX_COUNT for s in sizes):
        raise AtlasFormatError(
            f"{path}: 'shard_sizes' must be a list of non-negative integers, not {sizes!r}"
        )
    strategy = _check_strategy(path, value)
    return AtlasDatasetMetadata(version, sizes, strategy)


def shard_dir_names(root) -> list:
    """The names of the shard directories of ``root``, sorted as the reference sorts them.

    Hidden directories (a leading dot, such as editor or notebook checkpoints) are not shards.
    """
    try:
        with os.scandir(root) as entries:
            names = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    except FileNotFoundError:
        raise AtlasFormatError(f"{root}: dataset root does not exist") from None
    except NotADirectoryError:
        raise AtlasFormatError(f"{root}: dataset root is not a directory") from None
    except OSError as exc:
        raise AtlasFormatError(f"{root}: cannot list the dataset root: {exc}") from exc
    names.sort()
    return names


def find_shard_dirs(root: Path) -> list:
    """The shard directories of ``root`` (Paths), sorted as the reference sorts them."""
    root = Path(root)
    return [root / name for name in shard_dir_names(root)]


# Shard folder names are at most this wide (a count of shards fits an int64).
_MAX_NAME_WIDTH = 19


def widened_shard_dir(shard_dir) -> str | None:
    """Where the shard folder ``shard_dir`` (a path, absent now) is after an append widened
    the dataset's shard names (``007`` for ``07``): the same number at a greater width, if
    such a folder exists; else None. An append never changes a shard it keeps (its files
    are the same files, hard-linked): a reader opened before it reads its old shards there."""
    shard_dir = os.fspath(shard_dir)
    parent, name = os.path.split(shard_dir.rstrip("/" + os.sep))
    if not (name.isascii() and name.isdigit()):
        return None
    for width in range(len(name) + 1, _MAX_NAME_WIDTH + 1):
        candidate = os.path.join(parent, name.zfill(width))
        if os.path.isdir(candidate):
            return candidate
    return None


def check_shard_sizes(root: Path, metadata: AtlasDatasetMetadata, shards: list) -> None:
    """Check each present shard against the root's ``shard_sizes`` entry of the same number.

    A node may hold only some shards (the indices then run over the shards present), so only
    the shards that are here are checked, each against the entry its folder name points at.
    """
    path = Path(root) / META_FILE
    sizes = metadata.shard_sizes
    for shard_dir, shard in shards:
        name = shard_dir.name
        if not name.isdigit() or not name.isascii():
            raise AtlasFormatError(f"{shard_dir}: shard folder names must be numbers")
        number = int(name)
        if number >= len(sizes):
            raise AtlasFormatError(
                f"{shard_dir}: shard {number} is not listed in {path} "
                f"('shard_sizes' has {len(sizes)} entries)"
            )
        if sizes[number] != shard.stored_examples:
            raise AtlasFormatError(
                f"{shard_dir}: stored_examples is {shard.stored_examples} but {path} "
                f"lists {sizes[number]} for shard {number}"
            )


def block_count(stored_examples: int, block_size: int) -> int:
    """Number of blocks a shard of ``stored_examples`` has."""
    return -(-stored_examples // block_size)


def load_offsets(
    shard_dir: Path, metadata: AtlasDatasetShardMetadata, check_data: bool = True
) -> np.ndarray:
    """Load ``index.npy`` as validated uint64 block offsets (``block_count + 1`` entries).

    Checked here: a 1-D unsigned integer array, of the length the metadata implies, starting
    at 0 and never decreasing, ending at the size of data.bin (``check_data`` false: the
    caller checks that, with the same messages, on the descriptor it reads data.bin through).
    """
    # Plain strings (os.path): this runs on the first read of every shard.
    path = os.path.join(shard_dir, INDEX_FILE)
    data_path = os.path.join(shard_dir, DATA_FILE)
    raw = _load_npy(path, block_count(metadata.stored_examples, metadata.block_size) + 1)
    offsets = check_offsets(raw, path, metadata)
    blocks = len(offsets) - 1
    if not check_data:
        offsets.setflags(write=False)
        return offsets
    try:
        size = _regular_size(data_path)
    except FileNotFoundError:
        if blocks == 0:
            return offsets  # an empty shard needs no data.bin
        raise AtlasFormatError(f"{data_path}: missing") from None
    except OSError as exc:
        raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
    if int(offsets[-1]) != size:
        raise AtlasFormatError(
            f"{path}: the last offset is {int(offsets[-1])} but {data_path} has {size} bytes"
        )
    offsets.setflags(write=False)
    return offsets


def check_offsets(raw, path, metadata: AtlasDatasetShardMetadata) -> np.ndarray:
    """``raw`` (the array of the index.npy at ``path``) as validated uint64 block offsets:
    a 1-D unsigned integer array of the length the metadata implies, starting at 0 and
    increasing. Not checked here: that the last offset is data.bin's size."""
    if not isinstance(raw, np.ndarray) or raw.ndim != 1:
        raise AtlasFormatError(f"{path}: expected a 1-D array, found shape {np.shape(raw)}")
    if raw.dtype.kind != "u":
        raise AtlasFormatError(f"{path}: expected unsigned integers, found dtype {raw.dtype}")
    blocks = block_count(metadata.stored_examples, metadata.block_size)
    if len(raw) != blocks + 1:
        raise AtlasFormatError(
            f"{path}: has {len(raw)} entries but {metadata.stored_examples} examples in blocks "
            f"of {metadata.block_size} need {blocks + 1}"
        )
    offsets = np.ascontiguousarray(raw, dtype=np.uint64)
    if offsets[0] != 0:
        raise AtlasFormatError(f"{path}: the first offset is {int(offsets[0])}, not 0")
    if blocks == 1:
        increasing = int(offsets[1]) > 0
    else:
        increasing = blocks == 0 or not bool((offsets[1:] <= offsets[:-1]).any())
    if not increasing:
        bad = int(np.argmax(offsets[1:] <= offsets[:-1]))
        if offsets[bad + 1] < offsets[bad]:
            raise AtlasFormatError(
                f"{path}: offsets decrease at block {bad} "
                f"({int(offsets[bad])} then {int(offsets[bad + 1])})"
            )
        raise AtlasFormatError(f"{path}: block {bad} is empty (offset {int(offsets[bad])} twice)")
    return offsets


_NPY_MAGIC = b"\x93NUMPY"


# The header numpy writes for a 1-D array (what every index.npy and checksums.npy holds), parsed
# without ``ast.literal_eval``; any other header goes through numpy's own parser.
_NPY_SIMPLE_HEADER = re.compile(
    rb"\{'descr': '([<>|]?[uif][1248])', 'fortran_order': (False|True), "
    rb"'shape': \((\d+),\), \} *\n?"
)


def _npy_header(data: bytes) -> tuple:
    """``(shape, fortran_order, dtype, header end)`` of the .npy file whose bytes are ``data``."""
    if data[6:8] == b"\x01\x00" and len(data) >= 10:
        end = 10 + int.from_bytes(data[8:10], "little")
        match = _NPY_SIMPLE_HEADER.fullmatch(data, 10, end)
        if match is not None and end <= len(data):
            shape = (int(match.group(3)),)
            return shape, match.group(2) == b"True", np.dtype(match.group(1).decode()), end
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return (*np.lib.format.read_array_header_1_0(f), f.tell())
    if version == (2, 0):
        return (*np.lib.format.read_array_header_2_0(f), f.tell())
    raise ValueError(f"unsupported .npy version {version}")


# What a .npy header may take beyond its array's bytes (numpy writes 64 to a few hundred).
NPY_HEADER_LIMIT = 1 << 16


def _load_npy(path, items: int | None = None) -> np.ndarray:
    """A .npy array (read-only), its header checked against the file size.

    ``items``, when known, bounds what is read: a file longer than a header and ``items``
    8-byte values is refused before it is read. ``np.load`` alone would treat a non-.npy file
    as a pickle (refused, with a confusing message) and trust a header's shape when allocating.
    """
    limit = None if items is None else NPY_HEADER_LIMIT + 8 * items
    try:
        data = _read_regular_file(path, limit, ": not the .npy array expected here")
    except FileNotFoundError:
        raise AtlasFormatError(f"{path}: missing") from None
    except OSError as exc:
        raise AtlasFormatError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    return parse_npy(data, path)


def parse_npy(data: bytes, path) -> np.ndarray:
    """The array of a .npy file's bytes ``data`` (``path`` names it in errors)."""
    if not data.startswith(_NPY_MAGIC):
        raise AtlasFormatError(f"{path}: not a .npy file (no NUMPY magic)")
    try:
        shape, fortran, dtype, start = _npy_header(data)
        if dtype.hasobject:
            raise ValueError(f"dtype {dtype} holds Python objects")
        needed = math.prod(shape) * dtype.itemsize
        available = len(data) - start
        if needed != available:
            raise ValueError(
                f"the header declares shape {shape} of {dtype} ({needed} bytes) but "
                f"{available} bytes follow it"
            )
        # Read once, the header parsed once (np.load would parse it again).
        array = np.frombuffer(data, dtype=dtype, offset=start, count=math.prod(shape))
        if start % dtype.alignment:  # a header numpy would not write: C reads need alignment
            array = array.copy()
        return array.reshape(shape, order="F" if fortran else "C")
    except Exception as exc:  # numpy raises ValueError, OSError, EOFError, ...
        raise AtlasFormatError(f"{path}: not a readable .npy array: {exc}") from exc


def read_dict_file(path: Path) -> bytes:
    """The bytes of a zstd dictionary file, which must exist and not be empty."""
    try:
        data = _read_regular_file(path)
    except FileNotFoundError:
        raise AtlasFormatError(f"{path}: missing (the compression strategy needs it)") from None
    except OSError as exc:
        raise AtlasFormatError(f"{path}: cannot be read: {exc}") from exc
    return check_dict_bytes(data, path)


def check_dict_bytes(data: bytes, path) -> bytes:
    """``data``, a zstd dictionary file's bytes, which must not be empty."""
    if not data:
        raise AtlasFormatError(f"{path}: empty dictionary")
    return data


def index_dtype(total: int) -> np.dtype:
    """The smallest of uint8/16/32/64 that holds ``total`` (the format's index dtype rule)."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if total <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"a shard of {total} bytes does not fit a uint64 index")


def meta_text(fields: dict) -> str:
    """A meta.json's text exactly as the reference writes it (indent 4, no trailing newline)."""
    return json.dumps(fields, indent=4)


def dump_meta(path: Path, fields: dict) -> None:
    """Write a meta.json exactly as the reference does (``meta_text``)."""
    Path(path).write_text(meta_text(fields))


def check_zstd_content_size(declared: int, compressed_len: int, where: str) -> None:
    """Refuse a frame header whose declared decoded size no honest frame could have."""
    limit = max_block_bytes()
    if declared > limit:
        raise AtlasFormatError(
            f"{where}: the zstd frame declares {declared} decoded bytes, over the "
            f"{limit}-byte limit (ATLAS_FAST_MAX_BLOCK_BYTES)"
        )
    if declared > compressed_len * MAX_ZSTD_RATIO + 1024:
        raise AtlasFormatError(
            f"{where}: the zstd frame declares {declared} decoded bytes from "
            f"{compressed_len} encoded bytes, which zstd cannot produce: corrupt header"
        )


# -- block-level checks and messages, shared by every backend -------------------------------
#
# A backend's hot path does the cheap tests inline (is it a list of the right length?) and
# calls these only to build the error, so both backends word every problem the same way.


def expected_block_length(n_examples: int, block_size: int, b: int) -> int:
    """How many examples block ``b`` of a shard of ``n_examples`` must hold."""
    return min(block_size, n_examples - b * block_size)


def check_block_examples(examples, expected: int, data_path, b: int) -> None:
    """Refuse a decoded block that is not a list of ``expected`` examples."""
    if type(examples) is not list:
        raise AtlasFormatError(
            f"{data_path}: block {b} holds a {type(examples).__name__}, not a list"
        )
    if len(examples) != expected:
        raise AtlasFormatError(
            f"{data_path}: block {b} holds {len(examples)} examples, expected {expected}"
        )


def unpickle_error(exc: BaseException, data_path, b: int) -> Exception:
    """The exception to raise when unpickling block ``b`` raised ``exc``.

    An ``UnsafePickleError`` stays one (with the location appended); anything else means the
    block is corrupt and becomes an ``AtlasFormatError``. Raise the result ``from exc``.
    """
    if isinstance(exc, UnsafePickleError):
        return UnsafePickleError(f"{exc} (in {data_path}, block {b})")
    return AtlasFormatError(
        f"{data_path}: block {b} does not unpickle: {type(exc).__name__}: {exc}"
    )


def truncated_block_error(data_path, b: int, start: int, end: int, got: int) -> AtlasFormatError:
    """Block ``b`` should span bytes ``start..end`` of data.bin but only ``got`` were read."""
    return AtlasFormatError(
        f"{data_path}: block {b} is truncated "
        f"(expected bytes {start}..{end}, the file ends at {start + got})"
    )


def zstd_dictionary_mismatch(
    where: str, frame_dict_id: int, dict_id: int | None, dict_path
) -> AtlasFormatError | None:
    """The error for a zstd frame that names another dictionary than the shard's, or None.

    ``where`` is "<data.bin>: block <b>"; ``frame_dict_id`` is the dictionary ID recorded in
    the frame header (0: none recorded), ``dict_id`` that of the dictionary the shard decodes
    with (None: no dictionary; 0: a raw-content dictionary, whose ID is unknown).
    """
    if frame_dict_id:
        if dict_id is None:
            return AtlasFormatError(
                f"{where}: the zstd frame needs dictionary {frame_dict_id} but the shard's "
                "compression_strategy uses no dictionary"
            )
        if dict_id and dict_id != frame_dict_id:
            return AtlasFormatError(
                f"{where}: the zstd frame needs dictionary {frame_dict_id} but {dict_path} "
                f"is dictionary {dict_id}: wrong dictionary"
            )
    return None


def corrupt_frame_error(where: str, detail: str, dict_path) -> AtlasFormatError:
    """The error for a zstd frame that did not decode, for no reason told apart
    (``zstd_dictionary_mismatch``, truncation, trailing bytes): ``detail`` is zstd's.
    With a dictionary (``dict_path`` not None), either may be damaged: a frame decoded with a
    damaged dictionary fails its checksum when it has one (``checksums=True`` writers)."""
    suspects = "" if dict_path is None else f" (the block or the dictionary {dict_path})"
    return AtlasFormatError(f"{where}: corrupt zstd frame{suspects}: {detail}")


def block_checksum(data) -> int:
    """The checksum of one stored block: its 8-byte BLAKE2b digest as a little-endian int."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def load_checksums(shard_dir: Path, n_blocks: int):
    """The shard's block checksums (uint64 array), or None when it has no checksum file."""
    path = Path(shard_dir) / CHECKSUM_FILE
    if not path.exists():
        return None
    return check_checksums(_load_npy(path, n_blocks), path, n_blocks)


def check_checksums(raw, path, n_blocks: int):
    """``raw``, the array of the checksum file at ``path`` (a path or URL), checked: one
    little-endian uint64 per block."""
    if not isinstance(raw, np.ndarray) or raw.ndim != 1 or raw.dtype != np.dtype("<u8"):
        raise AtlasFormatError(
            f"{path}: expected a 1-D little-endian uint64 array, found "
            f"{getattr(raw, 'dtype', type(raw).__name__)} of shape {np.shape(raw)}"
        )
    if len(raw) != n_blocks:
        raise AtlasFormatError(f"{path}: has {len(raw)} checksums for {n_blocks} blocks")
    return raw
