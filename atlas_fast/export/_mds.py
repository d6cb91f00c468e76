"""``--to mds``: a MosaicML MDS directory, ``index.json`` and ``shard.00000.mds``, ... as
mosaicml-streaming's ``MDSWriter`` writes it (format version 2, uncompressed shards of up to
64 MiB, no hashes), written by this module: the library is not needed to export (its
encodings are a few lines each; the tests read the result with the library itself).

An example is a dict with string keys, one column each (a shard's columns are its examples'
keys, sorted, as ``MDSWriter`` orders them). Each column's encoding is chosen from the values
of the shard's first examples (up to ``LOOKAHEAD``), as one that decodes each back to the same
type: ``bytes``,
``str``, ``int`` (``str_int`` beyond int64), ``str_float`` for a float (its repr: exact),
``str_decimal``, the numpy scalar encodings (``uint8`` ... ``float64``) for numpy scalars,
``ndarray`` for a numpy array of those dtypes (not empty, not 0-d), ``json`` for None, bools,
lists and dicts made of JSON values, and for a column of JSON values of several types (ints
and None). An example whose keys or value types do not fit the open shard's columns starts a
new shard (each shard of an MDS index has its own columns).
Anything else is an ``ExportError``; with ``pickle``, such a value is a ``pkl`` column, and
an example that is not such a dict is stored as ``{"__atlas_pickle__": example}`` in one
(``convert --from mds --allow-unsafe-types`` gives the example back).
"""

from __future__ import annotations

import json
import pickle
import struct
from decimal import Decimal
from pathlib import Path

import numpy as np

from ..convert._pickled import PICKLED
from ._holds import JSON_SCALARS, cannot_hold, finite_json, foreign, found_text, type_name

__all__ = ["EXTRA", "INDEX_FILES", "PartWriter", "finish"]

# Uploaded after every other file (DST a URL): what makes DST a dataset.
INDEX_FILES = ("index.json",)
EXTRA = None
SIZE_LIMIT = 1 << 26  # MDSWriter's default
LOOKAHEAD = 256  # the examples a shard's encodings are chosen from
_SCALARS = {
    np.uint8: "uint8",
    np.uint16: "uint16",
    np.uint32: "uint32",
    np.uint64: "uint64",
    np.int8: "int8",
    np.int16: "int16",
    np.int32: "int32",
    np.int64: "int64",
    np.float16: "float16",
    np.float32: "float32",
    np.float64: "float64",
}
_ARRAY_DTYPES = {  # NDArray's dtype codes
    "uint8": 8,
    "int8": 9,
    "uint16": 16,
    "int16": 17,
    "float16": 18,
    "uint32": 32,
    "int32": 33,
    "float32": 34,
    "uint64": 64,
    "int64": 65,
    "float64": 66,
}
_FIXED = {"int": 8, **{name: np.dtype(name).itemsize for name in _SCALARS.values()}}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _is_array(value) -> bool:
    return (
        type(value) is np.ndarray
        and value.dtype.name in _ARRAY_DTYPES
        and value.dtype.isnative
        and 0 < value.ndim < 64
        and value.size > 0
    )


def _json_value(value) -> bool:
    return foreign(value, JSON_SCALARS, finite_json) is None


def _encoding(value) -> str | None:
    """The encoding that gives ``value`` back as it is, or None."""
    t = type(value)
    if t is bytes:
        return "bytes"
    if t is str:
        return "str" if _utf8(value) else None
    if t is int:
        return "int" if _INT64[0] <= value <= _INT64[1] else "str_int"
    if t is float:
        return "str_float"
    if t is Decimal:
        return "str_decimal"
    if t in _SCALARS:
        return _SCALARS[t]
    if t is np.ndarray:
        return "ndarray" if _is_array(value) else None
    return "json" if _json_value(value) else None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fits(encoding: str, value) -> bool:
    """Whether ``encoding`` gives ``value`` back as it is."""
    if encoding == "pkl":
        return True
    if encoding == "json":
        return _json_value(value)
    return _encoding(value) == encoding


