"""The wds / energon converter sources, against shards written by webdataset's own TarWriter."""

from __future__ import annotations

import json
import pickle
import tarfile

import numpy as np
import pytest
from helpers import same

from atlas_fast.convert._source import SourceError
from atlas_fast.convert._wds import brace_expand, energon_sources, sources

wds = pytest.importorskip("webdataset", reason="webdataset (the `test` extra) writes the shards")


def _sample(shard: int, i: int) -> dict:
    """What a test sample holds, decoded (TarWriter encodes each value by its extension)."""
    rng = np.random.default_rng(shard * 1000 + i)
    return {
        "__key__": f"{i:06d}" if i % 5 else f"sub/{i:06d}",
        "txt": f"caption {shard}/{i} é",
        "json": {"shard": shard, "i": i, "tags": ["a", "b"][: i % 3]},
        "cls": i % 7,
        "npy": rng.integers(0, 1000, size=(i % 4, 3), dtype=np.int32),
        "seg.json": [i, i + 1],
        "bin": bytes(rng.integers(0, 256, size=i % 9, dtype=np.uint8)),
    }


def _write_shard(path, shard: int, n: int) -> list[dict]:
    samples = [_sample(shard, i) for i in range(n)]
    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(dict(s))
    return samples


def _read_all(srcs) -> dict:
    out = {}
    for src in srcs:
        examples = []
        for part in src.parts:
            read = pickle.loads(pickle.dumps(part.read))  # parts go to worker processes
            examples.extend(read())
        out[src.split] = examples
    return out


def _decoded(sample: dict, url: str) -> dict:
    d = dict(sample)
    d["__url__"] = url
    return d


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "wds"
    (root / "b").mkdir(parents=True)
    written = {
        "a.tar": _write_shard(root / "a.tar", 0, 11),
        "b/c.tar": _write_shard(root / "b" / "c.tar", 1, 7),
        "b/d.tar": _write_shard(root / "b" / "d.tar", 2, 0),
    }
    return root, written


def test_wds_directory_decoded_equals_what_was_written(shards):
    root, written = shards
    srcs = sources(root, decode=True)
    assert [s.split for s in srcs] == [None]
    assert [p.label for p in srcs[0].parts] == [str(root / n) for n in written]
    assert all(p.nbytes == (root / n).stat().st_size for p, n in zip(srcs[0].parts, written))
    got = _read_all(srcs)[None]
    expected = [_decoded(s, url) for url, samples in written.items() for s in samples]
    assert len(got) == len(expected) == 18
    for g, e in zip(got, expected):
        assert same(g, e), (g, e)


def test_wds_raw_bytes_equal_webdatasets_own_reader(shards):
    root, written = shards
    got = _read_all(sources(root))[None]
    urls = [str(root / n) for n in written]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(got) == len(theirs) == 18
    for g, t in zip(got, theirs):
        t = {k: v for k, v in t.items() if not k.startswith("__") or k == "__key__"}
        assert g.pop("__url__") in written
        assert same(g, t), (g, t)
        assert all(type(v) is bytes for k, v in g.items() if k != "__key__")


def test_wds_single_tar_and_brace_pattern(shards):
    root, written = shards
    one = _read_all(sources(root / "a.tar", decode=True))[None]
    assert same(one, [_decoded(s, "a.tar") for s in written["a.tar"]])
    two = _read_all(sources(str(root / "b" / "{c,d}.tar"), decode=True))[None]
    assert same(two, [_decoded(s, "c.tar") for s in written["b/c.tar"]])


def _energon(tmp_path):
    root = tmp_path / "energon"
    (root / "shards").mkdir(parents=True)
    (root / ".nv-meta").mkdir()
    written = {
        f"shards/shard_{k:03d}.tar": _write_shard(root / f"shards/shard_{k:03d}.tar", k, 6 + k)
        for k in range(5)
    }
    (root / ".nv-meta" / "split.yaml").write_text(
        "exclude:\n"
        "  - shards/shard_004.tar\n"
        "  - shards/shard_001.tar/000003\n"
        "  - shards/shard_001.tar/sub/000005\n"
        "  - ./shards/shard_002.tar/00000{1,2}\n"
        "split_parts:\n"
        "  train:\n"
        "    - shards/shard_{000..001}.tar\n"
        "    - shards/shard_004.tar\n"
        "  val:\n"
        "    - shards/shard_002.tar\n"
        "  test:\n"
        "    - shards/shard_{003..003}.tar\n"
    )
    (root / ".nv-meta" / "dataset.yaml").write_text("__class__: CaptioningWebdataset\n")
    return root, written


