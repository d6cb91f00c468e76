"""The local disk cache of a remote dataset (``cache_dir=``): a second epoch read from disk,
a hard byte limit never exceeded with four processes reading at once, a worker killed with
SIGKILL mid-write leaving no stuck lock and no corrupt entry, files it did not write left
alone, and a limit smaller than one window refused at open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from loader_helpers import example, write_dataset
from servers import upload_tree

from atlas_fast import InvalidArgumentError, InvalidArgumentTypeError

N = 600  # 5 shards of 128 examples (the last 88), blocks of 8: 75 blocks, about 8 KB stored
SHARDS = 5
OPTIONS = {"read_ahead_bytes": 2048, "request_bytes": 1024}  # one window: 2 KiB
EXPECTED = [example(i) for i in range(N)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def remote(s3, tmp_path):
    local = write_dataset(tmp_path / "local", N, 128, 8)
    upload_tree(s3.client, s3.bucket, local, "ds")
    s3.proxy.reset_stats()
    stored = sum(p.stat().st_size for p in local.rglob("data.bin"))
    return s3.url("ds"), stored


def _data_stats(s3) -> tuple:
    """(requests, body bytes) of data.bin objects since the last reset (body bytes: all)."""
    stats = s3.proxy.stats()
    requests = sum(n for path, n in stats["paths"].items() if path.endswith("/data.bin"))
    return requests, stats["body_bytes"]


def _block_files(cache: Path) -> list:
    return [p for p in (cache / "blocks").iterdir() if p.is_file()]


def _cache_files(cache: Path) -> list:
    """The block files (and temporaries) the cache made: not the test's own."""
    return [p for p in _block_files(cache) if p.name not in ("README", "draft.tmp")]


def _check_consistent(cache_dir: Path, limit: int) -> None:
    """Every block file is an entry of the right size (no temporary left), nothing reserved,
    the entries within the limit."""
    import sqlite3

    with sqlite3.connect(cache_dir / "index.sqlite") as db:
        entries = dict(db.execute("SELECT name, size FROM entries"))
        reserved = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM reservations").fetchone()[0]
    files = {p.name: p.stat().st_size for p in _cache_files(cache_dir)}
    assert files == entries
    assert reserved == 0
    assert sum(entries.values()) <= limit


def test_a_second_epoch_is_read_from_disk(remote, s3, tmp_path, atlas):
    url, stored = remote
    cache = tmp_path / "cache"
    ds = atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=cache, cache_dir_bytes=1 << 20)
    assert list(ds) == EXPECTED
    first, _ = _data_stats(s3)
    assert first >= SHARDS
    _check_consistent(cache, 1 << 20)
    assert sum(p.stat().st_size for p in _block_files(cache)) == stored

    # Another reader (as a new process would be): one 1-byte request per shard pins its
    # version; every block comes from disk.
    s3.proxy.reset_stats()
    again = atlas.AtlasDataset(
        url, storage_options=OPTIONS, cache_dir=cache, cache_dir_bytes=1 << 20
    )
    assert list(again) == EXPECTED
    order = list(range(N))[::-7]
    assert [again[i] for i in order] == [EXPECTED[i] for i in order]
    requests, _ = _data_stats(s3)
    assert requests == SHARDS
    assert all(
        s3.proxy.stats()["paths"].get(f"/{s3.bucket}/ds/{k}/data.bin") == 1 for k in range(SHARDS)
    )
    # The same reader again, its decoded-block cache too small to help: no request at all.
    small = atlas.AtlasDataset(
        url, storage_options=OPTIONS, cache_dir=cache, cache_dir_bytes=1 << 20, cache_blocks=1
    )
    list(small)
    s3.proxy.reset_stats()
    assert list(small) == EXPECTED
    assert _data_stats(s3)[0] == 0


@pytest.mark.timeout(240)
def test_dataloader_workers_share_the_cache(remote, s3, tmp_path, atlas):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, _ = remote
    ds = atlas.AtlasDataset(
        url, storage_options=OPTIONS, cache_dir=tmp_path / "c", cache_dir_bytes=1 << 20
    )
    loader = DataLoader(
        ds, batch_size=16, num_workers=2, collate_fn=list, multiprocessing_context="fork"
    )
    assert sorted(x["id"] for b in loader for x in b) == list(range(N))
    s3.proxy.reset_stats()
    assert sorted(x["id"] for b in loader for x in b) == list(range(N))  # new workers
    requests, _ = _data_stats(s3)
    assert requests <= 2 * SHARDS  # each worker pins each shard it reads: 1 byte
    del torch


