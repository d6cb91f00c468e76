"""Every kind of malformed dataset gives an AtlasFormatError naming the file, on every backend.

Cheap problems (metadata) are found when a dataset or shard is opened (a shard of a dataset:
when it is first used); the rest when a block is read. Each test damages one thing in a
dataset written by our writer (or a copy of a reference fixture) and checks both the
exception type and that the message names the file.
"""

from __future__ import annotations

import json
import os
import pickle
import re

import numpy as np
import pytest
from corrupt import (
    copy_case,
    encode_block,
    frame_with_content_size,
    read_all,
    read_blocks,
    write_blocks,
    write_dataset,
)
from helpers import fixture_cases, reference_read

from atlas_fast import AtlasDatasetWriter, AtlasFormatError


def _raises(fn, *names, match=None):
    """``fn()`` raises AtlasFormatError whose message names every path in ``names``."""
    with pytest.raises(AtlasFormatError) as info:
        fn()
    message = str(info.value)
    for name in names:
        assert str(name) in message, f"{name} not named in: {message}"
    if match is not None:
        assert re.search(match, message), f"{match!r} not in: {message}"
    return message


def _opened(ds):
    """``ds`` after reading an example of each shard: a shard's own files (its meta.json
    included) are read on its first use, not when the dataset opens."""
    for end in sorted(set(ds.cumulative_shard_sizes.tolist()) - {0}):
        ds[end - 1]
    return ds


def _edit_json(path, **changes):
    value = json.loads(path.read_text())
    for key, new in changes.items():
        if new is _DELETE:
            del value[key]
        else:
            value[key] = new
    path.write_text(json.dumps(value))


_DELETE = object()


@pytest.fixture
def ds0(tmp_path):
    root = tmp_path / "s0"
    write_dataset(root, 0)
    return root


@pytest.fixture(params=[1, 2, 3])
def zds(request, tmp_path):
    """A zstd-compressed dataset: (root, strategy)."""
    root = tmp_path / f"s{request.param}"
    write_dataset(root, request.param)
    return root, request.param


# -- meta.json ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["root", "shard"])
def test_missing_meta(atlas, ds0, where):
    path = (ds0 if where == "root" else ds0 / "1") / "meta.json"
    path.unlink()
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="missing")


@pytest.mark.parametrize("where", ["root", "shard"])
def test_unreadable_meta(atlas, ds0, where):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    path.unlink()
    path.mkdir()  # a directory where the file should be: readable by nobody, even root
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("name", ["meta.json", "0/meta.json", "0/index.npy", "0/data.bin"])
def test_fifo_instead_of_file(atlas, ds0, name):
    """A named pipe would block a reader forever: refused (opened without blocking, or not
    at all), never waited on."""
    path = ds0 / name
    path.unlink()
    os.mkfifo(path)
    _raises(lambda: read_all(atlas.AtlasDataset(ds0)), path, match="not a regular file")


def test_huge_meta_refused_unread(atlas, ds0):
    path = ds0 / "meta.json"
    with open(path, "r+b") as f:
        f.truncate(65 << 20)  # sparse: nothing is written
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="larger than")


@pytest.mark.parametrize("text", [b"{not json", b"\xff\xfe", b"", b'{"version": 1,}'])
@pytest.mark.parametrize("where", ["root", "shard"])
def test_invalid_json(atlas, ds0, where, text):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    path.write_bytes(text)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="not valid JSON")


@pytest.mark.parametrize("text", ["[1, 2]", "7", "null", '"meta"'])
def test_json_not_an_object(atlas, ds0, text):
    path = ds0 / "0" / "meta.json"
    path.write_text(text)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="expected a JSON object")


@pytest.mark.parametrize("where", ["root", "shard"])
def test_missing_key(atlas, ds0, where):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    _edit_json(path, compression_strategy=_DELETE)
    _raises(
        lambda: _opened(atlas.AtlasDataset(ds0)), path, match="missing key.*compression_strategy"
    )