def test_energon_splits_excludes_and_braces(tmp_path):
    root, written = _energon(tmp_path)
    for srcs in (energon_sources(root, decode=True), sources(root, decode=True)):
        assert [s.split for s in srcs] == ["train", "val", "test"]
        assert [len(s.parts) for s in srcs] == [2, 1, 1]
        got = _read_all(srcs)

        def keep(url, dropped=()):
            return [_decoded(s, url) for s in written[url] if s["__key__"] not in dropped]

        expected = {
            "train": keep("shards/shard_000.tar")
            + keep("shards/shard_001.tar", {"000003", "sub/000005"}),
            "val": keep("shards/shard_002.tar", {"000001", "000002"}),
            "test": keep("shards/shard_003.tar"),
        }
        assert len(got["train"]) == 6 + 7 - 2
        for split in expected:
            assert same(got[split], expected[split]), split


def test_energon_missing_shard_and_bad_split_yaml(tmp_path):
    root, _ = _energon(tmp_path)
    (root / "shards" / "shard_003.tar").unlink()
    with pytest.raises(SourceError, match=r"shard_003\.tar: cannot read the shard"):
        energon_sources(root)
    (root / ".nv-meta" / "split.yaml").write_text("split_parts: [a, b]\n")
    with pytest.raises(SourceError, match=r"split\.yaml: no 'split_parts' mapping"):
        energon_sources(root)
    (root / ".nv-meta" / "split.yaml").write_text("split_parts: {a: [x\n")
    with pytest.raises(SourceError, match=r"split\.yaml: not valid YAML"):
        energon_sources(root)
    (root / ".nv-meta" / "split.yaml").unlink()
    with pytest.raises(SourceError, match=r"split\.yaml: not found"):
        energon_sources(root)


def test_missing_source(tmp_path):
    with pytest.raises(SourceError, match=r"nothing: no such file or directory"):
        sources(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"empty: no \.tar \(or \.tar\.gz, \.tgz\) shards found"):
        sources(tmp_path / "empty")


def _member_offsets(path):
    with tarfile.open(path) as tf:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tf.getmembers()]


@pytest.mark.parametrize("where", ["data", "header", "boundary", "end-marker"])
def test_truncated_tar_names_the_tar_and_member(tmp_path, where):
    path = tmp_path / "s.tar"
    _write_shard(path, 0, 6)
    members = _member_offsets(path)
    name, offset, offset_data, size = next(m for m in members if m[3] > 100)
    if where == "data":
        cut = offset_data + size // 2
    elif where == "header":
        cut = offset + 200
    elif where == "boundary":
        cut = offset
    else:  # every member complete, the end-of-archive blocks cut short
        last = members[-1]
        cut = last[2] + -(-last[3] // 512) * 512 + 100
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    (part,) = sources(path)[0].parts
    with pytest.raises(SourceError) as info:
        list(part.read())
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    if where == "data":
        assert f"member {name!r} at offset {offset}" in message
        assert "truncated" in message or "unexpected end" in message
    else:
        assert "offset" in message and "end-of-archive" in message


def test_garbage_in_place_of_a_header(tmp_path):
    path = tmp_path / "s.tar"
    _write_shard(path, 0, 4)
    members = _member_offsets(path)
    offset = members[5][1]
    data = bytearray(path.read_bytes())
    data[offset : offset + 512] = b"x" * 512
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=rf"s\.tar: offset {offset} .*not a tar header"):
        list(sources(path)[0].parts[0].read())


def _raw_tar(path, members):
    import io

    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_duplicate_extension_and_bad_decode(tmp_path):
    path = tmp_path / "dup.tar"
    _raw_tar(path, [("k.txt", b"a"), ("k.TXT", b"b")])
    with pytest.raises(SourceError, match=r"dup\.tar: member 'k\.TXT' at offset 1024: a second"):
        list(sources(path)[0].parts[0].read())
    path = tmp_path / "bad.tar"
    _raw_tar(path, [("k.json", b"{not json"), ("k.txt", b"fine")])
    assert next(sources(path)[0].parts[0].read())["json"] == b"{not json"
    with pytest.raises(SourceError, match=r"bad\.tar: member 'k\.json' at offset 0: cannot decode"):
        list(sources(path, decode=True)[0].parts[0].read())
    path = tmp_path / "utf.tar"
    _raw_tar(path, [("k.x.txt", b"\xff")])
    with pytest.raises(SourceError, match=r"member 'k\.x\.txt' .*cannot decode as txt"):
        list(sources(path, decode=True)[0].parts[0].read())