def test_blocks_merged_across_a_gap_are_read_through_the_cache(remote, tmp_path, atlas):
    """With ``merge_gap`` a batch's request spans blocks not asked for; the cache hands back
    the blocks asked for alone, each still found where the range has it."""
    url, _ = remote
    options = dict(OPTIONS, merge_gap=1 << 20, request_bytes=1 << 20)
    ds = atlas.AtlasDataset(
        url, storage_options=options, cache_dir=str(tmp_path / "c"), cache_dir_bytes=1 << 20
    )
    assert ds[3 * 8] == EXPECTED[3 * 8]  # block 3 alone: then a gap in the batch below
    indices = [0, 2 * 8, 4 * 8 + 1, 6 * 8 + 2]  # blocks 0, 2, 4 and 6 of shard 0
    assert ds.__getitems__(indices) == [EXPECTED[i] for i in indices]
    ds.close()


def test_a_limit_smaller_than_one_window_is_refused(remote, tmp_path, atlas):
    url, _ = remote
    too_small = rf"{url}: cache_dir_bytes=2047 is smaller than one "
    with pytest.raises(InvalidArgumentError, match=too_small):
        atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=tmp_path, cache_dir_bytes=2047)
    with pytest.raises(InvalidArgumentError, match="read-ahead window"):
        atlas.AtlasDatasetShard(f"{url}/0", cache_dir=tmp_path, cache_dir_bytes=1 << 20)
    atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=tmp_path, cache_dir_bytes=2048)
    with pytest.raises(InvalidArgumentError, match="cache_dir needs cache_dir_bytes"):
        atlas.AtlasDataset(url, cache_dir=tmp_path)
    with pytest.raises(InvalidArgumentError, match="pass cache_dir too"):
        atlas.AtlasDataset(url, cache_dir_bytes=1 << 30)
    with pytest.raises(InvalidArgumentError, match="cache_dir_bytes"):
        atlas.AtlasDataset(url, cache_dir=tmp_path, cache_dir_bytes=0)
    with pytest.raises(InvalidArgumentTypeError, match="cache_dir must be a path"):
        atlas.AtlasDataset(url, cache_dir=5, cache_dir_bytes=1 << 30)


def test_an_index_that_is_not_one_is_an_error_at_open(remote, tmp_path, atlas):
    url, _ = remote
    (tmp_path / "index.sqlite").write_bytes(b"not a database, " * 100)
    with pytest.raises(ValueError, match=r"index\.sqlite: not a usable disk cache index"):
        atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=tmp_path, cache_dir_bytes=4096)


def test_the_cache_pickles_with_the_dataset(remote, tmp_path, atlas):
    import pickle

    url, _ = remote
    ds = atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=tmp_path, cache_dir_bytes=4096)
    copy = pickle.loads(pickle.dumps(ds))
    assert (copy.cache_dir, copy.cache_dir_bytes) == (tmp_path, 4096)
    assert copy[N - 1] == EXPECTED[-1]
    shard = pickle.loads(pickle.dumps(ds.shards[1]))
    assert shard.cache_dir == tmp_path and shard[3] == EXPECTED[131]


_READER = textwrap.dedent(
    """
    import random, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    import atlas_fast
    from loader_helpers import example

    url, cache, limit, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    options = {options!r}
    for epoch in range(2):
        ds = atlas_fast.AtlasDataset(
            url, storage_options=options, cache_dir=cache, cache_dir_bytes=limit, cache_blocks=1
        )
        order = list(range({n}))
        random.Random(seed + epoch).shuffle(order)
        for i in order:
            assert ds[i] == example(i), i
        assert list(ds) == [example(i) for i in range({n})]
    print("ok")
    """
)


def _reader_script(**extra) -> str:
    return _READER.format(root=str(ROOT), tests=str(ROOT / "tests"), options=OPTIONS, n=N, **extra)


