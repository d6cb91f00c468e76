"""atlas_fast.storage: objects and ranges from S3 (moto), HTTP (nginx) and local files."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random

import pytest

from atlas_fast import InvalidArgumentError, InvalidArgumentTypeError
from atlas_fast.storage import (
    BlockFetcher,
    Location,
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
    merge_ranges,
    read_ahead_held,
)

PAYLOAD = random.Random(7).randbytes(300_000)


@pytest.fixture
def blob(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="dir/blob", Body=PAYLOAD)
    return s3


def test_whole_object_and_exact_ranges(blob):
    obj = Location(blob.url("dir")).object("blob")
    assert obj.read() == PAYLOAD
    assert obj.read_range(10, 2000) == PAYLOAD[10:2000]
    assert obj.size == len(PAYLOAD) and obj.etag
    stats = blob.proxy.stats()
    assert stats["requests"] == 2 and stats["body_bytes"] == len(PAYLOAD) + 1990


def test_read_ranges_merges_neighbours(blob):
    obj = Location(blob.url("dir")).object("blob")
    ranges = [(0, 100), (100, 250), (250, 1000), (5000, 6000), (6000, 7000), (9000, 9001)]
    assert obj.read_ranges(ranges) == [PAYLOAD[s:e] for s, e in ranges]
    assert blob.proxy.stats()["requests"] == 3  # 0..1000, 5000..7000, 9000..9001


def test_merge_ranges_respects_the_request_size_and_gap():
    ranges = [(0, 10), (10, 20), (20, 30), (35, 40)]
    assert merge_ranges(ranges, 20, 0) == [(0, 20, [0, 1]), (20, 30, [2]), (35, 40, [3])]
    assert merge_ranges(ranges, 100, 5) == [(0, 40, [0, 1, 2, 3])]
    assert merge_ranges([(50, 60), (0, 10)], 100, 0) == [(0, 10, [1]), (50, 60, [0])]


def test_missing_object_and_missing_bucket(blob):
    with pytest.raises(ObjectNotFoundError, match="dir/nope: no such object") as info:
        Location(blob.url("dir")).object("nope").read()
    assert isinstance(info.value, FileNotFoundError) and info.value.url.endswith("dir/nope")
    with pytest.raises(ObjectNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        Location("s3://no-such-bucket/x").object("meta.json").read()


def test_bad_credentials(blob):
    blob.server.require_auth()
    with pytest.raises(StorageError, match="access denied: check the credentials") as info:
        Location(blob.url("dir")).object("blob").read()
    assert info.value.attempts == 1  # not retried


def test_good_credentials_in_storage_options(blob):
    key, secret = blob.server.require_auth()
    options = {"access_key_id": key, "secret_access_key": secret}
    assert Location(blob.url("dir"), options).object("blob").read_range(0, 5) == PAYLOAD[:5]


def test_faults_are_retried_and_short_bodies_resumed(blob):
    blob.proxy.set(fault_rate=0.5)
    obj = Location(blob.url("dir"), {"max_attempts": 40}).object("blob")
    for _ in range(10):
        start = random.randrange(0, 200_000)
        assert obj.read_range(start, start + 50_000) == PAYLOAD[start : start + 50_000]
    faults = blob.proxy.stats()["faults"]
    assert all(faults[f] > 0 for f in ("reset", "truncate", "503")), faults


def test_a_read_that_keeps_failing_names_what_and_how_often(blob):
    blob.proxy.set(fault_rate=1.0, faults=("503",))
    obj = Location(blob.url("dir"), {"max_attempts": 3}).object("blob")
    with pytest.raises(StorageError, match=r"dir/blob \(shard 4, block 9\): failed after 3") as e:
        obj.read_range(0, 10, shard=4, block=9)
    assert (e.value.shard, e.value.block, e.value.attempts) == (4, 9, 3)
    assert blob.proxy.stats()["requests"] == 3


def test_replaced_object_is_refused(blob):
    obj = Location(blob.url("dir")).object("blob")
    assert obj.read_range(0, 10) == PAYLOAD[:10]
    blob.client.put_object(Bucket=blob.bucket, Key="dir/blob", Body=PAYLOAD[::-1])
    with pytest.raises(ObjectChangedError, match="replaced while being read"):
        obj.read_range(10, 20)


def test_shrunk_object_is_refused(blob):
    obj = Location(blob.url("dir")).object("blob")
    blob.client.put_object(Bucket=blob.bucket, Key="dir/blob", Body=PAYLOAD[:100])
    with pytest.raises(ObjectChangedError):
        obj.read_range(1000, 2000)


def test_http_through_nginx(nginx):
    root, proxy = nginx
    (root / "d").mkdir()
    (root / "d" / "blob").write_bytes(PAYLOAD)
    loc = Location(proxy.url + "/d")
    obj = loc.object("blob")
    assert obj.read_range(100, 200) == PAYLOAD[100:200]
    assert obj.read() == PAYLOAD
    with pytest.raises(ObjectNotFoundError):
        loc.object("nope").read()
    before = (root / "d" / "blob").stat().st_mtime
    (root / "d" / "blob").write_bytes(PAYLOAD[::-1])  # the same size: only the ETag tells
    os.utime(root / "d" / "blob", (before + 10, before + 10))  # nginx's ETag: whole seconds
    with pytest.raises(ObjectChangedError, match="ETag"):
        obj.read_range(0, 10)


def test_local_location(tmp_path):
    (tmp_path / "blob").write_bytes(PAYLOAD)
    for where in (str(tmp_path), f"file://{tmp_path}"):
        obj = Location(where).object("blob")
        assert obj.read_ranges([(5, 10), (0, 5)]) == [PAYLOAD[5:10], PAYLOAD[:5]]
        assert obj.read() == PAYLOAD
    with pytest.raises(ObjectNotFoundError):
        Location(tmp_path).object("nope").read()


def test_location_pickles_as_configuration(blob):
    loc = Location(blob.url("dir"), {"request_bytes": 1 << 20})
    loc.object("blob").read_range(0, 1)  # makes the client
    again = pickle.loads(pickle.dumps(loc))
    assert again.url == loc.url and again.storage_options == {"request_bytes": 1 << 20}
    assert again._engine is None
    assert again.object("blob").read_range(0, 3) == PAYLOAD[:3]


def test_bad_options_are_refused():
    with pytest.raises(InvalidArgumentError, match="request_bytes"):
        Location("s3://bucket/x", {"request_bytes": 0})
    with pytest.raises(InvalidArgumentError, match=r"storage_options\['merge_gap'\] must be"):
        Location("s3://bucket/x", {"merge_gap": -1})
    with pytest.raises(InvalidArgumentTypeError, match="storage_options must be a dict"):
        Location("s3://bucket/x", "nope")
    with pytest.raises(ValueError, match="no bucket or host"):
        Location("s3:///x")


def _offsets(size: int, n: int) -> list:
    step = size // n
    return [k * step for k in range(n)] + [size]


def test_block_fetcher_single_blocks_are_one_exact_request_each(blob):
    obj = Location(blob.url("dir")).object("blob")
    offsets = _offsets(len(PAYLOAD), 30)
    fetcher = BlockFetcher(obj, offsets)
    for b in (7, 3, 20, 11):
        assert fetcher.get(b) == PAYLOAD[offsets[b] : offsets[b + 1]]
    stats = blob.proxy.stats()
    assert stats["requests"] == 4 and stats["body_bytes"] == 4 * 10_000


def test_block_fetcher_pass_in_order_reads_ahead_in_large_requests(blob):
    obj = Location(blob.url("dir"), {"request_bytes": 100_000}).object("blob")
    offsets = _offsets(len(PAYLOAD), 30)
    fetcher = BlockFetcher(obj, offsets)
    got = [fetcher.get(b) for b in range(30)]
    assert b"".join(got) == PAYLOAD
    stats = blob.proxy.stats()
    # Blocks 0 and 1 alone, then requests of up to 10 blocks: 2 + 3.
    assert stats["requests"] == 5 and stats["body_bytes"] == len(PAYLOAD)
    assert read_ahead_held() == 0


def test_block_fetcher_batch_prefetch_merges_and_keeps_until_read(blob):
    obj = Location(blob.url("dir")).object("blob")
    offsets = _offsets(len(PAYLOAD), 30)
    fetcher = BlockFetcher(obj, offsets)
    batch = [4, 5, 6, 20, 21, 9]
    fetcher.prefetch(batch)
    for b in reversed(batch):
        assert fetcher.get(b) == PAYLOAD[offsets[b] : offsets[b + 1]]
    assert blob.proxy.stats()["requests"] == 3
    assert fetcher.held() == (0, 0)


def test_block_fetcher_hints_never_start_a_pass_read_ahead(blob):
    """Blocks a sampler names ahead (``hint``) are fetched and kept until read, but unlike a
    pass in order's batches, neighbours named one after the other start no read-ahead."""
    obj = Location(blob.url("dir")).object("blob")
    offsets = _offsets(len(PAYLOAD), 30)
    hinted = BlockFetcher(obj, offsets)
    for b in (4, 5, 6):
        hinted.prefetch([b], hint=True)
    for b in (4, 5, 6):
        assert hinted.get(b) == PAYLOAD[offsets[b] : offsets[b + 1]]
    assert blob.proxy.stats()["requests"] == 3 and read_ahead_held() == 0
    assert hinted.held() == (0, 0)
    batches = BlockFetcher(obj, offsets)
    for b in (4, 5, 6):
        batches.prefetch([b])
    assert read_ahead_held() > 0 or batches.held()[0] + batches.held()[1] > 1  # it reads ahead
    batches.close()
    import time

    deadline = time.monotonic() + 10
    while read_ahead_held() and time.monotonic() < deadline:
        time.sleep(0.01)  # requests in flight give their bytes back when they land


