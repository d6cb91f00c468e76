"""Parallel compression in the writers: the same bytes as one thread, bounded memory, errors
raised where the caller can see them."""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard

import atlas_fast._backend
import atlas_fast._writing.pipeline as pipeline
import atlas_fast.writer
from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter, CompressionStrategy
from atlas_fast._core._compress_py import IN_FLIGHT_PER_WORKER, PoolCompressor
from atlas_fast.writer import default_workers


def examples(n):
    words = ["atlas", "shard", "block", "zstd", "pickle", "index", "the", "of", "data"]
    return [
        {"id": i, "text": " ".join(words[(i * 7 + k) % 9] for k in range(i % 97)), "n": i * i}
        for i in range(n)
    ]


def files_of(root):
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def write_dataset(root, strategy, workers, n=230, checksums=True):
    with AtlasDatasetWriter(
        root, 40, 4, compression_strategy=strategy, checksums=checksums, workers=workers
    ) as w:
        for x in examples(n):
            w.add_example(x)
    return files_of(root)


@pytest.mark.parametrize("strategy", list(CompressionStrategy))
def test_every_file_is_byte_identical_to_one_thread(tmp_path, strategy):
    one = write_dataset(tmp_path / "w1", strategy, 1)
    assert any(name.endswith("checksums.npy") for name in one)
    if strategy in (2, 3):
        assert any(name.endswith("zstd_dict.bin") for name in one)
    for workers in (2, 3, 5):
        assert write_dataset(tmp_path / f"w{workers}", strategy, workers) == one


@pytest.mark.parametrize("strategy", [1, 2, 3])
def test_shard_writer_is_byte_identical_to_one_thread(tmp_path, strategy):
    zdict = None
    if strategy == 2:
        zdict = zstandard.train_dictionary(2048, [repr(x).encode() for x in examples(300)])

    def write(path, workers):
        with AtlasDatasetShardWriter(
            path, 3, strategy, compression_dict=zdict, checksums=True, workers=workers
        ) as w:
            for x in examples(100):
                w.add_example(x)
        return files_of(path)

    assert write(tmp_path / "a", 4) == write(tmp_path / "b", 1)


def test_workers_argument(tmp_path):
    assert 1 <= default_workers() <= 8
    w = AtlasDatasetShardWriter(tmp_path / "s", 4, 1)
    assert w.workers == default_workers()
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            AtlasDatasetShardWriter(tmp_path / f"x{bad}", 4, 1, workers=bad)
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            AtlasDatasetWriter(tmp_path / f"y{bad}", 4, 1, workers=bad)


def test_workers_is_passed_to_shard_writers_only_when_given(tmp_path, monkeypatch):
    seen = []
    real = atlas_fast.writer.AtlasDatasetShardWriter

    def factory(**kwargs):
        seen.append(kwargs.get("workers", "absent"))
        return real(**kwargs)

    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", factory)
    with AtlasDatasetWriter(tmp_path / "a", 2, 1, compression_strategy=1) as w:
        for i in range(3):
            w.add_example(i)
    with AtlasDatasetWriter(tmp_path / "b", 2, 1, compression_strategy=1, workers=3) as w:
        for i in range(3):
            w.add_example(i)
    assert seen == ["absent", "absent", 3, 3]


class RecordingCompressor:
    """Wraps a real ZstdCompressor; records the threads it runs on and any overlapping use,
    and fails on a block that holds ``poison``."""

    poison = b"\x00POISON\x00"
    lock = threading.Lock()
    threads: set = set()
    overlaps = 0

    def __init__(self, **kwargs):
        self.real = _REAL_COMPRESSOR(**kwargs)
        self.busy = False

    def compress(self, data):
        cls = RecordingCompressor
        with cls.lock:
            cls.overlaps += self.busy
            self.busy = True
            cls.threads.add(threading.current_thread().name)
        try:
            if cls.poison in data:
                raise zstandard.ZstdError("injected failure")
            return self.real.compress(data)
        finally:
            self.busy = False


_REAL_COMPRESSOR = zstandard.ZstdCompressor