@pytest.mark.timeout(300)
def test_never_exceeds_its_limit_under_four_processes(remote, s3, tmp_path):
    """Four processes read at once, each in its own random order then in order, twice, with a
    limit of 5 KiB (less than the 8 KB stored: entries are evicted all the time); the bytes in
    the cache folder, watched throughout, never exceed it."""
    url, stored = remote
    limit = 5 << 10
    assert stored > limit
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")  # not the cache's: never touched
    (cache / "blocks").mkdir()
    (cache / "blocks" / "README").write_text("also mine")
    (cache / "blocks" / "draft.tmp").write_text("and this")
    seen = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                seen.append(sum(p.stat().st_size for p in _cache_files(cache)))
            except (FileNotFoundError, OSError):
                pass  # a file evicted between listing and stat
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _reader_script(), url, str(cache), str(limit), str(k)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(4)
        ]
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        done.set()
        watcher.join()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok", err[-3000:]
    assert len(seen) > 10 and max(seen) <= limit, max(seen)
    assert max(seen) > 0
    _check_consistent(cache, limit)
    assert (cache / "notes.txt").read_text() == "mine"
    assert (cache / "blocks" / "README").read_text() == "also mine"
    assert (cache / "blocks" / "draft.tmp").read_text() == "and this"
    assert not list((cache / "owners").iterdir()) or all(
        not p.name.startswith(".") for p in (cache / "owners").iterdir()
    )


_KILLED = textwrap.dedent(
    """
    import os, sys, time
    sys.path[:0] = [{root!r}, {tests!r}]
    import atlas_fast
    from atlas_fast.storage import _diskcache

    url, cache, limit, marker = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    real_replace = os.replace
    renamed = []

    def replace(src, dst):
        real_replace(src, dst)
        if os.sep + "blocks" + os.sep in dst:
            renamed.append(dst)
            if len(renamed) == 3:
                # Inside the publishing transaction (the index's write lock held), block
                # files renamed into place and not yet entered, others still temporary.
                open(marker, "w").close()
                time.sleep(600)

    _diskcache.os.replace = replace
    ds = atlas_fast.AtlasDataset(
        url, storage_options={options!r}, cache_dir=cache, cache_dir_bytes=limit
    )
    ds.__getitems__(list(range(0, 128)))  # one shard's blocks, published together
    """
)


@pytest.mark.timeout(300)
def test_survives_a_worker_killed_with_sigkill(remote, s3, tmp_path, atlas):
    url, _ = remote
    limit = 1 << 20
    cache = tmp_path / "cache"
    marker = tmp_path / "paused"
    # A first reader fills part of the cache, so that the killed one publishes beside entries.
    first = atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=cache, cache_dir_bytes=limit)
    assert [first[i] for i in range(300, 400)] == EXPECTED[300:400]
    (cache / "blocks" / "README").write_text("not the cache's")  # survives the reclaim
    (cache / "blocks" / "draft.tmp").write_text("nor this")
    script = _KILLED.format(root=str(ROOT), tests=str(ROOT / "tests"), options=OPTIONS)
    child = subprocess.Popen(
        [sys.executable, "-c", script, url, str(cache), str(limit), str(marker)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the child never reached its pause"
            time.sleep(0.05)
        tmp_files = [p for p in _cache_files(cache) if p.name.endswith(".tmp")]
        assert tmp_files  # its blocks not renamed yet
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    # Another process (its first use of the cache reclaims the dead one's leftovers): no
    # lock held, the same examples, and the cache consistent.
    out = subprocess.run(
        [sys.executable, "-c", _reader_script(), url, str(cache), str(limit), "7"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    _check_consistent(cache, limit)

    # A damaged entry (one truncated, one with a byte flipped) is never served: it is
    # fetched again.
    files = sorted(_cache_files(cache))
    files[0].write_bytes(files[0].read_bytes()[:-1])
    data = bytearray(files[1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[1].write_bytes(bytes(data))
    s3.proxy.reset_stats()
    again = atlas.AtlasDataset(url, storage_options=OPTIONS, cache_dir=cache, cache_dir_bytes=limit)
    assert [again[i] for i in range(N)] == EXPECTED
    assert list(again) == EXPECTED
    requests, _ = _data_stats(s3)
    assert SHARDS < requests <= SHARDS + 2  # the pins, and the two damaged blocks fetched
    _check_consistent(cache, limit)
    assert (cache / "blocks" / "README").read_text() == "not the cache's"
    assert (cache / "blocks" / "draft.tmp").read_text() == "nor this"


def test_a_local_dataset_ignores_the_cache(tmp_path, atlas):
    local = write_dataset(tmp_path / "ds", 50, 20, 5)
    ds = atlas.AtlasDataset(local, cache_dir=tmp_path / "c", cache_dir_bytes=1)
    assert list(ds) == EXPECTED[:50]
    assert not (tmp_path / "c").exists()