@pytest.mark.parametrize("where", ["root", "shard"])
def test_extra_key(atlas, ds0, where):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    _edit_json(path, surprise=1)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="unexpected key.*surprise")


@pytest.mark.parametrize(
    "key, value",
    [
        ("version", "1"),
        ("version", True),
        ("block_size", 4.0),
        ("stored_examples", "40"),
        ("compression_strategy", None),
        ("compression_level", [3]),
        ("compression_dict_size", "0.01"),
    ],
)
def test_shard_wrong_types(atlas, ds0, key, value):
    path = ds0 / "0" / "meta.json"
    _edit_json(path, **{key: value})
    _raises(lambda: atlas.AtlasDatasetShard(ds0 / "0"), path, match=key)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match=key)


@pytest.mark.parametrize("sizes", ["40,40", [40, -1], [40, 4.5], {"0": 40}, [40, True]])
def test_root_wrong_shard_sizes(atlas, ds0, sizes):
    path = ds0 / "meta.json"
    _edit_json(path, shard_sizes=sizes)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="shard_sizes")


@pytest.mark.parametrize("where", ["root", "shard"])
@pytest.mark.parametrize("version", [0, 2, 99])
def test_unsupported_version(atlas, ds0, where, version):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    _edit_json(path, version=version)
    _raises(
        lambda: _opened(atlas.AtlasDataset(ds0)),
        path,
        match=f"unsupported format version {version}",
    )


@pytest.mark.parametrize("block_size", [0, -4, 2**64])
def test_bad_block_size(atlas, ds0, block_size):
    path = ds0 / "0" / "meta.json"
    _edit_json(path, block_size=block_size)
    _raises(lambda: atlas.AtlasDatasetShard(ds0 / "0"), path, match="block_size")


@pytest.mark.parametrize("stored", [-1, 2**63])
def test_bad_stored_examples(atlas, ds0, stored):
    path = ds0 / "0" / "meta.json"
    _edit_json(path, stored_examples=stored)
    _raises(lambda: atlas.AtlasDatasetShard(ds0 / "0"), path, match="stored_examples")


def test_stored_examples_disagree_with_root(atlas, ds0):
    _edit_json(ds0 / "meta.json", shard_sizes=[40, 41])
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), ds0 / "1", ds0 / "meta.json", match="41")


def test_stored_examples_disagree_with_index(atlas, ds0):
    # 44 examples in blocks of 4 need 12 index entries; the index has 11.
    _edit_json(ds0 / "0" / "meta.json", stored_examples=44)
    _edit_json(ds0 / "meta.json", shard_sizes=[44, 40])
    ds = atlas.AtlasDataset(ds0)
    _raises(lambda: ds[0], ds0 / "0" / "index.npy", match="entries")


def test_block_size_disagrees_with_index(atlas, ds0):
    _edit_json(ds0 / "0" / "meta.json", block_size=8)
    shard = atlas.AtlasDatasetShard(ds0 / "0")
    _raises(lambda: shard[0], ds0 / "0" / "index.npy", match="entries")


@pytest.mark.parametrize("where", ["root", "shard"])
@pytest.mark.parametrize("strategy", [4, -1, 255])
def test_unknown_strategy(atlas, ds0, where, strategy):
    path = (ds0 if where == "root" else ds0 / "0") / "meta.json"
    _edit_json(path, compression_strategy=strategy)
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), path, match="unknown compression_strategy")


def test_shard_folder_not_a_number(atlas, ds0):
    (ds0 / "1").rename(ds0 / "one")
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), ds0 / "one", match="numbers")


def test_shard_not_listed_in_root(atlas, ds0):
    _edit_json(ds0 / "meta.json", shard_sizes=[40])
    _raises(lambda: _opened(atlas.AtlasDataset(ds0)), ds0 / "1", match="not listed")


