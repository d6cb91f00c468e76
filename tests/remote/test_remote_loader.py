"""Remote datasets in training: generated datasets of every strategy, DataLoader workers under
fork and spawn, faults, a dataset replaced mid-epoch, and clear errors at open."""

from __future__ import annotations

import random

import pytest
from helpers import same
from loader_helpers import example, write_dataset
from servers import upload_tree

import atlas_fast
from atlas_fast import (
    AtlasFormatError,
    BlockShuffleSampler,
    CompressionStrategy,
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
)

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

N = 600  # shards of 128 examples (the last 88), blocks of 8: 75 blocks over 5 shards


def _upload(s3, tmp_path, name, n=N, shard=128, block=8, strategy=None, offset=0):
    local = tmp_path / f"local-{name}"
    kwargs = {} if strategy is None else {"strategy": strategy}
    if offset:
        from atlas_fast import AtlasDatasetWriter

        with AtlasDatasetWriter(local, shard, block, **_strategy_kw(strategy)) as w:
            for i in range(n):
                w.add_example(example(i + offset))
    else:
        write_dataset(local, n, shard, block, **kwargs)
    upload_tree(s3.client, s3.bucket, local, name)
    s3.proxy.reset_stats()
    return local


def _strategy_kw(strategy) -> dict:
    return {} if strategy is None else {"compression_strategy": strategy}


@pytest.fixture
def remote(s3, tmp_path):
    _upload(s3, tmp_path, "ds")
    return s3.url("ds")


# -- generated datasets ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(CompressionStrategy))
def test_generated_dataset_equals_local(s3, tmp_path, atlas, strategy):
    # 12 shards: the writer pads their names to two digits ("00" .. "11").
    local = _upload(s3, tmp_path, "gen", n=700, shard=60, block=7, strategy=strategy)
    remote = atlas.AtlasDataset(s3.url("gen"))
    here = atlas.AtlasDataset(local)
    assert len(remote) == len(here) == 700 and len(remote.shards) == 12
    assert remote.metadata == here.metadata
    order = list(range(700))
    random.Random(1).shuffle(order)
    assert all(same(remote[i], here[i]) for i in order)
    assert list(remote) == list(here)
    batch = order[:50]
    assert remote.__getitems__(batch) == here.__getitems__(batch)
    assert list(remote.shards[11]) == list(here.shards[11])


def test_opening_costs_one_request(s3, tmp_path, atlas):
    _upload(s3, tmp_path, "many", n=400, shard=2, block=2, strategy=CompressionStrategy(1))
    ds = atlas.AtlasDataset(s3.url("many"))
    assert len(ds.shards) == 200
    assert s3.proxy.stats()["requests"] == 1
    assert ds[399] == example(399)  # shard 199: its meta.json, index.npy, one block
    stats = s3.proxy.stats()
    assert stats["requests"] == 4
    assert set(stats["paths"]) == {
        f"/{s3.bucket}/many/meta.json",
        f"/{s3.bucket}/many/199/meta.json",
        f"/{s3.bucket}/many/199/index.npy",
        f"/{s3.bucket}/many/199/data.bin",
    }


def test_uniform_random_access_is_one_request_per_block(remote, s3, atlas):
    ds = atlas.AtlasDataset(remote, cache_blocks=1)
    ds[0]  # shard 0's meta.json and index.npy
    blocks = list(range(16))  # shard 0's blocks
    random.Random(5).shuffle(blocks)
    s3.proxy.reset_stats()
    for b in blocks:
        assert ds[b * 8 + 3] == example(b * 8 + 3)
    stats = s3.proxy.stats()
    assert stats["requests"] == 16 - (blocks[0] == 0)