def test_block_fetcher_drops_read_ahead_when_the_pass_ends(blob):
    obj = Location(blob.url("dir"), {"request_bytes": 30_000}).object("blob")
    offsets = _offsets(len(PAYLOAD), 30)
    fetcher = BlockFetcher(obj, offsets)
    fetcher.get(0)
    fetcher.get(1)  # a pass: read-ahead starts
    assert fetcher.get(25) == PAYLOAD[offsets[25] : offsets[26]]  # elsewhere: dropped
    fetcher.close()
    import time

    deadline = time.monotonic() + 10
    while read_ahead_held() and time.monotonic() < deadline:
        time.sleep(0.01)  # requests in flight give their bytes back when they land
    assert read_ahead_held() == 0


def _child_reads(obj, offsets, queue):
    fetcher = BlockFetcher(obj, offsets)
    queue.put(b"".join(fetcher.get(b) for b in range(len(offsets) - 1)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_objects_work_in_child_processes(blob, method):
    obj = Location(blob.url("dir")).object("blob")
    offsets = _offsets(len(PAYLOAD), 10)
    parent = BlockFetcher(obj, offsets)
    parent.get(0)
    parent.get(1)  # read-ahead in flight in the parent when it forks
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_reads, args=(obj, offsets, queue))
    proc.start()
    assert queue.get(timeout=50) == PAYLOAD
    proc.join(10)
    assert proc.exitcode == 0