def _encode(encoding: str, value) -> bytes:
    if encoding == "bytes":
        return value
    if encoding == "str":
        return value.encode("utf-8")
    if encoding == "int":
        return struct.pack("<q", value)
    if encoding in ("str_int", "str_float", "str_decimal"):
        return str(value).encode("utf-8")
    if encoding == "json":
        return json.dumps(value, allow_nan=False).encode("utf-8")
    if encoding == "pkl":
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    if encoding == "ndarray":
        shape = np.array(value.shape, np.int64)
        top = int(shape.max())
        code = 0 if top < 1 << 8 else 1 if top < 1 << 16 else 2 if top < 1 << 32 else 3
        shape_dtype = ("uint8", "uint16", "uint32", "uint64")[code]
        head = bytes([_ARRAY_DTYPES[value.dtype.name], (value.ndim << 2) | code])
        return head + shape.astype(shape_dtype).tobytes() + value.tobytes()
    return value.tobytes()  # a numpy scalar


class _Shard:
    """The samples of one MDS shard being gathered, on fixed columns."""

    def __init__(self, names: list, encodings: list):
        self.names = names
        self.encodings = encodings
        self.sizes = [_FIXED.get(e) for e in encodings]
        self.samples: list = []
        self.nbytes = 0

    def config(self) -> dict:
        return {
            "column_encodings": self.encodings,
            "column_names": self.names,
            "column_sizes": self.sizes,
            "compression": None,
            "format": "mds",
            "hashes": [],
            "size_limit": SIZE_LIMIT,
            "version": 2,
        }

    def fits(self, example: dict) -> bool:
        return len(example) == len(self.names) and all(
            name in example and _fits(enc, example[name])
            for name, enc in zip(self.names, self.encodings)
        )

    def add(self, example: dict) -> None:
        heads, data = [], []
        for name, encoding, size in zip(self.names, self.encodings, self.sizes):
            datum = _encode(encoding, example[name])
            if size is None:
                heads.append(len(datum))
            data.append(datum)
        sample = struct.pack(f"<{len(heads)}I", *heads) + b"".join(data)
        self.samples.append(sample)
        self.nbytes += len(sample) + 4

    def write(self, path: Path) -> dict:
        config = json.dumps(self.config(), sort_keys=True).encode()
        n = len(self.samples)
        start = 4 + 4 * (n + 1) + len(config)
        offsets = np.cumsum([start] + [len(s) for s in self.samples], dtype=np.int64)
        if offsets[-1] >= 1 << 32:
            raise ValueError(f"{path}: an MDS shard holds less than 4 GiB")
        with open(path, "wb") as f:
            f.write(struct.pack("<I", n))
            f.write(offsets.astype("<u4").tobytes())
            f.write(config)
            for sample in self.samples:
                f.write(sample)
        return {**self.config(), "samples": n, "bytes": int(offsets[-1])}


