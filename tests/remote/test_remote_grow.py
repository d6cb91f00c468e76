"""Appending to and merging datasets in S3 (moto, through the fault-injecting proxy): the
grown dataset is read back example for example by both backends, and downloaded, by the
reference package; a widening copies the old shards to their wider names within the store
and leaves no object under the old ones; leftovers of an interrupted append are removed by
the next append and by ``verify --repair``."""

from __future__ import annotations

import json

import pytest
from helpers import append_dataset as append
from helpers import make_examples, reference_examples, same, write_dataset
from test_remote_write import download, open_uploads, stored

import atlas_fast
from atlas_fast import AtlasFormatError, InvalidArgumentError
from atlas_fast.cli import main


def read_all(atlas, url) -> list:
    with atlas.AtlasDataset(url) as ds:
        return [ds[i] for i in range(len(ds))]


def folders(objects: dict) -> list:
    return sorted({name.split("/")[0] for name in objects if "/" in name})


@pytest.mark.parametrize("strategy", [1, 2])
def test_appending_in_runs_to_s3_widens_once_and_reads_back(s3, atlas, tmp_path, strategy):
    examples = make_examples(250, seed=strategy)
    url = s3.url("grown")
    write_dataset(url, examples[:150], shard_size=20, block_size=2, compression_strategy=strategy)
    dict_before = stored(s3, "grown").get("zstd_dict.bin")
    assert (dict_before is not None) == (strategy == 2)
    append(url, examples[150:170], block_size=2, compression_strategy=strategy)  # 9 shards
    append(url, examples[170:], block_size=2, compression_strategy=strategy)  # 13: 00-12
    objects = stored(s3, "grown")
    assert folders(objects) == [f"{k:02d}" for k in range(13)]
    assert objects.get("zstd_dict.bin") == dict_before  # reused, not rewritten
    assert same(read_all(atlas, url), examples)
    assert same(reference_examples(download(objects, tmp_path / "copy")), examples)
    assert open_uploads(s3) == []
    meta = json.loads(objects["meta.json"])
    assert sum(meta["shard_sizes"]) == 250


def test_leftovers_of_an_interrupted_append_are_removed(s3, atlas):
    examples = make_examples(80)
    url = s3.url("ds")
    write_dataset(url, examples, shard_size=40, block_size=4)
    for key in ("2/data.bin", "2/meta.json", "03/index.npy"):  # shards of no dataset
        s3.client.put_object(Bucket=s3.bucket, Key=f"ds/{key}", Body=b"left")
    assert main(["verify", "--repair", url]) == 0
    assert folders(stored(s3, "ds")) == ["0", "1"]
    s3.client.put_object(Bucket=s3.bucket, Key="ds/2/checksums.npy", Body=b"left")
    append(url, examples[:10])
    assert sorted(stored(s3, "ds")) == sorted(
        ["meta.json", "zstd_dict.bin"]
        + [f"{k}/{f}" for k in range(3) for f in ("data.bin", "index.npy", "meta.json")]
    )
    assert same(read_all(atlas, url), examples + examples[:10])


def test_appending_to_a_url_that_is_no_dataset_or_with_another_strategy(s3):
    with pytest.raises(AtlasFormatError, match="nothing-here"):
        append(s3.url("nothing-here"), make_examples(5))
    url = s3.url("ds")
    write_dataset(url, make_examples(60), shard_size=20, block_size=4, compression_strategy=3)
    before = stored(s3, "ds")
    with pytest.raises(InvalidArgumentError, match="compression_strategy 3"):
        append(url, make_examples(5), compression_strategy=0)
    assert stored(s3, "ds") == before


def test_merge_to_s3_from_local_and_from_the_same_bucket(s3, atlas, tmp_path):
    parts = [make_examples(90 + 20 * k, seed=k) for k in range(3)]
    write_dataset(tmp_path / "local", parts[0], shard_size=40, block_size=4)
    write_dataset(s3.url("a"), parts[1], shard_size=40, block_size=4)
    write_dataset(s3.url("b"), parts[2], shard_size=40, block_size=4, compression_strategy=3)
    metadata = atlas_fast.merge([tmp_path / "local", s3.url("a"), s3.url("b")], s3.url("m"))
    assert metadata.compression_strategy == 3
    everything = [e for part in parts for e in part]
    assert same(read_all(atlas, s3.url("m")), everything)
    objects = stored(s3, "m")
    assert same(reference_examples(download(objects, tmp_path / "copy")), everything)
    for name in folders(objects):
        assert json.loads(objects[f"{name}/meta.json"])["compression_strategy"] in (1, 3)
    with pytest.raises(FileExistsError):
        atlas_fast.merge([s3.url("a")], s3.url("m"))