def test_root_is_not_a_dataset(atlas, tmp_path):
    _raises(lambda: _opened(atlas.AtlasDataset(tmp_path / "nowhere")), tmp_path / "nowhere")
    (tmp_path / "file").write_bytes(b"x")
    _raises(lambda: _opened(atlas.AtlasDataset(tmp_path / "file")), tmp_path / "file")


def test_shared_dictionary_shard_without_dictionary(atlas, tmp_path):
    root = tmp_path / "s2"
    write_dataset(root, 2)
    _raises(lambda: atlas.AtlasDatasetShard(root / "1"), root / "1", match="compression_dict")


@pytest.mark.parametrize("root_strategy", [0, 1, 3])
def test_shared_dictionary_shard_in_dataset_without_one(atlas, tmp_path, root_strategy):
    root = tmp_path / "s2"
    write_dataset(root, 2)
    _edit_json(root / "meta.json", compression_strategy=root_strategy)
    message = _raises(lambda: _opened(atlas.AtlasDataset(root)), root / "meta.json", root / "0")
    assert "shared dictionary" in message


# -- missing files ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["data.bin", "index.npy"])
def test_missing_shard_file(atlas, ds0, name):
    (ds0 / "1" / name).unlink()
    ds = atlas.AtlasDataset(ds0)  # files are opened lazily: still cheap to construct
    assert ds[0] is not None  # shard 0 is intact
    _raises(lambda: ds[45], ds0 / "1" / name, match="missing")


def test_missing_shard_dictionary(atlas, tmp_path):
    root = tmp_path / "s3"
    write_dataset(root, 3)
    (root / "1" / "zstd_dict.bin").unlink()
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[45], root / "1" / "zstd_dict.bin", match="missing")


def test_missing_root_dictionary(atlas, tmp_path):
    root = tmp_path / "s2"
    write_dataset(root, 2)
    (root / "zstd_dict.bin").unlink()
    _raises(lambda: _opened(atlas.AtlasDataset(root)), root / "zstd_dict.bin", match="missing")


def test_empty_dictionary(atlas, tmp_path):
    root = tmp_path / "s3"
    write_dataset(root, 3)
    (root / "0" / "zstd_dict.bin").write_bytes(b"")
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], root / "0" / "zstd_dict.bin", match="empty")


# -- index.npy ----------------------------------------------------------------------------


def _set_index(shard_dir, array):
    np.save(shard_dir / "index.npy", array)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda o: o.reshape(1, -1), "1-D"),
        (lambda o: o.astype(np.int64), "unsigned"),
        (lambda o: o.astype(np.float64), "unsigned"),
        (lambda o: np.array(o[0]), "1-D"),
    ],
)
def test_index_wrong_shape_or_dtype(atlas, ds0, make, match):
    shard_dir = ds0 / "0"
    _set_index(shard_dir, make(np.load(shard_dir / "index.npy")))
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", match=match)


@pytest.mark.parametrize("payload", [b"", b"not an npy file at all", b"\x93NUMPY\x01\x00garbage"])
def test_index_not_npy(atlas, ds0, payload):
    shard_dir = ds0 / "0"
    (shard_dir / "index.npy").write_bytes(payload)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", match="npy")


def test_index_object_array_is_not_unpickled(atlas, ds0, tmp_path):
    shard_dir = ds0 / "0"
    np.save(shard_dir / "index.npy", np.array([0, "x"], dtype=object), allow_pickle=True)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy")


def test_index_does_not_start_at_zero(atlas, ds0):
    shard_dir = ds0 / "0"
    offsets = np.load(shard_dir / "index.npy").astype(np.uint64)
    offsets[0] = 1
    _set_index(shard_dir, offsets)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", match="first offset")


def test_index_decreases(atlas, ds0):
    shard_dir = ds0 / "0"
    offsets = np.load(shard_dir / "index.npy").astype(np.uint64)
    offsets[3], offsets[4] = offsets[4], offsets[3]
    _set_index(shard_dir, offsets)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", match="decrease")