def use_python_zstandard(monkeypatch):
    """Compress through python-zstandard (the pure-Python backend's block compressor) on
    either backend, so that a patched ``zstandard.ZstdCompressor`` sees every block; the
    compiled one's is pinned by tests/test_block_compressor.py."""
    monkeypatch.setattr(atlas_fast._backend.compressor, "block_compressor", PoolCompressor)


@pytest.fixture
def recording(monkeypatch):
    RecordingCompressor.threads = set()
    RecordingCompressor.overlaps = 0
    monkeypatch.setattr(zstandard, "ZstdCompressor", RecordingCompressor)
    use_python_zstandard(monkeypatch)
    return RecordingCompressor


@pytest.mark.parametrize("strategy", [1, 3])
def test_blocks_are_compressed_on_the_pool_one_compressor_per_task(tmp_path, recording, strategy):
    with AtlasDatasetShardWriter(tmp_path / "s", 2, strategy, workers=3) as w:
        for x in examples(200):
            w.add_example(x)
    assert recording.threads and all(t.startswith("atlas-fast-zstd") for t in recording.threads)
    assert recording.overlaps == 0


def test_workers_1_compresses_on_the_calling_thread(tmp_path, recording):
    with AtlasDatasetShardWriter(tmp_path / "s", 2, 1, workers=1) as w:
        for x in examples(50):
            w.add_example(x)
    assert recording.threads == {threading.current_thread().name}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_block_is_reported_on_the_calling_thread(tmp_path, recording, workers):
    root = tmp_path / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "incomplete": pinned elsewhere
        with (
            pytest.raises(
                zstandard.ZstdError,
                match=r"^injected failure\natlas_fast: \S*ds/1: compressing block 2$",
            ),
            AtlasDatasetWriter(root, 20, 2, compression_strategy=1, workers=workers) as w,
        ):
            for i in range(100):
                w.add_example(RecordingCompressor.poison if i == 25 else i)
    assert not (root / "meta.json").exists()


def test_a_failed_shard_on_another_thread_is_reported(tmp_path, recording):
    """Strategy 3 finishes full shards on other threads; their errors reach the caller."""
    root = tmp_path / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(
            zstandard.ZstdError,
            match=r"^injected failure\natlas_fast: \S*ds/0: compressing block 3$",
        ):
            with AtlasDatasetWriter(root, 20, 2, compression_strategy=3, workers=2) as w:
                for i in range(200):
                    w.add_example(RecordingCompressor.poison if i == 7 else f"example {i}")
    assert not (root / "meta.json").exists()


