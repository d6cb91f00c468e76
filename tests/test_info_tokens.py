"""``atlas-fast info``: the token counts of a dataset's token index, read and never built."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from token_helpers import make_docs, write_docs

from atlas_fast import TokenSequences
from atlas_fast._errors import TokenIndexError
from atlas_fast._token_index import cache_folder
from atlas_fast.cli import main
from atlas_fast.cli.info import info


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _tokens_line(out: str) -> list:
    return [line[16:] for line in out.splitlines() if line.startswith("  tokens:")]


def _per_shard(docs, shard_size=100):
    """(tokens, low, high) of each shard of ``docs``."""
    out = []
    for k in range(0, len(docs), shard_size):
        part = [d for d in docs[k : k + shard_size] if len(d)]
        flat = np.concatenate(part) if part else np.zeros(0, np.int64)
        out.append((len(flat), int(flat.min()), int(flat.max())) if len(flat) else (0, None, None))
    return out


def test_the_index_at_the_root_gives_the_counts(capsys, atlas, tmp_path):
    docs = make_docs(1, 250, np.uint16)
    root = write_docs(tmp_path / "ds", docs, strategy=1)
    assert (root / "tokens.idx").is_file()  # the writer made it
    report = info(root, readers=atlas)
    assert report["ok"]
    [entry] = report["token_indexes"]
    want = _per_shard(docs)
    total = sum(t for t, _, _ in want)
    low = min(lo for _, lo, _ in want if lo is not None)
    high = max(hi for _, _, hi in want if hi is not None)
    assert entry["index"] == str(root / "tokens.idx") and entry["field"] is None
    assert (entry["tokens"], entry["low"], entry["high"]) == (total, low, high)
    assert entry["smallest_dtype"] == ("uint16" if high > 255 else "uint8")
    assert entry["current"]
    assert [(s["tokens"], s["low"], s["high"]) for s in entry["shards"]] == want
    assert [s["shard"] for s in entry["shards"]] == [d["shard"] for d in report["shard_details"]]
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0
    assert _tokens_line(out) == [f"{total} in tokens.idx, ids {low}-{high} (uint16)"]
    code, out, _ = _cli(capsys, "info", "--json", str(root))
    assert code == 0 and json.loads(out)["token_indexes"] == [entry]


def test_without_an_index_none_is_built(capsys, atlas, tmp_path):
    root = write_docs(tmp_path / "ds", make_docs(2, 120, np.uint16), token_index=False)
    assert not (root / "tokens.idx").exists()
    assert info(root, readers=atlas)["token_indexes"] == []
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0 and _tokens_line(out) == ["no token index"]
    assert not (root / "tokens.idx").exists() and not cache_folder(root).exists()
    # A dataset of other examples: the same.
    other = tmp_path / "other"
    write_docs(other, [{"text": "a"}] * 5)
    code, out, _ = _cli(capsys, "info", str(other))
    assert code == 0 and _tokens_line(out) == ["no token index"]
    # One shard: an index belongs to a dataset.
    code, out, _ = _cli(capsys, "info", str(root / "0"))
    assert code == 0 and _tokens_line(out) == ["no token index"]


def test_an_index_in_the_cache_folder_and_one_of_a_field(capsys, atlas, tmp_path):
    docs = make_docs(3, 150, np.uint32)
    root = write_docs(
        tmp_path / "ds", docs, wrap=lambda d: {"input_ids": d}, token_field="input_ids"
    )
    assert (root / "tokens.input_ids.idx").is_file()
    cached = cache_folder(root)
    cached.mkdir(parents=True)
    shutil.move(root / "tokens.input_ids.idx", cached / "tokens.input_ids.idx")
    ts = TokenSequences(atlas.AtlasDataset(root), 8, field="input_ids", index="require")
    assert ts.index_path == cached / "tokens.input_ids.idx"  # what TokenSequences uses
    [entry] = info(root, readers=atlas)["token_indexes"]
    assert entry["index"] == str(cached / "tokens.input_ids.idx")
    assert entry["field"] == "input_ids" and entry["tokens"] == ts.num_tokens
    code, out, _ = _cli(capsys, "info", str(root))
    [line] = _tokens_line(out)
    assert code == 0
    assert line.startswith(f"{ts.num_tokens} in {cached / 'tokens.input_ids.idx'} (field ")


def test_an_index_out_of_date_or_damaged_is_said_so(capsys, atlas, tmp_path):
    docs = make_docs(4, 300, np.uint16)
    root = write_docs(tmp_path / "ds", docs)
    other = write_docs(tmp_path / "other", make_docs(5, 300, np.uint16))
    # Shard 2 removed: the index is out of date, and the next open brings it up to date.
    shutil.rmtree(root / "2")
    meta = json.loads((root / "meta.json").read_text())
    meta["shard_sizes"] = meta["shard_sizes"][:2]
    (root / "meta.json").write_text(json.dumps(meta))
    [entry] = info(root, readers=atlas)["token_indexes"]
    assert not entry["current"] and [s["current"] for s in entry["shards"]] == [True, True]
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0  # the dataset is fine
    assert _tokens_line(out)[0].endswith(
        "; out of date (brought up to date when TokenSequences next opens it)"
    )
    TokenSequences(atlas.AtlasDataset(root), 8)  # as said
    assert info(root, readers=atlas)["token_indexes"][0]["current"]
    # Shard 1 rewritten with as many examples: refused by TokenSequences until a rebuild.
    shutil.rmtree(root / "1")
    shutil.copytree(other / "1", root / "1")
    [entry] = info(root, readers=atlas)["token_indexes"]
    assert [(s["current"], s["rewritten"]) for s in entry["shards"]] == [
        (True, False),
        (False, True),
    ]
    ts = TokenSequences(atlas.AtlasDataset(root), 8)
    with pytest.raises(TokenIndexError):
        ts[len(ts) - 1]
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0
    assert _tokens_line(out)[0].endswith(
        "; 1 shard rewritten since it was made (TokenSequences refuses them until index='rebuild')"
    )
    (root / "tokens.idx").write_bytes(b"not an index")
    [entry] = info(root, readers=atlas)["token_indexes"]
    assert entry["index"] == str(root / "tokens.idx")
    assert "malformed token index" in entry["error"]
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0
    assert _tokens_line(out)[0].startswith(f"{root / 'tokens.idx'} does not read")
    assert (root / "tokens.idx").read_bytes() == b"not an index"  # read, never rebuilt
