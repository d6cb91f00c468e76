"""BlockShuffleSampler over a dataset in object storage: its default order reads in extents,
one request each (counted by the proxy), with and without DataLoader workers."""

from __future__ import annotations

import time

import numpy as np
import pytest
from loader_helpers import example, write_dataset
from servers import upload_tree

from atlas_fast import BlockShuffleSampler

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

N = 600  # shards of 128 examples (the last 88), blocks of 8: 16 blocks a shard (the last 11)
EXTENT = 4  # blocks an extent
EXTENTS = 4 * 4 + 3  # extents of 4 blocks from each shard's block 0


@pytest.fixture
def stored(s3, tmp_path):
    local = write_dataset(tmp_path / "local", N, 128, 8)
    upload_tree(s3.client, s3.bucket, local, "ds")
    data = sum(p.stat().st_size for p in local.rglob("data.bin"))
    per_block = (local / "0" / "data.bin").stat().st_size / 16
    return s3.url("ds"), data, round(EXTENT * per_block), local


def _data_requests(s3) -> int:
    return sum(v for k, v in s3.proxy.stats()["paths"].items() if k.endswith("data.bin"))


def test_the_default_order_of_a_remote_dataset_is_in_extents(stored, atlas, tmp_path):
    url, _, _, _ = stored
    remote = BlockShuffleSampler(atlas.AtlasDataset(url))
    assert remote.extent_blocks > 1  # 4 MiB of these small blocks: each shard one extent
    local = write_dataset(tmp_path / "here", 40, 16, 8)
    assert BlockShuffleSampler(atlas.AtlasDataset(local)).extent_blocks == 0


@pytest.mark.timeout(240)
def test_an_epoch_fetches_each_extent_in_one_request(stored, s3, atlas):
    url, data, extent_bytes, _ = stored
    ds = atlas.AtlasDataset(url, cache_blocks=8)  # not the whole dataset: epoch 2 reads again
    sampler = BlockShuffleSampler(ds, seed=2, extent_bytes=extent_bytes, window_blocks=4)
    assert sampler.extent_blocks == EXTENT
    loader = DataLoader(ds, batch_size=16, sampler=sampler, collate_fn=list)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        s3.proxy.reset_stats()
        got = [x for batch in loader for x in batch]
        assert got == [example(i) for i in sampler.epoch_indices()]
        if epoch == 0:
            # One request per extent at most, not one a block (75): extents that are
            # neighbours and named together (the next window's) may share a request.
            assert _data_requests(s3) <= EXTENTS
            assert s3.proxy.stats()["body_bytes"] <= data * 1.05
        else:
            # The 8 blocks still decoded in the cache from epoch 0 split their extents'
            # requests in two at most, or come with them (their bytes again).
            assert _data_requests(s3) <= EXTENTS + 8
            assert s3.proxy.stats()["body_bytes"] <= data * 1.05 + 2 * extent_bytes
    ds.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_dealt_windows_of_extents_fetch_each_extent_once(stored, s3, atlas, context):
    url, _, extent_bytes, _ = stored
    ds = atlas.AtlasDataset(url)
    sampler = BlockShuffleSampler(
        ds, seed=3, extent_bytes=extent_bytes, window_extents=2, batch_size=16, num_workers=2
    )
    loader = DataLoader(
        ds,
        batch_size=16,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=list,
    )
    s3.proxy.reset_stats()
    got = [x for batch in loader for x in batch]
    assert got == [example(i) for i in sampler.epoch_indices()]
    # The workers read in extents too (the dataset pickles with them); each window of 2
    # extents is one worker's, but where a worker's windows run out its batches are filled
    # from the other's (its last window's 2 extents at most).
    assert _data_requests(s3) <= EXTENTS + 2


def test_random_access_beside_a_sampler_is_one_request_per_block_missed(stored, s3, atlas):
    url, _, extent_bytes, _ = stored
    ds = atlas.AtlasDataset(url, cache_blocks=1)
    BlockShuffleSampler(ds, extent_bytes=extent_bytes)  # reads in extents from now on
    s3.proxy.reset_stats()
    for b in (0, 9, 2, 14):  # shard 0: extents 0, 2, 0, 3
        assert ds[b * 8 + 1] == example(b * 8 + 1)
    assert _data_requests(s3) == 3  # block 2 came with block 0's extent
    ds.close()


@pytest.mark.timeout(120)
def test_the_next_window_of_extents_is_fetched_before_it_is_read(stored, s3, atlas):
    """Without DataLoader workers the sampler names to the dataset the blocks of about one
    window of extents ahead (from its second group of ``window_blocks`` blocks on: the first
    window's extents come first): once the second group is reached, the extents of the first
    two windows are fetched, whole, and nothing more (requests may merge neighbours)."""
    url, _, extent_bytes, local = stored
    ds = atlas.AtlasDataset(url, cache_blocks=8)
    sampler = BlockShuffleSampler(
        ds, seed=4, extent_bytes=extent_bytes, window_blocks=2, window_extents=2
    )
    # Windows of 2 extents follow each other in the order: its first 4 extents are windows
    # 0 and 1 (an extent: shard, then block // EXTENT within it; shards of 128, blocks of 8).
    order = sampler.epoch_indices()
    extents = list(dict.fromkeys((i // 128, i % 128 // 8 // EXTENT) for i in order))
    offsets = [np.load(local / str(s) / "index.npy") for s in range(5)]
    wanted = sum(
        int(offsets[s][min((e + 1) * EXTENT, len(offsets[s]) - 1)] - offsets[s][e * EXTENT])
        for s, e in extents[:4]
    )
    s3.proxy.reset_stats()
    batches = iter(DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=list))
    # Groups of 2 blocks (16 examples), 4 to a window of extents: 5 batches reach the second
    # group, a whole window (48 examples) before window 1.
    head = [x for _ in range(5) for x in next(batches)]
    assert head == [example(i) for i in order[:20]]
    deadline = time.monotonic() + 60
    while s3.proxy.stats()["body_bytes"] < wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # anything more would have been asked for by now
    assert s3.proxy.stats()["body_bytes"] == wanted  # windows 0 and 1, not window 0 alone
    assert _data_requests(s3) <= 4  # one request per extent at most
    # The rest of the epoch: every request this test started lands before it ends.
    rest = [x for batch in batches for x in batch]
    assert head + rest == [example(i) for i in order]
    ds.close()