def test_pass_in_order_uses_large_requests(s3, tmp_path, atlas):
    local = _upload(s3, tmp_path, "big", n=4000, shard=4000, block=20)
    data_bin = local / "0" / "data.bin"
    ds = atlas.AtlasDataset(s3.url("big"), storage_options={"request_bytes": 64 << 10})
    got = list(ds)
    assert got == [example(i) for i in range(4000)]
    stats = s3.proxy.stats()
    stored = data_bin.stat().st_size
    data_requests = stats["paths"][f"/{s3.bucket}/big/0/data.bin"]
    # Two single blocks start the pass, then requests of up to 64 KiB.
    assert data_requests <= 2 + -(-stored // (64 << 10)) + 1
    assert stats["body_bytes"] <= stored * 1.05 + 4096


# -- DataLoader -----------------------------------------------------------------------------


def _epoch(loader) -> list:
    return [x for batch in loader for x in batch]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")], ids=["0", "fork", "spawn"]
)
def test_dataloader_two_epochs(remote, atlas, workers, context):
    ds = atlas.AtlasDataset(remote, cache_blocks=16)
    assert ds[599] == example(599)  # the parent has read (and used its client) first
    sampler = BlockShuffleSampler(ds, window_blocks=4, seed=3)
    kwargs = {}
    if workers:
        kwargs = {"multiprocessing_context": context, "persistent_workers": True}
    loader = DataLoader(
        ds, batch_size=16, sampler=sampler, num_workers=workers, collate_fn=list, **kwargs
    )
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = sampler.epoch_indices()
        assert _epoch(loader) == [example(i) for i in order]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_pass_in_order_with_workers(remote, s3, atlas, context):
    ds = atlas.AtlasDataset(remote)
    loader = DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context=context, collate_fn=list
    )
    for _ in range(2):
        assert _epoch(loader) == [example(i) for i in range(N)]
    # Each worker takes every other batch (one block each): its batches, in order, read
    # ahead, so not one request per batch (75 batches an epoch, 150 in two): a few per shard
    # and worker (blocks alone before the read-ahead starts, one request after).
    paths = s3.proxy.stats()["paths"]
    data = sum(v for k, v in paths.items() if k.endswith("data.bin"))
    assert data <= 100, paths


# -- faults ---------------------------------------------------------------------------------


def _random_then_in_order(ds) -> list:
    order = list(range(0, len(ds), 8))  # one example of every block, in a random order
    random.Random(9).shuffle(order)
    out = [ds[i] for i in order]
    ds.close()
    return out + list(ds)


@pytest.mark.timeout(240)
def test_faults_give_identical_examples_within_a_tenth_more_requests(s3, tmp_path, atlas):
    _upload(s3, tmp_path, "f", n=3200, shard=800, block=8)  # 400 blocks
    options = {"request_bytes": 16 << 10, "deadline": 60, "max_attempts": 20}
    clean = _random_then_in_order(atlas.AtlasDataset(s3.url("f"), storage_options=options))
    baseline = s3.proxy.stats()["requests"]
    s3.proxy.reset_stats()
    s3.proxy.set(fault_rate=0.05)
    faulty = _random_then_in_order(atlas.AtlasDataset(s3.url("f"), storage_options=options))
    stats = s3.proxy.stats()
    assert faulty == clean
    assert all(stats["faults"][kind] > 0 for kind in ("reset", "truncate", "503")), stats["faults"]
    assert stats["requests"] <= 1.1 * baseline, (stats, baseline)


@pytest.mark.timeout(120)
def test_dataset_replaced_mid_epoch_raises(s3, tmp_path, atlas):
    _upload(s3, tmp_path, "r", n=256, shard=128, block=8)
    ds = atlas.AtlasDataset(s3.url("r"), cache_blocks=1)
    assert [ds[i] for i in (3, 70, 20)] == [example(i) for i in (3, 70, 20)]
    _upload(s3, tmp_path / "again", "r", n=256, shard=128, block=8, offset=1000)
    with pytest.raises(ObjectChangedError, match=r"r/0/data\.bin \(shard 0, block 12\)") as e:
        ds[100]
    assert "replaced while being read" in str(e.value)
    assert (e.value.shard, e.value.block) == (0, 12)


# -- errors at open -------------------------------------------------------------------------


def test_errors_at_open_are_clear(s3, remote, atlas):
    with pytest.raises(AtlasFormatError, match=r"nothing-here/meta\.json: missing: not an Atlas"):
        atlas.AtlasDataset(s3.url("nothing-here"))
    with pytest.raises(ObjectNotFoundError, match="the bucket 'no-such-bucket' does not exist"):
        atlas.AtlasDataset("s3://no-such-bucket/ds")
    with pytest.raises(ValueError, match="no bucket or host"):
        atlas.AtlasDataset("s3:///ds")
    with pytest.raises(ValueError, match="nosuchscheme"):
        atlas.AtlasDataset("nosuchscheme://x/ds")
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        atlas.AtlasDataset(remote, storage_options="nope")


def test_bad_credentials_fail_at_open(s3, remote, atlas):
    key, secret = s3.server.require_auth()
    with pytest.raises(StorageError, match="access denied: check the credentials") as e:
        atlas.AtlasDataset(remote)
    assert e.value.attempts == 1
    good = {"access_key_id": key, "secret_access_key": secret}
    assert atlas.AtlasDataset(remote, storage_options=good)[7] == example(7)