class PartWriter:
    """Writes one part's examples into ``out/0.mds``, ``out/1.mds``, ..."""

    def __init__(self, out: Path, options: dict):
        self.out = out
        self.pickle = options["pickle"]
        self.shard = None
        self.pending: list = []  # examples waiting for a shard's encodings to be chosen
        self.entries: list = []
        self.files: list = []
        self.pickled = 0

    def add(self, example, where, index: int) -> None:
        shard = self.shard
        if (
            shard is not None
            and type(example) is dict
            and PICKLED not in example
            and shard.fits(example)
        ):
            shard.add(example)
            if shard.nbytes >= SIZE_LIMIT:
                self._write_shard()
            return
        self._put(self._held(example, where))

    def _put(self, example: dict) -> None:
        """A checked example into the open shard, or to wait for the next one's encodings."""
        if self.shard is not None:
            if self.shard.fits(example):
                self.shard.add(example)
                if self.shard.nbytes >= SIZE_LIMIT:
                    self._write_shard()
                return
            self._write_shard()
        self.pending.append(example)
        if len(self.pending) >= LOOKAHEAD:
            self._open_shard()

    def _open_shard(self) -> None:
        """A shard for the examples pending: the longest run of them with one set of keys
        whose values one encoding per column holds; the rest go on waiting."""
        pending = self.pending
        keys = pending[0].keys()
        n = next((i for i, e in enumerate(pending) if e.keys() != keys), len(pending))
        names = sorted(keys)
        encodings = []
        for name in names:
            values = [e[name] for e in pending[:n]]
            candidates = self._candidates(values[0])
            chosen = next((c for c in candidates if all(_fits(c, v) for v in values)), None)
            if chosen is None:  # the first's own encoding, as far as the values fit it
                chosen = candidates[0]
                n = next(i for i, v in enumerate(values) if not _fits(chosen, v))
            encodings.append(chosen)
        self.shard = _Shard(names, encodings)
        self.pending = []
        for example in pending[:n]:
            self.shard.add(example)
        if self.shard.nbytes >= SIZE_LIMIT:
            self._write_shard()
        for example in pending[n:]:
            self._put(example)

    def _candidates(self, value) -> list:
        """The encodings to try for a column whose first value is ``value``, best first."""
        own = _encoding(value)
        found = [] if own is None else [own]
        if own != "json" and _json_value(value):
            found.append("json")
        if self.pickle:
            found.append("pkl")
        return found

    def _held(self, example, where) -> dict:
        """``example`` as an MDS sample (pickled where asked), or the error naming it."""
        problem = None
        if type(example) is not dict:
            problem = f"it is {type_name(example)}, not a dict of columns"
        elif not example:
            problem = "it is an empty dict (an MDS sample needs a column)"
        elif PICKLED in example:
            problem = f"its key {PICKLED!r} is the name export keeps for pickled examples"
        else:
            for key, value in example.items():
                if type(key) is not str:
                    problem = f"it has a key of type {type_name(key)} ({key!r:.40})"
                    break
                if _encoding(value) is None and not self.pickle:
                    found = foreign(value, JSON_SCALARS, finite_json)
                    what = found_text(((key, *found[0]), found[1])) if found else type_name(value)
                    raise cannot_hold("MDS", where(), what)
            else:
                return example
        if not self.pickle:
            raise cannot_hold("MDS", where(), problem)
        self.pickled += 1
        return {PICKLED: example}

    def _write_shard(self) -> None:
        if self.shard.samples:
            path = self.out / f"{len(self.files)}.mds"
            self.entries.append(self.shard.write(path))
            self.files.append(path.name)
        self.shard = None

    def close(self) -> dict:
        while self.pending or self.shard is not None:
            if self.shard is not None:
                self._write_shard()
            else:
                self._open_shard()
        return {"files": self.files, "entries": self.entries, "pickled": self.pickled}

    def abort(self) -> None:
        pass


def finish(out: Path, parts: list, options: dict) -> list:
    """The shards in order as ``shard.NNNNN.mds``, then ``index.json`` (what makes the
    directory a dataset); the names, index.json last."""
    shards, names = [], []
    items = [
        (Path(directory) / name, entry)
        for directory, result in parts
        for name, entry in zip(result["files"], result["entries"])
    ]
    width = max(5, len(str(len(items) - 1)))
    for n, (path, entry) in enumerate(items):
        name = f"shard.{n:0{width}d}.mds"
        path.rename(out / name)
        nbytes = entry.pop("bytes")
        entry["raw_data"] = {"basename": name, "bytes": nbytes, "hashes": {}}
        entry["zip_data"] = None
        shards.append(entry)
        names.append(name)
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}, sort_keys=True))
    return [*names, "index.json"]