def test_index_empty_block(atlas, ds0):
    shard_dir = ds0 / "0"
    offsets = np.load(shard_dir / "index.npy").astype(np.uint64)
    offsets[2] = offsets[1]
    _set_index(shard_dir, offsets)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", match="empty")


@pytest.mark.parametrize("delta", [1, 10**6, -1])
def test_index_end_disagrees_with_data(atlas, ds0, delta):
    shard_dir = ds0 / "0"
    offsets = np.load(shard_dir / "index.npy").astype(np.uint64)
    offsets[-1] = int(offsets[-1]) + delta
    _set_index(shard_dir, offsets)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy", shard_dir / "data.bin", match="last offset")


def test_index_far_past_end(atlas, ds0):
    shard_dir = ds0 / "0"
    offsets = np.load(shard_dir / "index.npy").astype(np.uint64)
    offsets[5:] = np.uint64(2**63 + 5)
    _set_index(shard_dir, offsets)
    shard = atlas.AtlasDatasetShard(shard_dir)
    _raises(lambda: shard[0], shard_dir / "index.npy")


@pytest.mark.parametrize("payload", [0, 4000], ids=["small", "large"])
def test_data_shrinks_after_open(atlas, tmp_path, payload):
    """data.bin truncated while a reader has it open: a clean error, not a crash (SIGBUS).

    Small files (a few KiB: the compiled core reads them whole) and large ones (it maps
    them) alike."""
    root = tmp_path / "ds"
    examples = [{"i": i, "pad": os.urandom(payload)} for i in range(40)]
    with AtlasDatasetWriter(root, 40, 4, compression_strategy=0) as w:
        for x in examples:
            w.add_example(x)
    shard_dir = root / "0"
    size = (shard_dir / "data.bin").stat().st_size
    assert (size > 100_000) == (payload > 0)
    shard = atlas.AtlasDatasetShard(shard_dir)
    assert shard[0] == examples[0]
    os.truncate(shard_dir / "data.bin", size // 2)
    _raises(lambda: shard[len(shard) - 1], shard_dir / "data.bin", match="truncated")
    assert shard[0] == examples[0]  # still cached, and intact


# -- zstd frames --------------------------------------------------------------------------


def test_truncated_frame(atlas, zds):
    root, _strategy = zds
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    blocks[2] = blocks[2][: len(blocks[2]) // 2]
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    assert ds[0] is not None
    _raises(lambda: ds[8], shard_dir / "data.bin", match=r"block 2\b.*(truncated|corrupt)")


def test_corrupt_frame(atlas, zds):
    root, _strategy = zds
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    block = bytearray(blocks[1])
    for k in range(12, len(block) - 4):
        block[k] ^= 0x5A
    blocks[1] = bytes(block)
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[4], shard_dir / "data.bin", match=r"block 1\b")


def test_not_a_zstd_frame(atlas, zds):
    root, _strategy = zds
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    blocks[0] = pickle.dumps([1, 2, 3, 4])  # stored raw in a compressed shard
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], shard_dir / "data.bin", match=r"block 0\b.*zstd")


def test_bytes_after_frame(atlas, zds):
    root, _strategy = zds
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    blocks[3] = blocks[3] + b"tail"
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[12], shard_dir / "data.bin", match=r"block 3\b.*follow the zstd frame")


def test_wrong_shard_dictionary(atlas, tmp_path):
    root = tmp_path / "s3"
    write_dataset(root, 3)
    other = tmp_path / "other"
    write_dataset(other, 3, n=200, shard_size=100, block_size=8)
    (root / "1" / "zstd_dict.bin").write_bytes((other / "0" / "zstd_dict.bin").read_bytes())
    ds = atlas.AtlasDataset(root)
    assert ds[0] is not None
    _raises(
        lambda: ds[40],
        root / "1" / "data.bin",
        root / "1" / "zstd_dict.bin",
        match="wrong dictionary",
    )


