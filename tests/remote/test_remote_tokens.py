"""TokenSequences over a dataset in object storage (moto's S3 server, behind the counting
proxy): its writer puts the token index at the URL's root (before the root meta.json), a
reader copies it once into its cache folder keyed by the dataset's version, a dataset without
one gets it built by a pass in runs of merged ranges and cached the same way, a rewritten
dataset gets another cache folder, and the rows are those of the local dataset."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from servers import upload_tree

import atlas_fast
from atlas_fast import TokenIndexError, TokenSequences
from atlas_fast.token_sampler import TokenShuffleSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from token_helpers import Model, make_docs, write_docs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The user cache folder, empty for the test."""
    folder = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder / "atlas-fast" / "tokens"


@pytest.fixture(scope="module")
def docs():
    return make_docs(11, 500, np.uint16, long=3)


def _requests(s3, name: str) -> int:
    return sum(v for k, v in s3.proxy.stats()["paths"].items() if k.endswith(name))


def _check_rows(ts, docs, seq_len: int) -> None:
    want = Model(docs).windows(seq_len)
    got = ts.__getitems__(list(range(len(ts))))
    for name in ("targets", "inputs", "positions"):
        np.testing.assert_array_equal(got[name], want[name])


def test_the_writer_puts_the_index_at_the_url_root(s3, atlas, docs, cache):
    url = s3.url("written")
    with atlas_fast.AtlasDatasetWriter(url, shard_size=120, block_size=10) as writer:
        for d in docs:
            writer.add_example(d)
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert "written/tokens.idx" in keys and "written/meta.json" in keys
    s3.proxy.reset_stats()
    ts = TokenSequences(atlas.AtlasDataset(url), 16, index="require")
    assert ts.num_tokens == sum(len(d) for d in docs)
    # Opening read the root meta.json and the index, nothing of a shard.
    # (and the shared zstd dictionary, which opening a strategy-2 dataset requests ahead)
    paths = {k.rsplit("/", 1)[-1] for k in s3.proxy.stats()["paths"]}
    assert {"meta.json", "tokens.idx"} <= paths <= {"meta.json", "tokens.idx", "zstd_dict.bin"}
    assert _requests(s3, "meta.json") == 1
    assert Path(ts.index_path).parent.parent == cache
    _check_rows(ts, docs, 16)
    # Opened again: the cached copy, no request for the index.
    s3.proxy.reset_stats()
    again = TokenSequences(atlas.AtlasDataset(url), 16, index="require")
    assert _requests(s3, "tokens.idx") == 0
    assert again.index_path == ts.index_path
    # The same bytes as a local writer's index of the same documents.
    local = write_docs(
        cache.parent.parent / "local", docs, strategy=2, shard_size=120, block_size=10
    )
    assert Path(ts.index_path).read_bytes() == (local / "tokens.idx").read_bytes()


def test_a_dataset_without_an_index_gets_one_built_and_cached(s3, atlas, docs, cache, tmp_path):
    local = write_docs(tmp_path / "ds", docs, strategy=1, shard_size=100, block_size=10)
    (local / "tokens.idx").unlink()
    upload_tree(s3.client, s3.bucket, local, "plain")
    url = s3.url("plain")
    with pytest.raises(TokenIndexError):
        TokenSequences(atlas.AtlasDataset(url), 16, index="require")
    s3.proxy.reset_stats()
    ts = TokenSequences(atlas.AtlasDataset(url), 16)
    # The pass fetched each shard's blocks in runs of merged ranges, not a request a block.
    assert _requests(s3, "data.bin") <= len(atlas.AtlasDataset(url).shards)
    assert Path(ts.index_path).is_relative_to(cache)
    assert ts.index_path.name == "tokens.idx"
    _check_rows(ts, docs, 16)
    s3.proxy.reset_stats()
    again = TokenSequences(atlas.AtlasDataset(url), 16, index="require")
    assert again.index_path == ts.index_path
    assert _requests(s3, "data.bin") == 0  # reused: nothing read again
    # Workers get the path of the cached file, and map it.
    copy = pickle.loads(pickle.dumps(ts))
    assert copy.index_path == ts.index_path
    np.testing.assert_array_equal(copy[3]["targets"], ts[3]["targets"])


def test_a_rewritten_dataset_is_another_version(s3, atlas, docs, cache, tmp_path):
    url = s3.url("again")
    local = write_docs(tmp_path / "one", docs[:300], shard_size=100, block_size=10)
    upload_tree(s3.client, s3.bucket, local, "again")
    first = TokenSequences(atlas.AtlasDataset(url), 8)
    # Rewritten in place with other documents (a new root meta.json: another ETag).
    other = make_docs(12, 260, np.uint16)
    local2 = write_docs(tmp_path / "two", other, shard_size=100, block_size=10)
    (local2 / "tokens.idx").unlink()
    s3.client.delete_object(Bucket=s3.bucket, Key="again/tokens.idx")
    upload_tree(s3.client, s3.bucket, local2, "again")
    second = TokenSequences(atlas.AtlasDataset(url), 8)
    assert second.index_path != first.index_path
    assert second.num_tokens == sum(len(d) for d in other)
    _check_rows(second, other, 8)


def test_a_sampled_epoch_over_a_remote_dataset(s3, atlas, docs, cache):
    url = s3.url("sampled")
    with atlas_fast.AtlasDatasetWriter(
        url, shard_size=100, block_size=10, compression_strategy=1
    ) as writer:
        for d in docs:
            writer.add_example(d)
    ts = TokenSequences(atlas.AtlasDataset(url), 16)
    sampler = TokenShuffleSampler(ts, batch_size=4, seed=3)
    model = Model(docs)
    for keys in list(sampler.batches())[:20]:
        got = ts.__getitems__(keys)
        for r, key in enumerate(keys):
            want = model.ranges(list(zip(key[::2], key[1::2])))
            np.testing.assert_array_equal(got["targets"][r], want["targets"])
            np.testing.assert_array_equal(got["inputs"][r], want["inputs"])


def test_a_field_index_goes_up_under_its_name(s3, docs, cache):
    url = s3.url("fields")
    with atlas_fast.AtlasDatasetWriter(
        url, shard_size=100, block_size=10, token_field="input_ids"
    ) as writer:
        for d in docs:
            writer.add_example({"input_ids": d, "n": len(d)})
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert "fields/tokens.input_ids.idx" in keys
    ts = TokenSequences(url, 16, field="input_ids", index="require")
    _check_rows(ts, docs, 16)


def test_an_append_to_the_url_leaves_the_index_and_the_reader_covers_the_new_shards(
    s3, atlas, docs, cache
):
    """A URL append writes no index: the old one stays (the old shards' entries), and
    TokenSequences gives the appended shards theirs when it opens the grown dataset."""
    url = s3.url("grown")
    with atlas_fast.AtlasDatasetWriter(url, shard_size=120, block_size=10) as writer:
        for d in docs[:300]:
            writer.add_example(d)
    before = s3.client.get_object(Bucket=s3.bucket, Key="grown/tokens.idx")["Body"].read()
    with atlas_fast.AtlasDatasetWriter(url, shard_size=120, block_size=10, append=True) as w:
        for d in docs[300:]:
            w.add_example(d)
    after = s3.client.get_object(Bucket=s3.bucket, Key="grown/tokens.idx")["Body"].read()
    assert after == before
    ts = TokenSequences(atlas.AtlasDataset(url), 16)
    assert ts.num_tokens == sum(len(d) for d in docs)
    _check_rows(ts, docs, 16)
