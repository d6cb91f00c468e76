"""``--from dolma``: a Dolma dataset: ``documents/**/*.jsonl.gz`` (also .zst and plain .jsonl).

Each document line becomes one example, the document's JSON object as a dict. With
``attributes=["A", "B"]`` the file ``attributes/A/<same relative path>`` is read alongside each
documents file, line by line: line n of it must carry the id of document n, and its
``attributes`` dict is merged into the document's ``attributes`` (later names win on equal
keys). A missing attributes file, a line-count or an id mismatch is a ``SourceError`` naming
both files and the line.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ._files import JSON_LINES_SUFFIXES, find_files, read_json_lines
from ._source import Part, Source, SourceError

__all__ = ["sources"]


def _dataset_root(src: Path) -> Path:
    if (src / "documents").is_dir():
        return src
    if src.name == "documents" and src.is_dir():
        return src.parent
    if not src.exists():
        raise SourceError(f"{src}: no such file or directory")
    raise SourceError(
        f"{src}: not a Dolma dataset (no documents/ directory in it; a Dolma dataset keeps "
        "its documents under documents/**/*.jsonl.gz)"
    )


def _attribute_names(attributes) -> list:
    if attributes is None:
        return []
    if isinstance(attributes, str):
        attributes = attributes.split(",")
    names = [a.strip() for a in attributes if a.strip()]
    for name in names:
        if "/" in name or name in (".", ".."):
            raise SourceError(f"--attributes {name!r}: an attribute name is one directory name")
    return names


def sources(src, attributes=None) -> list:
    """One source, one part per documents file (with its attributes files)."""
    root = _dataset_root(Path(src))
    docs_dir = root / "documents"
    names = _attribute_names(attributes)
    for name in names:
        if not (root / "attributes" / name).is_dir():
            raise SourceError(f"{root / 'attributes' / name}: no such attributes directory")
    parts = []
    for doc in find_files(docs_dir, JSON_LINES_SUFFIXES, "Dolma documents"):
        relative = doc.relative_to(docs_dir)
        attrs = []
        for name in names:
            path = root / "attributes" / name / relative
            if not path.is_file():
                raise SourceError(f"{path}: missing (the attributes {name!r} of {doc})")
            attrs.append(str(path))
        nbytes = doc.stat().st_size + sum(Path(a).stat().st_size for a in attrs)
        parts.append(Part(str(doc), nbytes, partial(_read, str(doc), tuple(attrs))))
    return [Source(parts)]


def _read(doc_path: str, attr_paths: tuple):
    docs = read_json_lines(doc_path)
    attrs = [(path, read_json_lines(path)) for path in attr_paths]
    count = 0
    for number, doc in docs:
        count += 1
        if not isinstance(doc, dict):
            raise SourceError(
                f"{doc_path}: line {number}: a Dolma document is a JSON object, "
                f"not {type(doc).__name__}"
            )
        if attrs:
            merged = dict(doc.get("attributes") or {})
            for path, lines in attrs:
                merged.update(_attributes_for(doc_path, number, count, doc, path, lines))
            doc["attributes"] = merged
        yield doc
    for path, lines in attrs:
        extra = next(lines, None)
        if extra is not None:
            raise SourceError(
                f"{path}: line {extra[0]}: more lines than {doc_path}, which ends after "
                f"{count} documents"
            )


def _attributes_for(doc_path, number, count, doc, path, lines) -> dict:
    line = next(lines, None)
    if line is None:
        raise SourceError(
            f"{doc_path}: line {number}: document {count} has no line in {path}, which ends "
            f"after {count - 1} lines"
        )
    attr_number, record = line
    if not isinstance(record, dict):
        raise SourceError(f"{path}: line {attr_number}: an attributes line is a JSON object")
    if record.get("id") != doc.get("id"):
        raise SourceError(
            f"{doc_path}: line {number}: document id {doc.get('id')!r}, but {path}: line "
            f"{attr_number} has id {record.get('id')!r} (attributes out of line)"
        )
    values = record.get("attributes") or {}
    if not isinstance(values, dict):
        raise SourceError(f"{path}: line {attr_number}: 'attributes' is not a JSON object")
    return values