def test_missing_shard_is_named_when_first_read(s3, remote, atlas):
    for key in ("meta.json", "index.npy", "data.bin"):
        s3.client.delete_object(Bucket=s3.bucket, Key=f"ds/2/{key}")
    ds = atlas.AtlasDataset(remote)
    assert ds[0] == example(0)
    with pytest.raises(AtlasFormatError, match=r"ds/2/meta\.json: missing"):
        ds[300]


def test_a_missing_object_in_a_bucket_named_bucket_is_not_a_missing_bucket(s3, atlas):
    s3.client.create_bucket(Bucket="my-bucket")
    with pytest.raises(AtlasFormatError, match=r"my-bucket/ds/meta\.json: missing: not an Atlas"):
        atlas.AtlasDataset("s3://my-bucket/ds")


def test_unreachable_server_names_url_and_attempts(atlas):
    options = {"max_attempts": 2, "deadline": 10}
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:9/ds/meta\.json: failed after 2"):
        atlas.AtlasDataset("http://127.0.0.1:9/ds", storage_options=options)


def test_a_remote_dataset_pickles_as_its_url(remote, atlas):
    import pickle

    ds = atlas.AtlasDataset(remote, storage_options={"request_bytes": 1 << 20})
    ds[0]
    again = pickle.loads(pickle.dumps(ds))
    assert again.root == ds.root and again.storage_options == {"request_bytes": 1 << 20}
    assert again[599] == example(599)
    assert atlas_fast.BACKEND in ("cython", "python")


_OPEN_ONLY = """
import sys
import atlas_fast
from atlas_fast.storage import _engines
ds = atlas_fast.AtlasDataset(sys.argv[1])
assert len(ds) == 600
opened = _engines._obstore_started
assert ds[0]["id"] == 0
print(opened, _engines._obstore_started)
"""


def test_opening_does_not_start_the_engine_forked_workers_need(remote):
    """obstore's runtime does not survive fork: opening a dataset (metadata) goes through the
    fork-safe engine, so DataLoader workers forked after it can use obstore; reading blocks
    starts it."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _OPEN_ONLY, remote], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_a_pass_in_order_fetches_the_next_shards_ahead(remote, s3, atlas):
    ds = atlas.AtlasDataset(remote)
    assert list(ds) == [example(i) for i in range(N)]
    paths = s3.proxy.stats()["paths"]
    data = [paths.get(f"/{s3.bucket}/ds/{s}/data.bin", 0) for s in range(5)]
    # At most two blocks alone start a shard's pass, then one request for the rest; a later
    # shard's request starts before the pass reaches it (one request in all) unless the pass
    # outruns it (a timing this test does not depend on: see the next test).
    assert all(1 <= d <= 3 for d in data), data
    # The root's meta.json and shared dictionary, each shard's meta.json and index.npy.
    assert sum(paths.values()) == 2 + 5 * 2 + sum(data)


def test_a_warmed_shard_is_fetched_in_one_request(remote, s3, tmp_path):
    """ShardSource.warm (private: what a pass in order calls on the shard it reaches next)
    reads the index and fetches the first blocks before any is read."""
    import time

    from atlas_fast.storage._dataset import RemoteDataset

    source = RemoteDataset(remote).source(1)
    source.metadata()
    source.warm()
    deadline = time.monotonic() + 30
    while (source._fetcher is None or source._fetcher.held() != (16, 0)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.01)
    local = tmp_path / "local-ds" / "1"
    offsets = [int(x) for x in __import__("numpy").load(local / "index.npy")]
    stored = (local / "data.bin").read_bytes()
    got = [source.block(b) for b in range(16)]
    assert got == [stored[offsets[b] : offsets[b + 1]] for b in range(16)]
    assert s3.proxy.stats()["paths"][f"/{s3.bucket}/ds/1/data.bin"] == 1


def test_warming_a_shard_reads_the_next_shards_metadata(remote, s3):
    """What lets iter(ds) find a shard's meta.json read when it reaches the shard (private:
    ShardSource.warm is what a pass calls)."""
    import time

    from atlas_fast.storage._dataset import RemoteDataset

    dataset = RemoteDataset(remote)
    dataset.source(1).metadata()
    dataset.source(1).warm()
    deadline = time.monotonic() + 30
    while dataset.source(2)._metadata is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dataset.source(2)._metadata.stored_examples == 128
    assert f"/{s3.bucket}/ds/2/meta.json" in s3.proxy.stats()["paths"]
    assert dataset.source(4)._following is None
