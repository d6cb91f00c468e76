"""``--to jsonl``: a directory of JSON lines files, ``part-00000.jsonl``, ... in the order of
the examples; each example one line.

An example is held if it is made of None, bool, int, finite floats, str, lists and dicts
with string keys (what ``json.loads`` gives back, type for type): a tuple, bytes, a NaN or a
numpy value are not. Non-ASCII text is written as UTF-8 (a str that UTF-8 cannot encode, a
lone surrogate, is written with ``\\u`` escapes instead).
"""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

from ..convert._pickled import PICKLED
from ._holds import JSON_SCALARS, cannot_hold, finite_json, foreign, found_text
from ._parquet import rename_in_order

__all__ = ["EXTRA", "PartWriter", "finish"]

EXTRA = None
SUFFIX = ".jsonl"
_BUFFER = 1 << 20


class PartWriter:
    """Writes one part's examples into ``out/0.jsonl``."""

    def __init__(self, out: Path, options: dict):
        self.pickle = options["pickle"]
        self.path = out / f"0{SUFFIX}"
        self.file = open(self.path, "wb")
        self.lines: list = []
        self.size = 0
        self.count = 0
        self.pickled = 0
        self.encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode

    def add(self, example, where, index: int) -> None:
        found = foreign(example, JSON_SCALARS, finite_json)
        if found is None and type(example) is dict and len(example) == 1 and PICKLED in example:
            found = ((), f"a dict whose one key is {PICKLED!r}, the name kept for pickled examples")
        if found is not None:
            if not self.pickle:
                raise cannot_hold("JSON lines", where(), found_text(found))
            self.pickled += 1
            data = pickle.dumps(example, protocol=pickle.HIGHEST_PROTOCOL)
            example = {PICKLED: base64.b64encode(data).decode("ascii")}
        try:
            line = (self.encode(example) + "\n").encode()
        except UnicodeEncodeError:  # a lone surrogate: \u escapes read back as the same str
            line = (json.dumps(example, allow_nan=False) + "\n").encode()
        self.lines.append(line)
        self.count += 1
        self.size += len(line)
        if self.size >= _BUFFER:
            self._write()

    def _write(self) -> None:
        self.file.write(b"".join(self.lines))
        self.lines, self.size = [], 0

    def close(self) -> dict:
        self._write()
        self.file.close()
        if not self.count:  # no file for a part without examples
            self.path.unlink()
        return {"files": [self.path.name] if self.count else [], "pickled": self.pickled}

    def abort(self) -> None:
        self.file.close()


def finish(out: Path, parts: list, options: dict) -> list:
    return rename_in_order(out, parts, "part-", SUFFIX)
