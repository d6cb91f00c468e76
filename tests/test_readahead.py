"""Passes in order (iter(ds), ds[i] for i in order) with blocks decoded ahead: every example
exact whatever else happens meanwhile (random reads, threads, close, fork), and a damaged
block reported when it is reached, as without read-ahead. The compiled backend's read-ahead
is a C thread (src/_readahead.pxi); the Python backend's is the pool (_core/_pool.py)."""

from __future__ import annotations

import importlib
import os
import random
import resource
from pathlib import Path

import numpy as np
import pytest
from helpers import child_report, fork_check, run_threads
from loader_helpers import example, write_dataset

import atlas_fast
from atlas_fast import AtlasDatasetWriter, AtlasFormatError, CompressionStrategy

N = 600  # 3 shards of 200, blocks of 10: 60 blocks
COMPRESSED = ("shared", "per-shard")  # the ``root``s read ahead (uncompressed blocks never are)
# ``cores="busy"`` turns the C read-ahead's back-off on: with the compiled backend only.
BUSY_CORES_ARE_COMPILED = pytest.mark.only(
    lambda p: p["cores"] == "idle" or p["backend"] == "cython"
)


def _reader_module():
    if atlas_fast.BACKEND != "cython":
        return None
    return importlib.import_module("atlas_fast._core._reader")


@pytest.fixture(autouse=True)
def read_ahead_small_blocks(monkeypatch):
    """These blocks are small: read them ahead anyway (both backends)."""
    monkeypatch.setattr(atlas_fast._core._pool, "POOL_MIN_BLOCK_BYTES", 0)
    reader = _reader_module()
    if reader is None:
        yield
        return
    old = reader._readahead_min_bytes(0)
    yield
    reader._readahead_min_bytes(old)


@pytest.fixture(scope="module", params=["shared", "per-shard", "uncompressed"])
def root(request, tmp_path_factory):
    strategy = {
        "shared": CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        "per-shard": CompressionStrategy.STANDARD_COMPRESSION,
        "uncompressed": CompressionStrategy.NO_COMPRESSION,
    }[request.param]
    return write_dataset(tmp_path_factory.mktemp("ahead") / "ds", N, 200, 10, strategy)


@pytest.fixture(scope="module")
def expected():
    return [example(i) for i in range(N)]


def info():
    reader = _reader_module()
    return None if reader is None else reader._readahead_info()