class GatedCompressor:
    """A compressor that compresses nothing until the writer's caller has had a second to run
    ahead: the examples it could add meanwhile are the blocks the writer holds at most."""

    lock = threading.Lock()

    def __init__(self, **kwargs):
        self.real = _REAL_COMPRESSOR(**kwargs)

    def compress(self, data):
        cls = GatedCompressor
        # The timeout only ends the wait; what is asserted is a count, not a duration.
        if not cls.gate.wait(1.0):
            with cls.lock:
                if not cls.gate.is_set():
                    cls.added_when_opened = cls.added
                    cls.gate.set()
        return self.real.compress(data)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_peak_memory_holds_a_fixed_number_of_blocks(tmp_path, monkeypatch, workers):
    """While no block can be compressed, the caller can add only a fixed number of blocks
    (2 per worker in flight, plus the one it is adding): memory is bounded whatever the
    dataset's size, and workers=1 holds none."""
    monkeypatch.setattr(zstandard, "ZstdCompressor", GatedCompressor)
    use_python_zstandard(monkeypatch)
    GatedCompressor.gate = threading.Event()
    GatedCompressor.added = 0
    with AtlasDatasetWriter(tmp_path / "ds", 1000, 1, compression_strategy=1, workers=workers) as w:
        for i in range(300):
            GatedCompressor.added += 1
            w.add_example(i)
    in_flight = IN_FLIGHT_PER_WORKER * workers if workers > 1 else 0
    assert GatedCompressor.added_when_opened == in_flight + 1


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("strategy", [1, 2, 3])
def test_an_example_that_does_not_pickle_names_the_shard_and_block(tmp_path, strategy, workers):
    """Strategy 2 with workers=2 pickles it while the first shard trains (16 blocks): the
    error names the example, its shard and block, and nothing is left (no warning either)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with (
            pytest.raises(atlas_fast.UnpicklableExampleError) as info,
            AtlasDatasetWriter(
                tmp_path / "ds", 32, 2, compression_strategy=strategy, workers=workers
            ) as w,
        ):
            for i in range(50):
                w.add_example(threading.Lock() if i == 35 else f"example {i}")
    assert str(info.value).startswith(f"{tmp_path / 'ds'}: example 35 (shard 1, block 1) ")
    assert type(info.value.__cause__) is TypeError
    assert not (tmp_path / "ds").exists()


class GatedTraining:
    """Wraps the shard writer's dictionary training: it starts only once the test opens the
    gate, or once a second has passed without that (the examples the caller could add
    meanwhile are then recorded: what the writer holds at most while training waits)."""

    def __init__(self, monkeypatch, fail=False):
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.added = 0
        self.added_when_opened = None
        self.threads = []
        self.fail = fail
        real = AtlasDatasetShardWriter._train_dictionary

        def train(shard):
            # The timeout only ends the wait; what is asserted is a count, not a duration.
            if not self.gate.wait(1.0):
                with self.lock:
                    if not self.gate.is_set():
                        self.added_when_opened = self.added
                        self.gate.set()
            self.threads.append((shard.path.name, threading.current_thread().name))
            if self.fail:
                raise RuntimeError("injected training failure")
            return real(shard)

        monkeypatch.setattr(AtlasDatasetShardWriter, "_train_dictionary", train)


class CloseThreads:
    """Records which thread closes each shard (by its directory name)."""

    def __init__(self, monkeypatch):
        self.threads = {}
        real = AtlasDatasetShardWriter.close

        def close(shard):
            self.threads.setdefault(shard.path.name, threading.current_thread().name)
            real(shard)

        monkeypatch.setattr(AtlasDatasetShardWriter, "close", close)


def test_strategy_2_trains_here_then_finishes_shards_on_the_pool(tmp_path, monkeypatch):
    """The first shard, whose dictionary the next shard writers need, trains and closes on
    the calling thread; the full shards after it close on the pool; the files are those of
    workers=1."""
    one = write_dataset(tmp_path / "w1", 2, 1)
    training = GatedTraining(monkeypatch)
    training.gate.set()
    closes = CloseThreads(monkeypatch)
    root = tmp_path / "w2"
    with AtlasDatasetWriter(root, 40, 4, checksums=True, workers=2) as w:
        for x in examples(230):
            w.add_example(x)
    here = threading.current_thread().name
    assert training.threads == [("0", here)]
    assert closes.threads["0"] == here and closes.threads["5"] == here  # the last: at close()
    # Shard 1 finds the pool idle; 2-4 go to it too unless both of its threads are busy.
    assert closes.threads["1"].startswith("atlas-fast-shard")
    assert files_of(root) == one


@pytest.mark.parametrize("workers", [2, 3])
def test_strategy_3_trains_on_the_pool_and_holds_workers_plus_one_shards(
    tmp_path, monkeypatch, workers
):
    """The calling thread trains no full shard; while every pool thread trains, it fills one
    more shard and then waits."""
    training = GatedTraining(monkeypatch)
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, 40, 4, compression_strategy=3, workers=workers) as w:
        for x in examples(330):
            training.added += 1
            w.add_example(x)
    assert training.added_when_opened == (workers + 1) * 40 + 1
    full = [thread for name, thread in training.threads if name != "8"]  # 8: the last shard
    assert len(full) == 8 and all(t.startswith("atlas-fast-shard") for t in full)
    assert files_of(root) == write_dataset(tmp_path / "w1", 3, 1, n=330, checksums=False)


@pytest.mark.parametrize("strategy", [2, 3])
def test_a_failed_training_is_reported(tmp_path, monkeypatch, strategy):
    """Strategy 3 trains on the pool: the error is noted as the shard's; strategy 2's first
    shard trains on the calling thread: its error is raised as it is."""
    GatedTraining(monkeypatch, fail=True).gate.set()
    root = tmp_path / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with (
            pytest.raises(RuntimeError) as info,
            AtlasDatasetWriter(root, 40, 4, compression_strategy=strategy, workers=2) as w,
        ):
            for x in examples(230):
                w.add_example(x)
    assert str(info.value) == "injected training failure"
    notes = getattr(info.value, "__notes__", [])
    if strategy == 3:
        assert notes == [f"atlas_fast: {root / '0'}: finishing the shard"]
    else:
        assert notes == []
    assert not (root / "meta.json").exists()


class ClosedCompressors:
    """Records every block compressor the shard writers make (the backend's, wrapped) and
    whether it was closed: a compressor with workers > 1 runs threads until it is (native
    ones in the compiled backend, which ``threading`` does not list)."""

    def __init__(self, monkeypatch):
        self.made = []
        real = atlas_fast._backend.compressor.block_compressor

        def make(*args, **kwargs):
            compressor = Recorded(real(*args, **kwargs))
            self.made.append(compressor)
            return compressor

        monkeypatch.setattr(atlas_fast._backend.compressor, "block_compressor", make)

    def open(self):
        return [c for c in self.made if not c.closed]


class Recorded:
    def __init__(self, real):
        self.real = real
        self.closed = False

    def submit(self, block):
        return self.real.submit(block)

    def finish(self):
        return self.real.finish()

    def close(self):
        self.closed = True
        self.real.close()


def spans(numbers) -> str:
    """``[0, 1, 2, 5]`` as the warning lists shards: ``"shards 0-2, 5"`` (``"shard 3"``)."""
    out = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    listed = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)
    return ("shard " if len(numbers) == 1 else "shards ") + listed


def no_thread_left(before, compressors) -> bool:
    """No Python thread started since ``before`` is alive, and every block compressor made
    was closed."""
    assert [t.name for t in set(threading.enumerate()) - before] == []
    assert compressors.open() == []
    return True


def shard_dirs(root):
    return {int(p.name): sorted(q.name for q in p.iterdir()) for p in root.iterdir() if p.is_dir()}


@pytest.mark.parametrize("strategy", list(CompressionStrategy))
def test_a_with_block_that_raises_after_many_examples(atlas, tmp_path, monkeypatch, strategy):
    """workers=2: the with block's exception is the one raised; no root meta.json; every
    shard directory is either a whole shard (its examples readable) or has no meta.json, as
    the warning lists them; no thread is left running."""
    compressors = ClosedCompressors(monkeypatch)
    before = set(threading.enumerate())
    root = tmp_path / "ds"
    boom = KeyError("boom")
    data = examples(1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError) as info:
            with AtlasDatasetWriter(root, 40, 4, compression_strategy=strategy, workers=2) as w:
                for x in data:
                    w.add_example(x)
                raise boom
    assert info.value is boom
    assert no_thread_left(before, compressors)
    # (strategy 0 has no compressor: its small blocks go through data.bin's buffer)
    assert bool(compressors.made) == (strategy != 0)
    assert not (root / "meta.json").exists()
    [warning] = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert warning.startswith(f"{root}: the dataset is incomplete and has no meta.json: the with")
    finished = sorted(n for n, names in shard_dirs(root).items() if "meta.json" in names)
    unfinished = sorted(n for n, names in shard_dirs(root).items() if "meta.json" not in names)
    assert set(finished) | set(unfinished) <= set(range(25))
    assert 24 in unfinished  # the last shard was being filled
    if unfinished:
        assert f"{spans(unfinished)} unfinished (no meta.json);" in warning
    its = "its" if len(finished) == 1 else "their"
    assert finished and f"{spans(finished)} finished (with {its} meta.json)" in warning
    # Strategy 2's dictionary, once the first shard finished.
    zdict = root / "zstd_dict.bin"
    zdict = zdict.read_bytes() if zdict.exists() else None
    for n in finished:
        shard = atlas.AtlasDatasetShard(root / str(n), compression_dict_bytes=zdict)
        assert list(shard) == data[40 * n : 40 * n + 40]


class ReleasingPool(ThreadPoolExecutor):
    """The dataset writer's pool, whose shutdown opens ``release`` before it waits for the
    threads: at that moment the writer has already cancelled what had not started."""

    release = threading.Event()

    def shutdown(self, *args, **kwargs):
        ReleasingPool.release.set()
        super().shutdown(*args, **kwargs)


def test_a_with_block_that_raises_waits_for_the_shards_on_the_pool(tmp_path, monkeypatch):
    """Strategy 1, workers=2: shards 0 and 1 are closed on the pool's two threads (held
    until the writer waits for them), shard 2 on the calling thread (every pool thread
    busy), shard 3 is being filled when the with block raises: 0-2 are finished, 3 is
    abandoned, no thread is left. Patches the pipeline's ``ThreadPoolExecutor`` (private) to
    know when the writer waits for its threads."""
    compressors = ClosedCompressors(monkeypatch)
    before = set(threading.enumerate())
    data = [f"example {i:05d}" for i in range(40 * 3 + 20)]
    monkeypatch.setattr(pipeline, "ThreadPoolExecutor", ReleasingPool)
    ReleasingPool.release = threading.Event()
    entered = []
    condition = threading.Condition()
    real_close = AtlasDatasetShardWriter.close

    def close(shard):
        if threading.current_thread().name.startswith("atlas-fast"):
            with condition:
                entered.append(shard.path.name)
                condition.notify_all()
            # The timeout only ends the wait should the writer never release it.
            ReleasingPool.release.wait(60)
        real_close(shard)

    monkeypatch.setattr(AtlasDatasetShardWriter, "close", close)
    root = tmp_path / "ds"
    boom = KeyError("boom")
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(KeyError) as info:
        with AtlasDatasetWriter(root, 40, 4, 1, checksums=True, workers=2) as w:
            for x in data:
                w.add_example(x)
            with condition:
                assert condition.wait_for(lambda: len(entered) == 2, timeout=60)
            assert not ReleasingPool.release.is_set()
            raise boom
    assert info.value is boom
    assert no_thread_left(before, compressors)
    assert sorted(entered) == ["0", "1"]
    assert not (root / "meta.json").exists()
    dirs = shard_dirs(root)
    assert sorted(dirs) == [0, 1, 2, 3]
    for n in (0, 1, 2):
        assert "meta.json" in dirs[n]
    assert "meta.json" not in dirs[3]
    [warning] = [str(c.message) for c in caught]
    assert warning == (
        f"{root}: the dataset is incomplete and has no meta.json: the with block raised "
        "KeyError. Shard directories left in it for inspection: shards 0-2 finished (with "
        "their meta.json), shard 3 unfinished (no meta.json); remove the directory "
        "before writing there again."
    )


def test_errors_met_while_abandoning_are_noted_not_raised(tmp_path, monkeypatch):
    """Strategy 3, workers=2: shards 0 and 1 train on the pool and fail once the writer,
    abandoning the dataset, waits for them. The with block's exception stays the one raised;
    their errors are in the warning and noted on it (Python 3.11+). Patches the private
    ``_train_dictionary`` (the shard writer's training) and ``ThreadPoolExecutor``."""
    monkeypatch.setattr(pipeline, "ThreadPoolExecutor", ReleasingPool)
    ReleasingPool.release = threading.Event()
    entered = []
    condition = threading.Condition()

    def train(shard):
        with condition:
            entered.append(shard.path.name)
            condition.notify_all()
        ReleasingPool.release.wait(60)  # the timeout only ends the wait
        raise RuntimeError(f"injected training failure in {shard.path}")

    monkeypatch.setattr(AtlasDatasetShardWriter, "_train_dictionary", train)
    root = tmp_path / "ds"
    boom = KeyError("boom")
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(KeyError) as info:
        with AtlasDatasetWriter(root, 40, 4, compression_strategy=3, workers=2) as w:
            for x in examples(81):
                w.add_example(x)
            with condition:
                assert condition.wait_for(lambda: len(entered) == 2, timeout=60)
            raise boom
    assert info.value is boom
    failures = [
        f"RuntimeError: injected training failure in {root / n} ({root / n}: finishing the shard)"
        for n in ("0", "1")
    ]
    [warning] = [str(c.message) for c in caught]
    assert warning.endswith(
        "shards 0-2 unfinished (no meta.json); remove the directory before writing there again. "
        "Abandoning it also failed: " + "; ".join(failures)
    )
    if hasattr(boom, "add_note"):
        assert boom.__notes__ == [f"atlas_fast: abandoning {root}: {f}" for f in failures]
    assert not (root / "meta.json").exists()
