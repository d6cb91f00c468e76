"""``--to webdataset``: a directory of tar shards, ``shard-000000.tar``, ... in the order of
the examples; each example one sample, its members ``KEY.EXT``.

An example is a dict: ``__key__`` (a str; when absent, the example's index, zero-padded)
names the sample, ``__url__`` is left out (a reader sets it to the shard it reads), and every
other key is an extension whose value is written as a member: ``bytes`` as they are; the
values ``convert --from wds --decode`` (and webdataset's basic decoders) give back are
encoded for their extension (the part after its last dot): a str for txt/text/transcript
(UTF-8), an int for cls/cls2/class/count/index/inx/id, a JSON value for json/jsn, a numpy
array for npy (``numpy.save``, no pickles). Anything else, a key that webdataset would read
differently (a dot in its last path component, a leading ``__``, an extension that is not
lower-case), or two consecutive examples of one key (webdataset would read them as one
sample) is an ``ExportError``; with ``pickle``, an example that cannot be held is stored
whole, pickled, in a member ``KEY.__atlas_pickle__``.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from pathlib import Path

from ..convert._pickled import PICKLED
from ._holds import JSON_SCALARS, ExportError, cannot_hold, finite_json, foreign, type_name
from ._parquet import rename_in_order

__all__ = ["EXTRA", "PartWriter", "finish"]

EXTRA = None
SUFFIX = ".tar"
_TEXT = {"txt", "text", "transcript"}
_INT = {"cls", "cls2", "class", "count", "index", "inx", "id"}
_JSON = {"json", "jsn"}
_META = ("__key__", "__url__")


def _encode(ext: str, value):
    """The member bytes of ``value`` under extension ``ext``, or None if it has none."""
    if type(value) is bytes:
        return value
    kind = ext.rsplit(".", 1)[-1]
    if kind in _TEXT and type(value) is str:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            return None
    if kind in _INT and type(value) is int:
        return str(value).encode()
    if kind in _JSON and foreign(value, JSON_SCALARS, finite_json) is None:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8", "strict")
    if kind == "npy":
        import numpy as np

        if type(value) is np.ndarray and not value.dtype.hasobject:
            buf = io.BytesIO()
            np.save(buf, value, allow_pickle=False)
            return buf.getvalue()
    return None


def _key_problem(key) -> str | None:
    if type(key) is not str:
        return f"its __key__ is {type_name(key)}, not a str"
    base = key.rsplit("/", 1)[-1]
    if not base or "." in base:
        return f"its __key__ {key!r} has {'a dot in' if base else 'no'} last path component"
    if key.startswith(("/", "__")) or ".." in key.split("/") or "\0" in key:
        return f"its __key__ {key!r} starts with / or __, or holds .. or NUL"
    return None


def _ext_problem(ext) -> str | None:
    if type(ext) is not str:
        return f"a key of type {type_name(ext)}, not a str"
    if not ext or "/" in ext or ext != ext.lower() or "\0" in ext or ext == PICKLED:
        return f"its key {ext!r} is not an extension webdataset reads back as itself"
    return None


class PartWriter:
    """Writes one part's examples into ``out/0.tar``."""

    def __init__(self, out: Path, options: dict):
        self.pickle = options["pickle"]
        self.width = options["key_width"]
        self.path = out / f"0{SUFFIX}"
        self.tar = tarfile.open(self.path, "w", format=tarfile.PAX_FORMAT)
        self.previous = None
        self.count = 0
        self.pickled = 0

    def add(self, example, where, index: int) -> None:
        key = None
        members = None
        problem = None
        if type(example) is dict:
            key = example.get("__key__", f"{index:0{self.width}d}")
            problem = _key_problem(key)
            if problem is None:
                members, problem = self._members(key, example)
        else:
            problem = f"it is {type_name(example)}, not a dict of extensions"
        if problem is not None:
            if not self.pickle or (key is not None and _key_problem(key) is not None):
                raise cannot_hold("webdataset", where(), problem)
            self.pickled += 1
            if key is None or type(example) is not dict:
                key = f"{index:0{self.width}d}"
            data = pickle.dumps(example, protocol=pickle.HIGHEST_PROTOCOL)
            members = [(f"{key}.{PICKLED}", data)]
        if key == self.previous:
            raise ExportError(
                f"{where()}: its __key__ {key!r} is the one of the example before it: "
                "webdataset would read the two as one sample"
            )
        self.previous = key
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            self.tar.addfile(info, io.BytesIO(data))
        self.count += 1

    @staticmethod
    def _members(key: str, example: dict):
        members = []
        for ext, value in example.items():
            if ext in _META:
                continue
            problem = _ext_problem(ext)
            if problem is not None:
                return None, problem
            data = _encode(ext, value)
            if data is None:
                what = type_name(value)
                return None, f"its value at {ext!r} is {what}, which .{ext} does not hold"
            members.append((f"{key}.{ext}", data))
        if not members:
            return None, "it has no extension besides __key__ and __url__"
        return members, None

    def close(self) -> dict:
        self.tar.close()
        if not self.count:
            self.path.unlink()
        return {"files": [self.path.name] if self.count else [], "pickled": self.pickled}

    def abort(self) -> None:
        self.tar.close()


def finish(out: Path, parts: list, options: dict) -> list:
    return rename_in_order(out, parts, "shard-", SUFFIX, width=6)
