"""--from dolma: documents/**, attributes merged line by line; misalignment named."""

from __future__ import annotations

import pytest
from convert_helpers import assert_absent, documents, read_back, write_jsonl

from atlas_fast.convert import SourceError, convert_dolma

FILES = ["2019-08/0001_en.jsonl.gz", "2019-09/0002_en.jsonl.zst", "2019-09/0003_fr.jsonl"]


def _attributes(docs, name):
    return [
        {"id": d["id"], "source": d["source"], "attributes": {f"{name}__score": [[0, 5, i / 7]]}}
        for i, d in enumerate(docs)
    ]


def _dolma(root, per_file=50, names=("tox", "lang")):
    """A Dolma tree written by hand (gzip'd, zstd'd and plain JSON lines); its documents
    with the attributes of ``names`` merged, in file order."""
    expected = []
    for k, relative in enumerate(FILES):
        docs = documents(per_file, seed=k, start=k * per_file)
        if k == 1:
            docs[0]["attributes"] = {"kept": 1}  # a document's own attributes stay
        write_jsonl(root / "documents" / relative, docs)
        for name in names:
            write_jsonl(root / "attributes" / name / relative, _attributes(docs, name))
        for i, doc in enumerate(docs):
            merged = dict(doc)
            attrs = dict(doc.get("attributes") or {})
            for name in names:
                attrs[f"{name}__score"] = [[0, 5, i / 7]]
            merged["attributes"] = attrs
            expected.append(merged)
    return expected


def test_documents_with_attributes(tmp_path, atlas):
    expected = _dolma(tmp_path / "dolma")
    summary = convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes="tox,lang")
    assert read_back(atlas, tmp_path / "out") == expected
    assert summary.examples == 150


def test_documents_alone_and_documents_dir(tmp_path, atlas):
    _dolma(tmp_path / "dolma")
    docs = [d for k in range(3) for d in documents(50, seed=k, start=k * 50)]
    docs[50]["attributes"] = {"kept": 1}
    convert_dolma(tmp_path / "dolma" / "documents", tmp_path / "out", workers=2)
    assert read_back(atlas, tmp_path / "out") == docs


def test_attributes_out_of_line(tmp_path):
    _dolma(tmp_path / "dolma")
    path = tmp_path / "dolma" / "attributes" / "lang" / FILES[0]
    docs = documents(50, seed=0)
    swapped = _attributes(docs, "lang")
    swapped[6], swapped[7] = swapped[7], swapped[6]
    write_jsonl(path, swapped)
    doc_path = tmp_path / "dolma" / "documents" / FILES[0]
    with pytest.raises(SourceError) as info:
        convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes=["tox", "lang"])
    message = str(info.value)
    assert message.startswith(f"{doc_path}: line 7: document id 'doc-6', but {path}: line 7 ")
    assert "has id 'doc-7'" in message
    assert_absent(tmp_path / "out")


def test_attributes_shorter_or_longer(tmp_path):
    _dolma(tmp_path / "dolma", names=("tox",))
    path = tmp_path / "dolma" / "attributes" / "tox" / FILES[2]
    doc_path = tmp_path / "dolma" / "documents" / FILES[2]
    docs = documents(50, seed=2, start=100)
    write_jsonl(path, _attributes(docs, "tox")[:49])
    with pytest.raises(SourceError, match=rf"^{doc_path}: line 50: .* {path}, which ends"):
        convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes="tox")
    assert_absent(tmp_path / "out")
    longer = [*_attributes(docs, "tox"), {"id": "doc-extra", "attributes": {}}]
    write_jsonl(path, longer)
    with pytest.raises(SourceError, match=rf"^{path}: line 51: more lines than {doc_path}"):
        convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes="tox", workers=2)
    assert_absent(tmp_path / "out")


def test_missing_attributes_file_or_directory(tmp_path):
    _dolma(tmp_path / "dolma", names=("tox",))
    missing = tmp_path / "dolma" / "attributes" / "tox" / FILES[1]
    missing.unlink()
    with pytest.raises(SourceError, match=rf"^{missing}: missing \(the attributes 'tox' of "):
        convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes="tox")
    with pytest.raises(SourceError, match="no such attributes directory"):
        convert_dolma(tmp_path / "dolma", tmp_path / "out", attributes="nope")
    assert_absent(tmp_path / "out")


def test_not_a_dolma_dataset(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match="not a Dolma dataset"):
        convert_dolma(tmp_path / "plain", tmp_path / "out")


def test_a_document_that_is_not_an_object(tmp_path):
    path = write_jsonl(tmp_path / "d" / "documents" / "x.jsonl", [{"id": "1"}, [1, 2]])
    with pytest.raises(SourceError, match=rf"^{path}: line 2: a Dolma document is a JSON object"):
        convert_dolma(tmp_path / "d", tmp_path / "out")