def test_wrong_shared_dictionary(atlas, tmp_path):
    root = tmp_path / "s2"
    write_dataset(root, 2)
    other = tmp_path / "other"
    write_dataset(other, 2, n=200, shard_size=100, block_size=8)
    (root / "zstd_dict.bin").write_bytes((other / "zstd_dict.bin").read_bytes())
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], root / "0" / "data.bin", match="wrong dictionary")


def test_dictionary_frame_in_plain_zstd_shard(atlas, tmp_path):
    root = tmp_path / "s3"
    write_dataset(root, 3)
    for shard in ("0", "1"):
        (root / shard / "zstd_dict.bin").unlink()
        _edit_json(root / shard / "meta.json", compression_strategy=1)
    _edit_json(root / "meta.json", compression_strategy=1)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], root / "0" / "data.bin", match="needs dictionary")


@pytest.mark.parametrize("declared", [2**40, 2**62, 10**7])
def test_absurd_content_size(atlas, zds, declared):
    root, _strategy = zds
    shard_dir = root / "1"
    blocks = read_blocks(shard_dir)
    blocks[0] = frame_with_content_size(declared)
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[40], shard_dir / "data.bin", match="declares")


def test_content_size_over_the_limit(atlas, ds0, tmp_path, monkeypatch):
    root = tmp_path / "s1"
    write_dataset(root, 1)
    monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", "64")
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], root / "0" / "data.bin", match="ATLAS_FAST_MAX_BLOCK_BYTES")


def test_unsized_frame_over_the_limit(atlas, tmp_path, monkeypatch):
    import zstandard

    root = tmp_path / "s1"
    write_dataset(root, 1)
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    unsized = zstandard.ZstdCompressor(write_content_size=False)
    blocks[0] = unsized.compress(pickle.dumps([b"\x00" * 100_000] * 4))
    write_blocks(shard_dir, blocks)
    monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", "50000")
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], shard_dir / "data.bin", match="ATLAS_FAST_MAX_BLOCK_BYTES")


# -- what a block unpickles to ------------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "content, match",
    [
        ({"not": "a list"}, "holds a dict, not a list"),
        ((1, 2, 3, 4), "holds a tuple, not a list"),
        ([1, 2, 3], "holds 3 examples, expected 4"),
        ([1, 2, 3, 4, 5], "holds 5 examples, expected 4"),
        ([], "holds 0 examples, expected 4"),
    ],
)
def test_block_wrong_content(atlas, tmp_path, strategy, content, match):
    root = tmp_path / f"s{strategy}"
    write_dataset(root, strategy)
    shard_dir = root / "1"
    blocks = read_blocks(shard_dir)
    blocks[5] = encode_block(shard_dir, strategy, content)
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    assert ds[40] is not None
    _raises(lambda: ds[40 + 5 * 4 + 1], shard_dir / "data.bin", match=rf"block 5\b.*{match}")


def test_last_block_wrong_length(atlas, tmp_path):
    root = tmp_path / "s0"
    write_dataset(root, 0, n=78, shard_size=78)  # last block holds 2
    shard_dir = root / "0"
    blocks = read_blocks(shard_dir)
    blocks[-1] = pickle.dumps([1, 2, 3, 4])
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[77], shard_dir / "data.bin", match="holds 4 examples, expected 2")