def test_iter_and_in_order(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    assert list(ds) == expected
    assert [ds[i] for i in range(N)] == expected
    assert list(ds) == expected  # again, some blocks now cached
    assert [x for shard in ds.shards for x in shard] == expected
    shard = ds.shards[1]
    assert [shard[i] for i in range(len(shard))] == expected[200:400]


@pytest.mark.only(backend="cython")
def test_read_ahead_is_used_on_compressed_blocks_only(atlas, backend, root, expected):
    compressed = atlas.AtlasDataset(root).shards[0]._compressed
    before = info()["taken"]
    ds = atlas.AtlasDataset(root)
    assert list(ds) == expected
    assert [ds[i] for i in range(N)] == expected
    taken = info()["taken"] - before
    if compressed:
        assert taken > 0
    else:
        assert taken == 0


@pytest.mark.only(backend="cython")
def test_a_pass_in_order_reads_small_frames_ahead(atlas, backend, tmp_path):
    """With the default lines: a pass in order reads ahead frames of a few KiB stored (the C
    thread takes no GIL: decoding them there pays), while prefetch() hints are not taken for
    a shard whose blocks are that small (the Python pool's line). Every example exact."""
    reader = _reader_module()
    c = reader.C_CONSTANTS
    reader._readahead_min_bytes((c["READ_AHEAD_MIN_STORED"], c["PREFETCH_MIN_STORED"]))
    rng = random.Random(3)
    examples = [{"id": i, "blob": rng.randbytes(700)} for i in range(120)]  # incompressible
    with AtlasDatasetWriter(
        tmp_path / "ds", 60, 10, compression_strategy=CompressionStrategy.STANDARD_COMPRESSION
    ) as w:
        for x in examples:
            w.add_example(x)
    ds = atlas.AtlasDataset(tmp_path / "ds")
    offsets = [np.load(shard / "index.npy") for shard in sorted((tmp_path / "ds").glob("[0-9]"))]
    sizes = [int(size) for o in offsets for size in np.diff(o)]
    assert all(c["READ_AHEAD_MIN_STORED"] <= size < c["PREFETCH_MIN_STORED"] for size in sizes)
    before = info()["taken"]
    assert [ds[i] for i in range(len(ds))] == examples
    assert info()["taken"] > before
    ds.prefetch([0, 50])
    assert [ds[i] for i in (0, 50, 119)] == [examples[i] for i in (0, 50, 119)]
    assert ds.prefetch([10, 60]) is False  # the hints were found not worth it


@pytest.mark.only(backend="cython", root=COMPRESSED)
@pytest.mark.parametrize("how", ["ds[i]", "iter"])
def test_a_long_wait_for_the_worker_backs_off_then_reads_ahead_again(
    atlas, backend, root, expected, how
):
    """The cores busy (every take made to count as a long wait): after the first block taken
    from the read-ahead, the blocks not yet queued are decoded inline, every example exact;
    the back-off (64 blocks the first time) runs out, reading ahead resumes, and the next
    long wait backs off twice as long. Waits short again (the hook forgets the back-off):
    read ahead throughout."""
    reader = _reader_module()

    def read():  # 60 blocks of 10, on a fresh reader: nothing cached
        ds = atlas.AtlasDataset(root)
        return [ds[i] for i in range(N)] if how == "ds[i]" else list(ds)

    def delta(before):
        now = info()
        return {k: now[k] - before[k] for k in ("backoffs", "taken", "skipped")}, now["skip"]

    # ds[i] starts reading ahead at block 1 (a lone ds[0] reads nothing ahead), iter at 0;
    # ds[i] reads ahead within a shard (3 of 20 blocks), iter across them.
    first, ahead = (1, 60 - 4) if how == "ds[i]" else (0, 60 - 1)
    old = reader._readahead_backoff(-1, None)
    try:
        before = info()
        assert read() == expected
        # Block `first` queues the 6 after it; the take of the first of them backs off for
        # 64 blocks, counted from it to block 59; the other 5 queued are taken all the same.
        skipped = 59 - first
        assert delta(before) == ({"backoffs": 1, "taken": 6, "skipped": skipped}, 64 - skipped)
        before = info()
        assert read() == expected
        # The 64 - skipped blocks left inline, the next queues 6 again, and the first of them
        # backs off for 128 blocks.
        left = 64 - skipped
        again = skipped - left
        assert delta(before) == ({"backoffs": 1, "taken": 6, "skipped": skipped}, 128 - again)
    finally:
        reader._readahead_backoff(*old)
    before = info()
    assert read() == expected
    assert delta(before) == ({"backoffs": 0, "taken": ahead, "skipped": 0}, 0)


@pytest.mark.only(backend="cython", root=COMPRESSED)
def test_the_doubling_is_forgotten_after_1024_takes_without_a_sign(atlas, backend, root, expected):
    """After a back-off has run out, 1,024 blocks taken from the read-ahead with no sign of
    busy cores: the next sign backs off for 64 blocks again, not twice the last."""
    reader = _reader_module()

    def read():  # 60 blocks, 59 read ahead
        assert list(atlas.AtlasDataset(root)) == expected

    old = reader._readahead_backoff(-1, None)
    try:
        read()
        assert info()["skip"] == 64 - 59
        reader._readahead_backoff(None, None, forget=False)  # no sign; the back-off stays
        before = info()["taken"]
        while info()["taken"] - before < 1024 + 6 + 5:  # 5 still skipped; 6 not judged
            read()
        reader._readahead_backoff(-1, None, forget=False)
        read()
        assert info()["skip"] == 64 - 59  # 128 - 59 had the doubling been kept
    finally:
        reader._readahead_backoff(*old)


@pytest.mark.only(backend="cython", root=COMPRESSED)
@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not hasattr(resource, "RUSAGE_THREAD"),
    reason="pins a process to one CPU; counts a thread's preemptions (Linux)",
)
def test_pinned_to_one_core_a_pass_in_order_backs_off(atlas, backend, root, expected):
    """A process with one core (a forked child pinned to it, the back-off at its defaults):
    the worker can only run by preempting the reading thread (or making it wait), so the
    reader backs off and decodes the blocks inline, every example exact."""
    reader = _reader_module()

    def check():
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        reader._readahead_backoff()  # the defaults, not the suite's
        before = info()
        for _ in range(50):  # 60 blocks a pass; a preemption is likely, not certain, per block
            ds = atlas.AtlasDataset(root)
            if [ds[i] for i in range(N)] != expected:
                return False
            if info()["backoffs"] > before["backoffs"]:
                break
        after = info()
        if after["backoffs"] == before["backoffs"] or after["skipped"] == before["skipped"]:
            raise AssertionError(f"no back-off in {50 * 60} blocks: {after}")
        return True

    pid, read = fork_check(check)
    assert child_report(pid, read) == b"ok"


