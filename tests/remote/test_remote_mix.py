"""Mixtures over remote datasets (moto's S3 behind the counting proxy), beside a local one:
the same examples as the local copies, through a DataLoader with and without workers, and the
same read-ahead: the blocks a sampler names next are fetched by their source before the batch
that reads them, each once."""

from __future__ import annotations

import numpy as np
import pytest
from loader_helpers import example, write_dataset
from servers import upload_tree

from atlas_fast import MixtureDataset, MixtureSampler

torch = pytest.importorskip("torch")

SIZES = {"web": (1200, 400), "code": (500, 250)}  # remote: (examples, shard size); blocks of 10


@pytest.fixture
def sources(s3, tmp_path):
    """``(urls, local roots)`` of the remote sources, and a local ``wiki``."""
    urls, local = {}, {}
    for name, (n, shard) in SIZES.items():
        local[name] = write_dataset(tmp_path / name, n, shard, 10)
        upload_tree(s3.client, s3.bucket, local[name], name)
        urls[name] = s3.url(name)
    local["wiki"] = write_dataset(tmp_path / "wiki", 90, 400, 10)
    s3.proxy.reset_stats()
    return urls, local


def _mixture(atlas, sources) -> MixtureDataset:
    urls, local = sources
    return MixtureDataset(
        {
            "web": atlas.AtlasDataset(urls["web"]),
            "code": atlas.AtlasDataset(urls["code"]),
            "wiki": atlas.AtlasDataset(local["wiki"]),
        }
    )


WEIGHTS = {"web": 5, "code": 3, "wiki": 2}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_of_remote_datasets_reads_as_the_local_one(s3, sources, atlas, workers):
    mix = _mixture(atlas, sources)
    sampler = MixtureSampler(mix, WEIGHTS, global_batch_size=40, seed=2, epoch_length=40 * 30)
    loader = torch.utils.data.DataLoader(
        mix, batch_size=40, sampler=sampler, num_workers=workers, collate_fn=list
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        expected = [example(mix.locate(i)[1]) for i in sampler.epoch_indices()]
        assert [x for batch in loader for x in batch] == expected
    mix.close()


@pytest.mark.timeout(240)
def test_a_remote_source_fetches_the_blocks_named_next(s3, sources, atlas, monkeypatch):
    """In this process the sampler names each window of a source's order ahead: a remote
    source fetches those blocks (``ShardSource.prefetch``, private: the fetching is not
    observable otherwise) during a batch before the one that reads them, neighbours merged,
    without fetching much more than is read."""
    from atlas_fast.storage._dataset import ShardSource

    batch = [0]
    asked: dict = {}  # (shard url, block) -> the batch during which it was first asked for
    read: dict = {}  # ... first read
    real_prefetch, real_block = ShardSource.prefetch, ShardSource.block

    def prefetch(self, blocks, hint=False):
        for b in blocks:
            asked.setdefault((self.url, b), batch[0])
        return real_prefetch(self, blocks, hint)

    def block(self, b):
        read.setdefault((self.url, b), batch[0])
        return real_block(self, b)

    monkeypatch.setattr(ShardSource, "prefetch", prefetch)
    monkeypatch.setattr(ShardSource, "block", block)
    mix = _mixture(atlas, sources)
    sampler = MixtureSampler(mix, WEIGHTS, global_batch_size=40, seed=2, epoch_length=40 * 30)
    it = iter(sampler)
    got = []
    for k in range(30):
        batch[0] = k
        got += mix.__getitems__([next(it) for _ in range(40)])
    assert got == [example(mix.locate(i)[1]) for i in sampler.epoch_indices()]
    mix.close()  # what was fetched and not read is given back
    early = [key for key, k in read.items() if asked.get(key, k) < k]
    assert len(early) >= len(read) * 3 // 4, (len(early), len(read))
    # Nothing fetched over and over: about the bytes of the blocks read or named (a source's
    # last window named in the epoch may be read only in part; requests merge neighbours
    # across small gaps), in fewer requests than blocks.
    _, local = sources
    stats = s3.proxy.stats()
    prefix = f"/{s3.bucket}/"
    files = needed = 0
    for path, count in stats["paths"].items():
        if not path.endswith("data.bin"):
            name = path[len(prefix) :]
            files += count * (local[name.split("/")[0]].parent / name).stat().st_size
    for url, b in set(read) | set(asked):
        name, shard = url.rstrip("/").split("/")[-2:]
        offsets = np.load(local[name] / shard / "index.npy")
        needed += int(offsets[b + 1] - offsets[b])
    assert stats["body_bytes"] - files <= needed * 5 // 4
    assert sum(n for p, n in stats["paths"].items() if p.endswith("data.bin")) <= len(read)
