"""Examples stored pickled by ``atlas-fast export --pickle``, and read back by ``unpickle``.

An example a target format cannot hold exactly (an arbitrary object into Parquet) is stored
whole, pickled, in the field ``PICKLED`` of a row (Parquet, Hugging Face: its other columns
null), a JSON line (``{"__atlas_pickle__": "<base64>"}``), a webdataset sample (a member
``KEY.__atlas_pickle__``) or an MDS sample (a ``pkl`` column). ``convert`` gives the object
back with ``unpickle=True`` (``--unpickle``); without it such a record is an error naming it:
unpickling runs code, so it is for data you trust.
"""

from __future__ import annotations

import base64
import binascii
import pickle

from ._source import SourceError

__all__ = ["PICKLED", "from_arrow_row", "from_json_value", "refuse"]

PICKLED = "__atlas_pickle__"


def refuse(where: str) -> SourceError:
    return SourceError(
        f"{where}: holds an example pickled by atlas-fast export (field {PICKLED!r}): pass "
        "unpickle=True (--unpickle) to read it; unpickling runs code, for data you trust only"
    )


def _loads(data: bytes, where: str):
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise SourceError(
            f"{where}: field {PICKLED!r} does not unpickle: {type(exc).__name__}: {exc}"
        ) from None


def from_arrow_row(row: dict, unpickle: bool, where):
    """A row of a table holding the ``PICKLED`` column: its example (``where()`` names the
    row for an error)."""
    data = row.pop(PICKLED)
    if data is None:
        return row
    if not unpickle:
        raise refuse(where())
    return _loads(data, where())


def from_json_value(value, unpickle: bool, where):
    """A JSON line's value: the example pickled in it, if it is ``{PICKLED: "<base64>"}``."""
    if type(value) is not dict or len(value) != 1 or PICKLED not in value:
        return value
    if not unpickle:
        raise refuse(where())
    text = value[PICKLED]
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise SourceError(f"{where()}: field {PICKLED!r} is not base64") from None
    return _loads(data, where())