@pytest.fixture(params=["idle", "busy"])
def cores(request, backend):
    """``busy``: every block taken from the C read-ahead is a sign of busy cores, so passes
    run with a back-off in force most of the time, reading ahead between back-offs."""
    if request.param == "idle":
        yield request.param
        return
    reader = _reader_module()
    old = reader._readahead_backoff(-1, None)
    yield request.param
    reader._readahead_backoff(*old)


@BUSY_CORES_ARE_COMPILED
def test_in_order_interleaved_with_random_reads(atlas, root, expected, cores):
    ds = atlas.AtlasDataset(root, cache_blocks=2)
    rng = random.Random(5)
    for i in range(N):
        assert ds[i] == expected[i]
        if i % 7 == 3:
            k = rng.randrange(N)
            assert ds[k] == expected[k]
    it = iter(ds)
    for i in range(N):
        assert next(it) == expected[i]
        if i % 11 == 0:
            k = rng.randrange(N)
            assert ds[k] == expected[k]


@BUSY_CORES_ARE_COMPILED
def test_two_passes_at_once(atlas, root, expected, cores):
    first, second = atlas.AtlasDataset(root), atlas.AtlasDataset(root)
    assert [a for pair in zip(first, second, iter(first)) for a in pair] == [
        x for x in expected for _ in range(3)
    ]
    assert [(first[i], second[i]) for i in range(N)] == [(x, x) for x in expected]


@BUSY_CORES_ARE_COMPILED
def test_threads_on_one_dataset(atlas, root, expected, cores):
    ds = atlas.AtlasDataset(root, cache_blocks=3)

    def work(k):
        rng = random.Random(k)
        for _ in range(2):
            if k % 3 == 0:
                assert list(ds) == expected
            elif k % 3 == 1:
                assert [ds[i] for i in range(N)] == expected
            else:
                for i in range(N):
                    j = i if rng.random() < 0.8 else rng.randrange(N)
                    assert ds[j] == expected[j]
            if k == 4:
                ds.close()  # under the others' passes

    assert run_threads(work, 6) == []


@BUSY_CORES_ARE_COMPILED
def test_close_during_read_ahead(atlas, backend, root, expected, cores):
    ds = atlas.AtlasDataset(root)
    it = iter(ds)
    head = [next(it) for _ in range(25)]
    ds.close()
    assert head + list(it) == expected
    got = [ds[i] for i in range(95)]
    ds.close()
    got += [ds[i] for i in range(95, N)]
    assert got == expected
    it = iter(ds)
    next(it)
    it.close()
    del it
    if backend == "cython":
        reader = _reader_module()
        ds.close()
        reader._readahead_shutdown()  # joins the worker: every job done or dropped
        state = info()
        assert state["jobs"] == 0 and state["owners"] == 0 and state["held_bytes"] == 0
        assert not state["running"]
    assert list(ds) == expected  # the worker starts again