def test_webdataset_skipping_rules(tmp_path):
    path = tmp_path / "s.tar"
    _raw_tar(
        path,
        [
            ("__meta__", b"skipped"),
            ("README", b"no extension: skipped"),
            ("d/.hidden", b"webdataset's key: 'd/'"),
            ("d/__x__.txt", b"in a directory: a sample"),
            ("a.b.c.TXT", b"1"),
            ("a.json", b"[1]"),
            ("b.cls", b" 3\n"),
            ("a.txt", b"a again: a new sample"),
        ],
    )
    got = list(sources(path, decode=True)[0].parts[0].read())
    assert got == [
        {"__key__": "d/", "__url__": "s.tar", "hidden": b"webdataset's key: 'd/'"},
        {"__key__": "d/__x__", "__url__": "s.tar", "txt": "in a directory: a sample"},
        {"__key__": "a", "__url__": "s.tar", "b.c.txt": "1", "json": [1]},
        {"__key__": "b", "__url__": "s.tar", "cls": 3},
        {"__key__": "a", "__url__": "s.tar", "txt": "a again: a new sample"},
    ]
    raw = list(sources(path)[0].parts[0].read())
    theirs = list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))
    assert [{k: v for k, v in s.items() if k != "__url__"} for s in raw] == [
        {k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in theirs
    ]


def test_not_a_tar(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(b"\x00" * 100 + json.dumps({"a": 1}).encode() * 20)
    with pytest.raises(SourceError, match=r"x\.tar: "):
        list(sources(path)[0].parts[0].read())


@pytest.mark.parametrize(
    "pattern",
    [
        "shards/s-{000..012}.tar",
        "{a,b}{c,d}",
        "x{a,b{1,2}}y",
        "{a}",
        "{}",
        "{10..8}",
        "{-2..2}",
        "{1..011}",
        "{0..10..3}",
        "{a..e..2}",
        "{a,}x",
        "a\\{b,c\\}",
        "{x{1,2}}",
        "{a,b\\,c}",
        "plain.tar",
    ],
)
def test_brace_expand_matches_braceexpand(pattern):
    braceexpand = pytest.importorskip("braceexpand")
    assert brace_expand(pattern) == list(braceexpand.braceexpand(pattern))


# -- gzip-compressed shards ------------------------------------------------------------------


def _gzip_file(src, dst) -> None:
    import gzip

    dst.write_bytes(gzip.compress(src.read_bytes(), mtime=0))


def test_gzipped_shards_read_as_the_plain_ones(tmp_path):
    plain = tmp_path / "plain"
    packed = tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    _write_shard(plain / "a.tar", 0, 9)
    _write_shard(plain / "b.tar", 1, 5)
    _gzip_file(plain / "a.tar", packed / "a.tar.gz")
    _gzip_file(plain / "b.tar", packed / "b.tgz")
    want = _read_all(sources(plain, decode=True))[None]
    got = _read_all(sources(packed, decode=True))[None]
    assert len(got) == len(want) == 14
    for g, w in zip(got, want):
        assert g.pop("__url__") == w.pop("__url__").replace("a.tar", "a.tar.gz").replace(
            "b.tar", "b.tgz"
        )
        assert same(g, w), (g, w)
    # and as webdataset's own reader gives them
    urls = [str(packed / "a.tar.gz"), str(packed / "b.tgz")]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    raw = _read_all(sources(packed))[None]
    assert len(theirs) == len(raw)
    for g, t in zip(raw, theirs):
        t = {k: v for k, v in t.items() if not k.startswith("__") or k == "__key__"}
        g.pop("__url__")
        assert same(g, t), (g, t)


@pytest.mark.parametrize("damage", ["cut-stream", "flipped-bytes", "no-end-block", "not-tar"])
def test_damaged_gzipped_shard_names_the_file(tmp_path, damage):
    import gzip

    tar = tmp_path / "s.tar"
    _write_shard(tar, 0, 6)
    data = tar.read_bytes()
    path = tmp_path / "s.tar.gz"
    if damage == "cut-stream":
        packed = gzip.compress(data)
        path.write_bytes(packed[: len(packed) * 2 // 3])
    elif damage == "flipped-bytes":
        packed = bytearray(gzip.compress(data))
        for k in range(len(packed) // 2, len(packed) // 2 + 40):
            packed[k] ^= 0xA5
        path.write_bytes(bytes(packed))
    elif damage == "no-end-block":
        last = _member_offsets(tar)[-1]
        path.write_bytes(gzip.compress(data[: last[2] + -(-last[3] // 512) * 512]))
    else:
        path.write_bytes(gzip.compress(b"x" * 5000))
    (part,) = sources(path)[0].parts
    with pytest.raises(SourceError) as info:
        list(part.read())
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    if damage == "no-end-block":
        assert "end-of-archive" in message
    elif damage == "not-tar":
        assert "not a gzip-compressed tar archive" in message or "not a tar header" in message
    else:
        assert "gzip" in message or "truncated" in message or "unexpected end" in message, message
