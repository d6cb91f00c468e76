"""``--to hf``: a Hugging Face ``datasets`` directory, as ``Dataset.save_to_disk`` writes it:
``data-00000-of-0000N.arrow`` (Arrow IPC streams), ``state.json`` and ``dataset_info.json``,
which ``datasets.load_from_disk`` and ``convert --from hf`` read.

Rows are held as for Parquet (``_arrow``). A ``datasets`` dataset has one schema: at the end
the files' schemas are unified (a column of nulls in one file takes the type the others give
it; such files are rewritten), and examples whose keys or types differ between files are an
``ExportError`` naming the first example of each of two such files. ``state.json`` is written
last: it is what makes the directory a dataset.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from ..convert._pickled import PICKLED
from ._arrow import ArrowRows, pyarrow
from ._holds import ExportError

__all__ = ["EXTRA", "INDEX_FILES", "PartWriter", "finish"]

# Uploaded after every other file (DST a URL): what makes DST a dataset.
INDEX_FILES = ("dataset_info.json", "state.json")
EXTRA = "hf"
SUFFIX = ".arrow"


class PartWriter:
    """Writes one part's examples into ``out/0.arrow``, ... (Arrow IPC streams)."""

    def __init__(self, out: Path, options: dict):
        self.pa = pyarrow(EXTRA, "exporting to Hugging Face datasets")
        self.out = out
        self.files: list = []
        self.firsts: list = []  # the ``where`` of each file's first example
        self.writer = None
        self.sink = None
        self.rows = ArrowRows("Hugging Face", options["pickle"], self._sink, self._close_file)

    def _sink(self, table, first) -> None:
        if self.writer is None:
            path = self.out / f"{len(self.files)}{SUFFIX}"
            self.files.append(path.name)
            self.firsts.append(first())
            self.sink = self.pa.OSFile(str(path), "wb")
            self.writer = self.pa.ipc.new_stream(self.sink, table.schema)
        self.writer.write_table(table, max_chunksize=1000)

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.sink.close()
            self.writer = self.sink = None

    def add(self, example, where, index: int) -> None:
        self.rows.add(example, where)

    def close(self) -> dict:
        self.rows.flush()
        self._close_file()
        return {"files": self.files, "firsts": self.firsts, "pickled": self.rows.pickled}

    def abort(self) -> None:
        self._close_file()


def _schema(pa, path: Path):
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).schema


def _features(schema) -> dict | None:
    """``datasets``' features of ``schema`` as a dict, when ``datasets`` is installed."""
    try:
        import datasets
    except ImportError:
        return None
    return datasets.Features.from_arrow_schema(schema).to_dict()


def finish(out: Path, parts: list, options: dict) -> list:
    """The files in order as ``data-NNNNN-of-NNNNN.arrow``, on one schema, then
    ``dataset_info.json`` and ``state.json``; the names, state.json last."""
    pa = pyarrow(EXTRA, "exporting to Hugging Face datasets")
    files = [
        (Path(directory) / name, first)
        for directory, result in parts
        for name, first in zip(result["files"], result["firsts"])
    ]
    schemas = [_schema(pa, path) for path, _ in files]
    schema = _unified(pa, schemas, files)
    features = _features(schema) if schema is not None else None
    if schema is None:
        schema = pa.schema([])
    if features is not None:
        meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
        schema = schema.with_metadata(meta)
    width = max(5, len(str(len(files))))
    names = []
    for n, ((path, _), own) in enumerate(zip(files, schemas)):
        name = f"data-{n:0{width}d}-of-{len(files):0{width}d}{SUFFIX}"
        if own.equals(schema, check_metadata=True):
            path.rename(out / name)
        else:
            _rewrite(pa, path, out / name, schema)
            path.unlink()
        names.append(name)
    info = {"citation": "", "description": "", "homepage": "", "license": ""}
    if features is not None:
        info["features"] = features
    (out / "dataset_info.json").write_text(json.dumps(info, indent=2, sort_keys=True))
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": secrets.token_hex(8),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (out / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    return [*names, "dataset_info.json", "state.json"]


def _unified(pa, schemas: list, files: list):
    """The one schema of every file (metadata aside); an ``ExportError`` naming two files'
    first examples when their columns or types cannot be one. A file of pickled rows only
    (its one column ``PICKLED``) takes the others' columns, null."""
    if not schemas:
        return None
    full = [k for k, s in enumerate(schemas) if s.names != [PICKLED]] or [0]
    first_names = schemas[full[0]].names
    for k in full[1:]:
        if schemas[k].names != first_names:
            raise ExportError(
                f"{files[k][1]}: its keys {schemas[k].names} differ from those of "
                f"{files[full[0]][1]}, {first_names}: a Hugging Face dataset has one set of "
                "columns"
            )
    schemas = [
        s
        if s.names == first_names
        else pa.schema([pa.field(n, pa.null()) for n in first_names[:-1]] + [s.field(PICKLED)])
        for s in schemas
    ]
    try:
        return pa.unify_schemas([s.remove_metadata() for s in schemas])
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    for name in first_names:
        types = {}
        for k, schema in enumerate(schemas):
            t = schema.field(name).type
            if t != pa.null():
                types.setdefault(t, k)
        if len(types) > 1:
            (t1, k1), (t2, k2) = list(types.items())[:2]
            raise ExportError(
                f"{files[k2][1]}: column {name!r} is {t2} there and {t1} in {files[k1][1]}: a "
                "Hugging Face dataset has one type per column"
            )
    raise ExportError(f"{files[0][0]}: the files' schemas cannot be unified")


def _rewrite(pa, source: Path, target: Path, schema) -> None:
    """``source``'s batches cast to ``schema`` (a column of nulls to its type; a column it
    lacks, null) in ``target``."""
    with pa.memory_map(str(source)) as src, pa.OSFile(str(target), "wb") as sink:
        reader = pa.ipc.open_stream(src)
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in reader:
                columns = [
                    batch.column(field.name).cast(field.type)
                    if field.name in batch.schema.names
                    else pa.nulls(batch.num_rows, field.type)
                    for field in schema
                ]
                writer.write_batch(pa.record_batch(columns, schema=schema))