def _mapped(path) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


@pytest.fixture(scope="module", params=["shared", "per-shard", "uncompressed"])
def big_root(request, tmp_path_factory):
    """As ``root``, with shards too large to be read into memory whole (the compiled core
    maps a data.bin of more than 16 KiB; smaller ones it copies)."""
    strategy = {"shared": 2, "per-shard": 1, "uncompressed": 0}[request.param]
    path = tmp_path_factory.mktemp("ahead-big") / "ds"
    examples = [{"i": i, "pad": random.Random(i).randbytes(400)} for i in range(N)]
    with atlas_fast.AtlasDatasetWriter(path, 200, 10, compression_strategy=strategy) as w:
        for x in examples:
            w.add_example(x)
    assert (path / "1" / "data.bin").stat().st_size > 16 << 10
    return path, examples


@pytest.mark.only(backend="cython")
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_dropped_dataset_unmaps_and_frees(atlas, backend, big_root):
    root, expected = big_root
    data = root / "1" / "data.bin"
    ds = atlas.AtlasDataset(root)
    it = iter(ds)
    assert [next(it) for _ in range(205)] == expected[:205]
    mapped = _mapped(data)
    del it, ds
    assert mapped
    _reader_module()._readahead_shutdown()
    assert not _mapped(data)
    state = info()
    assert state["jobs"] == 0 and state["owners"] == 0