@pytest.mark.parametrize(
    "payload", [b"garbage", b"\x80\x05", b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f", b"."]
)
def test_block_does_not_unpickle(atlas, ds0, payload):
    shard_dir = ds0 / "0"
    blocks = read_blocks(shard_dir)
    blocks[1] = payload
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(ds0)
    _raises(lambda: ds[5], shard_dir / "data.bin", match=r"block 1\b")


def test_errors_do_not_poison_the_reader(atlas, ds0):
    """After a bad block, the other blocks still read correctly."""
    shard_dir = ds0 / "0"
    blocks = read_blocks(shard_dir)
    good = atlas.AtlasDataset(ds0)[8]
    blocks[1] = b"garbage"
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(ds0)
    for _ in range(2):
        _raises(lambda: ds[4], shard_dir / "data.bin")
        assert repr(ds[8]) == repr(good)


@pytest.mark.parametrize("case", fixture_cases()[:3])
def test_fixture_copy_with_bad_meta(atlas, tmp_path, case):
    root = copy_case(case, tmp_path / "ds")
    first = min(d for d in root.iterdir() if d.is_dir())  # "0", or "00" of 11+ shards
    _edit_json(first / "meta.json", version=2)
    _raises(lambda: read_all(atlas.AtlasDataset(root)), first / "meta.json")


@pytest.mark.parametrize("where", ["shard", "root"])
def test_corrupt_dictionary_header(atlas, tmp_path, where):
    """A dictionary whose entropy tables are damaged cannot be loaded (found by fuzzing)."""
    strategy = 3 if where == "shard" else 2
    root = tmp_path / "ds"
    write_dataset(root, strategy)
    path = (root / "0" if where == "shard" else root) / "zstd_dict.bin"
    data = bytearray(path.read_bytes())
    data[5:9] = b"\x00\x00\x00\x00"
    path.write_bytes(bytes(data))
    ds = atlas.AtlasDataset(root)
    _raises(lambda: ds[0], path, match="not a usable zstd dictionary")


@pytest.mark.parametrize("strategy", [2, 3])
def test_damaged_dictionary_with_checksums(atlas, tmp_path, strategy):
    """Bytes of a dictionary's content damaged: decoding with it gives other bytes than were
    written, which no frame header tells. A ``checksums=True`` writer gives every frame zstd's
    content checksum, so each read of every damaged copy returns the written example or
    raises AtlasFormatError naming the block and the dictionary: never a different example,
    and never the crash some damaged pickles cause in the unpickler (so the reading is done in
    a child process, where a crash fails the test instead of ending the run)."""
    from helpers import child_report, fork_check

    base = tmp_path / "base"
    examples = write_dataset(base, strategy, n=60, shard_size=30, block_size=3, checksums=True)
    rel = "zstd_dict.bin" if strategy == 2 else "0/zstd_dict.bin"
    raw = (base / rel).read_bytes()
    # The header (magic, ID, entropy tables) is checked when the dictionary is loaded; the
    # content after it is what a damaged copy decodes silently into other bytes.
    positions = range(len(raw) // 4, len(raw), max(1, len(raw) // 97))
    wrong = []

    def check():
        for pos in positions:
            data = bytearray(raw)
            data[pos] ^= 0x5A
            (base / rel).write_bytes(bytes(data))
            ds = atlas.AtlasDataset(base)
            for i in range(len(ds)):
                try:
                    got = ds[i]
                except AtlasFormatError as exc:
                    message = str(exc)
                    assert "data.bin" in message and str(base / rel) in message, message
                    continue
                if pickle.dumps(got) != pickle.dumps(examples[i]):
                    wrong.append((pos, i))
            ds.close()
        assert not wrong, f"different examples read (position, index): {wrong[:5]}"
        return True

    assert child_report(*fork_check(check)) == b"ok"


@pytest.mark.parametrize("strategy", [1, 2, 3])
def test_checksums_put_a_content_checksum_in_every_frame(tmp_path, strategy):
    """``checksums=True``: every frame carries its content checksum (which zstd checks on
    every read); without it, frames are as the reference writes them (none). Both read the
    same with the reference's way of reading."""
    import zstandard

    for checksums in (True, False):
        root = tmp_path / f"ds-{checksums}"
        write_dataset(root, strategy, n=60, shard_size=30, block_size=3, checksums=checksums)
        frames = [f for shard in ("0", "1") for f in read_blocks(root / shard)]
        assert frames
        assert {zstandard.get_frame_parameters(f).has_checksum for f in frames} == {checksums}
        read = reference_read(root)
        assert pickle.dumps(read) == pickle.dumps(reference_read(tmp_path / "ds-True"))
