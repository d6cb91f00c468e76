"""Examples into Arrow tables, exactly or not at all: what the Parquet and Hugging Face targets
share.

Each example must be a dict with string keys whose values are ``ARROW_SCALARS``, lists and
dicts of them. Rows are gathered into chunks; a chunk becomes a table (pyarrow infers the
types, or the open file's schema is used) and each column is checked against what it will
read back as (``_check``): an int stored in a float column, a str in a binary one, a tuple
turned into a list are found there. Rows whose keys differ from the chunk's first, or whose
types do not fit the open file's schema, start a new file (a file has one schema); a row that
no table can hold is an ``ExportError`` naming it, or, with ``pickle``, is stored whole,
pickled, in the ``PICKLED`` column (every row of a file written with ``pickle`` has that
column: null for the rows stored as they are).
"""

from __future__ import annotations

import pickle as _pickle

from .._extras import require
from ..convert._pickled import PICKLED
from ._holds import ARROW_SCALARS, cannot_hold, exact, foreign, found_text, int64

__all__ = ["ArrowRows", "pyarrow"]

CHUNK_ROWS = 8192  # rows of a table at most
CHUNK_BYTES = 32 << 20  # of Arrow data, at most about: a chunk of large rows is cut sooner
FIRST_ROWS = 256  # the first chunk's rows, before the size of a row is known


def pyarrow(extra: str, feature: str):
    return require("pyarrow", extra, feature)


def _expected_types(pa) -> dict:
    """The Python type each flat Arrow type reads back as (``to_pylist``)."""
    return {
        pa.int64(): int,
        pa.float64(): float,
        pa.bool_(): bool,
        pa.string(): str,
        pa.large_string(): str,
        pa.binary(): bytes,
        pa.large_binary(): bytes,
    }


class _Pickled:
    """A row stored pickled: its bytes and what the error would have said."""

    __slots__ = ("data",)

    def __init__(self, example):
        self.data = _pickle.dumps(example, protocol=_pickle.HIGHEST_PROTOCOL)