def _damage_block(root, shard: int, block: int) -> None:
    """Overwrite the middle of a block's stored bytes (its size unchanged)."""
    import numpy as np

    shard_dir = root / str(shard)
    offsets = np.load(shard_dir / "index.npy").astype(np.int64)
    start, end = int(offsets[block]), int(offsets[block + 1])
    with open(shard_dir / "data.bin", "r+b") as f:
        f.seek(start + (end - start) // 2)
        f.write(b"\xff" * max(4, (end - start) // 4))


def _error_of(fn):
    try:
        fn()
    except AtlasFormatError as exc:
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("strategy", [2, 3])
def test_damaged_block_is_reported_where_it_is(atlas, tmp_path, strategy):
    root = write_dataset(tmp_path / "ds", N, 200, 10, strategy)
    _damage_block(root, 1, 7)  # examples 270..279
    bad = 270
    direct = _error_of(lambda: atlas.AtlasDataset(root)[bad])
    assert direct is not None
    ds = atlas.AtlasDataset(root)
    got = []
    it = iter(ds)
    with pytest.raises(AtlasFormatError) as caught:
        for x in it:
            got.append(x)
    assert got == [example(i) for i in range(bad)]
    assert (type(caught.value), str(caught.value)) == direct
    ds = atlas.AtlasDataset(root)
    assert [ds[i] for i in range(bad)] == [example(i) for i in range(bad)]
    assert _error_of(lambda: ds[bad]) == direct
    assert [ds[i] for i in range(bad + 10, N)] == [example(i) for i in range(bad + 10, N)]


def test_oversized_block_is_refused_as_without_read_ahead(atlas, tmp_path, monkeypatch):
    root = write_dataset(tmp_path / "ds", N, 200, 10)
    monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", "64")
    direct = _error_of(lambda: atlas.AtlasDataset(root)[0])
    assert direct is not None
    assert _error_of(lambda: list(atlas.AtlasDataset(root))) == direct
    ds = atlas.AtlasDataset(root)
    assert _error_of(lambda: [ds[i] for i in range(N)]) == direct


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_during_read_ahead(atlas, root, expected):
    """A DataLoader-like child forked while the parent's pass has blocks queued (the worker
    may be decoding one at fork time): the child reads everything exactly, the parent goes on."""
    ds = atlas.AtlasDataset(root)
    it = iter(ds)
    head = [next(it) for _ in range(15)]
    for i in range(30):  # an in-order pass has queued blocks too
        assert ds[i] == expected[i]
    pid, read = fork_check(
        lambda: (
            head + list(it) == expected
            and list(ds) == expected
            and [ds[i] for i in range(N)] == expected
        )
    )
    assert head + list(it) == expected
    report = child_report(pid, read)
    assert report == b"ok", report
    assert [ds[i] for i in range(N)] == expected


def test_safe_loading_reads_ahead_too(atlas, root, expected):
    ds = atlas.AtlasDataset(root, trusted=False)
    assert list(ds) == expected
    assert [ds[i] for i in range(N)] == expected


# -- prefetch(): the blocks a sampler reads next, decoded ahead ------------------------------


def _ahead_counter(backend, monkeypatch):
    """A function returning how many blocks were decoded ahead for prefetch() so far: the C
    read-ahead's jobs taken, or the Python core's pool jobs (a private name: the pool is not
    observable otherwise)."""
    if backend == "cython":
        return lambda: info()["taken"]
    calls = []
    real = atlas_fast._core._pool.decode_on_pool
    monkeypatch.setattr(
        atlas_fast._core._reader_py, "decode_on_pool", lambda r, b: calls.append(b) or real(r, b)
    )
    return lambda: len(calls)


def _shuffled_windows(rng, blocks: int, per_window: int) -> list:
    """Windows of ``per_window`` shuffled blocks of 10, each window's indices shuffled."""
    order = list(range(blocks))
    rng.shuffle(order)
    windows = []
    for k in range(0, blocks, per_window):
        indices = [b * 10 + j for b in order[k : k + per_window] for j in range(10)]
        rng.shuffle(indices)
        windows.append(indices)
    return windows


@pytest.mark.parametrize("where", ["dataset", "shard"])
def test_prefetch_decodes_the_next_window_ahead(atlas, backend, root, expected, where, monkeypatch):
    """A sampler names the next window's blocks while reading this one, in batches and in
    single reads: every example exact, and the named blocks decoded ahead (when compressed:
    uncompressed blocks are read from the file, prefetch() says it is of no use)."""
    ahead = _ahead_counter(backend, monkeypatch)
    ds = atlas.AtlasDataset(root)
    reader, base = (ds, 0) if where == "dataset" else (ds.shards[1], 200)
    rng = random.Random(7)
    windows = _shuffled_windows(rng, len(reader) // 10, 3)
    compressed = ds.shards[0].metadata.compression_strategy != CompressionStrategy.NO_COMPRESSION
    before = ahead()
    answers = [reader.prefetch(windows[0][::10])]
    for k, window in enumerate(windows):
        if k + 1 < len(windows):
            answers.append(reader.prefetch(windows[k + 1]))  # every index of each block
        half = len(window) // 2
        assert reader.__getitems__(window[:half]) == [expected[base + i] for i in window[:half]]
        assert [reader[i] for i in window[half:]] == [expected[base + i] for i in window[half:]]
    assert list(reader) == expected[base : base + len(reader)]
    if compressed:
        assert all(answers)
        assert ahead() - before >= len(reader) // 10 - 3  # the first window's may be read first
    else:
        assert ahead() == before
        assert answers[0] is True and answers[-1] is False


def test_prefetch_checks_indices_and_changes_no_result(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    with pytest.raises(IndexError):
        ds.prefetch([0, N])
    with pytest.raises(TypeError):
        ds.prefetch(["a"])
    with pytest.raises(IndexError):
        ds.shards[0].prefetch([200])
    ds.prefetch([N - 1, -1, 0, 5, 5])  # negative, repeated: as ds[i] takes them
    ds.prefetch([])
    assert ds.__getitems__([599, 0, 5, 300]) == [expected[i] for i in (599, 0, 5, 300)]
    ds.prefetch(list(range(0, N, 10)))  # more blocks than the read-ahead holds
    assert [ds[i] for i in range(N)] == expected
    ds.prefetch([100, 110])
    ds.close()  # what was named is dropped
    assert ds[100] == expected[100] and ds.__getitems__([110, 111]) == expected[110:112]


def test_prefetch_of_a_damaged_block_reports_it_where_it_is(atlas, tmp_path):
    root = write_dataset(tmp_path / "ds", N, 200, 10)
    _damage_block(root, 1, 7)  # examples 270..279
    direct = _error_of(lambda: atlas.AtlasDataset(root)[275])
    assert direct is not None
    ds = atlas.AtlasDataset(root)
    ds.prefetch([260, 270, 280])
    assert ds.__getitems__([261, 262]) == [example(261), example(262)]
    assert _error_of(lambda: ds.__getitems__([281, 275])) == direct
    ds.prefetch([270])
    assert _error_of(lambda: ds[272]) == direct
    assert ds[285] == example(285)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_prefetch_named_before_a_fork_is_not_acted_on_in_the_child(
    atlas, backend, root, expected, monkeypatch
):
    """A DataLoader's sampler names blocks in the parent, whose dataset the workers read: the
    hints stay in the parent (never acted on there, it reads nothing), and a forked copy
    ignores them."""
    ahead = _ahead_counter(backend, monkeypatch)
    ds = atlas.AtlasDataset(root)
    ds[0]  # opened
    ds.prefetch([300, 310, 320])

    def child():
        before = ahead()
        ok = ds.__getitems__([301, 311, 321]) == [expected[i] for i in (301, 311, 321)]
        return ok and ahead() == before

    before = ahead()
    pid, read = fork_check(child)
    report = child_report(pid, read)
    assert report == b"ok", report
    assert ahead() == before  # the parent read nothing since
    assert ds[300] == expected[300]


def test_sampler_epoch_reads_the_next_window_ahead(atlas, backend, root, expected, monkeypatch):
    """BlockShuffleSampler read in this process names each next window's blocks: decoded
    ahead (compressed blocks); read by DataLoader workers, the parent decodes nothing."""
    from atlas_fast import BlockShuffleSampler

    ahead = _ahead_counter(backend, monkeypatch)
    ds = atlas.AtlasDataset(root)
    compressed = ds.shards[0].metadata.compression_strategy != CompressionStrategy.NO_COMPRESSION
    sampler = BlockShuffleSampler(ds, window_blocks=4, seed=2)
    order = sampler.epoch_indices().tolist()
    before = ahead()
    batches = [order[k : k + 16] for k in range(0, N, 16)]
    assert [x for batch in batches for x in ds.__getitems__(batch)] == [expected[i] for i in order]
    assert ahead() == before  # epoch_indices() names nothing
    ds.close()  # nothing cached
    got = []
    it = iter(sampler)
    for batch in batches:
        got += ds.__getitems__([next(it) for _ in batch])
    assert got == [expected[i] for i in order]
    assert (ahead() - before >= N // 10 - 8) if compressed else ahead() == before
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, sampler=sampler, num_workers=2, collate_fn=list
    )
    ds.close()
    before = ahead()
    assert [x for batch in loader for x in batch] == [expected[i] for i in order]
    assert ahead() == before


def test_exit_with_decoded_jobs_of_readers_kept_by_a_cycle(backend, tmp_path):
    """Readers kept alive by a reference cycle are freed by the interpreter's last collection,
    after the modules' dicts were cleared, and cancel their read-ahead jobs then: the process
    exits (it once hung there, a Python global gone under the read-ahead's lock)."""
    import subprocess
    import sys

    root = write_dataset(tmp_path / "ds", N, 200, 10)
    code = (
        "import time, atlas_fast, atlas_fast._python\n"
        f"module = atlas_fast._python if {backend!r} == 'python' else atlas_fast.atlas\n"
        "try:\n"
        "    import atlas_fast._reader as reader\n"
        "    reader._readahead_min_bytes(0)\n"
        "except ImportError:\n"
        "    pass\n"
        f"ds = module.AtlasDataset({str(root)!r})\n"
        "for i in range(35):\n"
        "    ds[i]\n"
        "ds.prefetch(list(range(300, 600, 10)))\n"
        "ds[100]\n"
        "cycle = [ds]\n"
        "cycle.append(cycle)\n"
        "del ds\n"
        "time.sleep(0.3)\n"
        "print('read')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0 and out.stdout == "read\n", out.stderr
    assert "Error" not in out.stderr, out.stderr
