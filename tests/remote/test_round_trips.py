"""Round trips a remote read waits for before its first example: requests that do not depend
on each other are made together. Counted by the proxy (``faultproxy.round_trips``: which
requests were made after which answers arrived), with a latency well above the client's own
delays; nothing here asserts a time."""

from __future__ import annotations

import numpy as np
import pytest
from faultproxy import round_trips
from loader_helpers import example, write_dataset

from atlas_fast import AtlasFormatError, BlockShuffleSampler

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

N = 600  # shards of 128 examples (the last 88), blocks of 8: 75 blocks over 5 shards
LATENCY = 0.3  # seconds added to each request: far above a thread's scheduling delays


@pytest.fixture
def served(nginx):
    """A strategy-2 dataset served by nginx behind the proxy: ``(url, proxy, local root)``."""
    root, proxy = nginx
    local = write_dataset(root / "ds", N, 128, 8)
    proxy.reset_stats()
    return f"{proxy.url}/ds", proxy, local


def _trips(proxy) -> dict:
    """path -> the round trip of its first request."""
    out: dict = {}
    for path, n in round_trips(proxy.log()):
        out.setdefault(path, n)
    return out


@pytest.mark.timeout(120)
def test_a_pass_in_order_waits_two_round_trips_for_its_first_example(served, atlas):
    url, proxy, local = served
    proxy.set(latency=LATENCY)
    ds = atlas.AtlasDataset(url)
    examples = iter(ds)
    assert next(examples) == example(0)
    trips = _trips(proxy)
    # The root's meta.json, then all at once: the shared dictionary, the first shard's
    # meta.json and index.npy, and its data.bin from byte 0 (where a pass begins).
    assert trips["/ds/meta.json"] == 1
    assert trips["/ds/zstd_dict.bin"] == 2
    assert trips["/ds/0/meta.json"] == 2
    assert trips["/ds/0/index.npy"] == 2
    assert trips["/ds/0/data.bin"] == 2
    proxy.set(latency=0.0)
    assert list(examples) == [example(i) for i in range(1, N)]
    stored = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
    assert proxy.stats()["body_bytes"] <= stored * 1.05


@pytest.mark.timeout(120)
def test_a_sampler_epoch_waits_three_round_trips_for_its_first_batch(served, atlas):
    url, proxy, _ = served
    proxy.set(latency=LATENCY)
    ds = atlas.AtlasDataset(url)
    sampler = BlockShuffleSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, collate_fn=list)
    batches = iter(loader)
    first = next(batches)
    trips = _trips(proxy)
    # The root's meta.json; every shard's meta.json and index.npy (the sampler's extents
    # need them) with the shared dictionary; then the first window's extents.
    assert trips["/ds/meta.json"] == 1
    assert trips["/ds/zstd_dict.bin"] == 2
    assert all(trips[f"/ds/{s}/index.npy"] == 2 for s in range(5))
    data = [n for path, n in trips.items() if path.endswith("data.bin")]
    assert data and min(data) == 3
    proxy.set(latency=0.0)
    got = first + [x for batch in batches for x in batch]
    assert got == [example(i) for i in sampler.epoch_indices()]


def test_opening_waits_for_the_root_meta_json_alone(served, atlas):
    url, proxy, _ = served
    ds = atlas.AtlasDataset(url)
    # The shared dictionary is requested at open and awaited by the first read.
    assert {path for _m, path, _a, _d in proxy.log()} <= {"/ds/meta.json", "/ds/zstd_dict.bin"}
    assert ds[N - 1] == example(N - 1)
    assert proxy.stats()["paths"]["/ds/zstd_dict.bin"] == 1


def test_a_missing_shared_dictionary_is_named_by_the_first_read(served, atlas):
    url, _, local = served
    (local / "zstd_dict.bin").unlink()
    ds = atlas.AtlasDataset(url)
    with pytest.raises(AtlasFormatError, match=r"zstd_dict\.bin"):
        ds[0]
    with pytest.raises(AtlasFormatError, match=r"zstd_dict\.bin"):
        next(iter(ds))


@pytest.mark.parametrize("request_bytes", [1, 300, 1000, 5000])
def test_a_first_request_that_cuts_a_block_reads_every_example(served, atlas, request_bytes):
    """A pass's first request is made before the shard's index says where blocks end: the
    block it cuts is fetched again, whole, by the next request."""
    url, proxy, local = served
    ds = atlas.AtlasDataset(url, storage_options={"request_bytes": request_bytes})
    assert list(ds) == [example(i) for i in range(N)]
    stored = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
    largest = max(int(np.diff(np.load(p)).max()) for p in local.rglob("index.npy"))
    # At most the part of one block a shard fetched twice.
    assert stored <= proxy.stats()["body_bytes"] <= stored + 5 * largest


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_started_while_the_dictionary_is_on_its_way(served, atlas, context):
    """DataLoader workers made right after opening (the dictionary's request may be in
    flight in the parent, never answered in a forked child) read every example; forked ones
    find it fetched (the fork waits for it), spawned ones open the dataset again."""
    url, proxy, _ = served
    proxy.set(latency=LATENCY)
    ds = atlas.AtlasDataset(url)
    loader = DataLoader(
        ds, batch_size=50, num_workers=2, multiprocessing_context=context, collate_fn=list
    )
    assert [x for batch in loader for x in batch] == [example(i) for i in range(N)]
    assert proxy.stats()["paths"]["/ds/zstd_dict.bin"] == (1 if context == "fork" else 3)