class ArrowRows:
    """Gathers rows and hands finished tables to ``sink(table, first)`` (``first()`` names
    the table's first example), which opens a file if none is open (``new_file()`` closes
    it: the next table may have another schema).

    ``target``: its name in errors; ``pickle``: store what cannot be held pickled."""

    def __init__(self, target: str, pickle: bool, sink, new_file):
        self.pa = pyarrow(target.lower().split()[0], f"exporting to {target}")
        self.expected = _expected_types(self.pa)
        self.target = target
        self.pickle = pickle
        self.sink = sink
        self.new_file = new_file
        self.schema = None  # the open file's, or None
        self.rows: list = []
        self.wheres: list = []
        self.keys = None  # the keys of the chunk's rows
        self.limit = FIRST_ROWS  # rows of the next chunk: CHUNK_BYTES of the last table's rows
        self.pickled = 0

    def add(self, example, where) -> None:
        """``where()``: the example's name for an error."""
        if type(example) is dict and example and _flat(example):
            keys = example.keys()
        else:
            found = _not_held(example)
            if found is not None:
                self._hold_pickled(example, where, found)
                return
            keys = example.keys()
        if self.keys is not None and keys != self.keys:
            self.flush()
        if self.keys is None:
            self.keys = keys
        self.rows.append(example)
        self.wheres.append(where)
        if len(self.rows) >= self.limit:
            self.flush()

    def _hold_pickled(self, example, where, what: str) -> None:
        if not self.pickle:
            raise cannot_hold(self.target, where(), what)
        self.pickled += 1
        self.rows.append(_Pickled(example))
        self.wheres.append(where)
        if len(self.rows) >= self.limit:
            self.flush()

    def flush(self) -> None:
        """Write the rows gathered: in as few tables as their types allow."""
        rows, wheres = self.rows, self.wheres
        keys = list(self.keys) if self.keys is not None else []
        self.rows, self.wheres, self.keys = [], [], None
        while rows:
            table, fit = self._largest_fit(rows, keys)
            if fit:
                self._write(table, wheres[0])
                rows, wheres = rows[fit:], wheres[fit:]
                if not rows:
                    return
            if self.schema is not None:  # rows[0] does not fit this file's types: a new one
                self.new_file()
                self.schema = None
                continue
            # No table holds rows[0] alone (an int beyond int64, ...).
            example = rows[0]
            found = foreign(example, ARROW_SCALARS, int64)
            what = found_text(found) if found else "pyarrow cannot convert it"
            if not self.pickle:
                raise cannot_hold(self.target, wheres[0](), what)
            self.pickled += 1
            rows[0] = _Pickled(example)

    def _write(self, table, first) -> None:
        if self.schema is None:
            self.schema = table.schema
        row_bytes = max(1, table.nbytes // max(1, table.num_rows))
        self.limit = max(1, min(CHUNK_ROWS, CHUNK_BYTES // row_bytes))
        self.sink(table, first)

    def _largest_fit(self, rows: list, keys: list):
        """The table of the longest prefix of ``rows`` held exactly (with the open file's
        schema, if any) and its length (0: not even the first row)."""
        if self.schema is not None and list(self.schema.names) != self._names(keys):
            return None, 0
        table = self._table(rows, keys)
        if table is not None:
            return table, len(rows)
        lo, hi, best = 0, len(rows) - 1, None  # rows[:lo] fit, rows[:hi + 1] do not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            table = self._table(rows[:mid], keys)
            if table is not None:
                lo, best = mid, table
            else:
                hi = mid - 1
        return best, lo

    def _names(self, keys: list) -> list:
        return [*keys, PICKLED] if self.pickle else list(keys)

    def _table(self, rows: list, keys: list):
        """The table of ``rows``, or None if it would not read back as them."""
        pa = self.pa
        columns = {}
        pickled = None
        if self.pickle:
            pickled = [r.data if type(r) is _Pickled else None for r in rows]
        for key in keys:
            columns[key] = [None if type(r) is _Pickled else r[key] for r in rows]
        if pickled is not None:
            columns[PICKLED] = pickled
        try:
            if self.schema is not None:
                table = pa.Table.from_pydict(columns, schema=self.schema)
            else:
                table = pa.Table.from_pydict(columns)
                if pickled is not None and table.schema.field(PICKLED).type != pa.binary():
                    # binary even when no row of this table is pickled
                    i = table.schema.get_field_index(PICKLED)
                    table = table.set_column(
                        i, pa.field(PICKLED, pa.binary()), table.column(i).cast(pa.binary())
                    )
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return None
        if not table.num_columns or table.num_rows != len(rows):
            return None
        for key in keys:
            if not self._check(table, key, columns[key]):
                return None
        return table

    def _check(self, table, key: str, values: list) -> bool:
        """Whether column ``key`` of ``table`` reads back as ``values``."""
        arrow_type = table.schema.field(key).type
        expected = self.expected.get(arrow_type)
        if expected is not None:
            types = set(map(type, values))
            types.discard(type(None))
            return types <= {expected}
        if arrow_type == self.pa.null():
            return True  # every value is None: nothing else makes a null column
        back = table.column(key).to_pylist()
        return all(v is None or exact(v, b) for v, b in zip(values, back))


def _flat(example: dict) -> bool:
    """The common case, checked fast: string keys and scalar values."""
    for key, value in example.items():
        if type(key) is not str or type(value) not in ARROW_SCALARS:
            return False
    return PICKLED not in example


def _not_held(example):
    """A phrase saying why no Arrow table can hold ``example``, or None."""
    if type(example) is not dict:
        return f"it is {_type(example)}, not a dict of columns"
    if not example:
        return "it is an empty dict (a row needs a column)"
    found = foreign(example, ARROW_SCALARS)
    if found is None:
        if PICKLED in example:
            return f"its key {PICKLED!r} is the name export keeps for pickled examples"
        return None
    return found_text(found)


def _type(value) -> str:
    from ._holds import type_name

    return type_name(value)
