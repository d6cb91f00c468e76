"""Test helpers shared by the suite (imported as ``helpers``; tests/ is on sys.path)."""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from atlas_fast import InvalidArgumentError, InvalidArgumentTypeError

GOLDEN = Path(__file__).resolve().parent / "golden"
# An extra source of reference-written datasets, laid out as tests/golden (each case a folder
# holding dataset/ and expected.pkl): its cases run as "extra:<name>" beside the golden ones.
EXTRA_FIXTURES = os.environ.get("ATLAS_FAST_FIXTURES") or None
_EXTRA = "extra:"


def _cases_in(folder: Path) -> list:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "dataset").is_dir())


def fixture_cases() -> list:
    """The reference-written datasets: tests/golden's cases, then ATLAS_FAST_FIXTURES's."""
    cases = _cases_in(GOLDEN)
    if EXTRA_FIXTURES is not None:
        extra = _cases_in(Path(EXTRA_FIXTURES))
        if not extra:
            raise RuntimeError(f"ATLAS_FAST_FIXTURES={EXTRA_FIXTURES} holds no <case>/dataset")
        cases += [_EXTRA + name for name in extra]
    return cases


def case_folder(case: str) -> Path:
    """The folder of a case of ``fixture_cases()``: its ``dataset`` and ``expected.pkl``."""
    if case.startswith(_EXTRA):
        return Path(EXTRA_FIXTURES) / case[len(_EXTRA) :]
    return GOLDEN / case


def case_dataset(case: str) -> Path:
    """The reference-written dataset of a case of ``fixture_cases()``."""
    return case_folder(case) / "dataset"


def load_expected(case: str) -> list:
    """The examples the dataset of ``case`` holds, in order."""
    with open(case_folder(case) / "expected.pkl", "rb") as f:
        return pickle.load(f)


def same(a, b) -> bool:
    """Deep equality that also compares types, and numpy arrays by dtype, shape and values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def assert_same(a, b, where="") -> None:
    assert same(a, b), f"{where}: {a!r:.200} != {b!r:.200}"


def run_threads(target, count: int) -> list:
    """Run ``target(k)`` on ``count`` threads at once; the exceptions they raised."""
    import threading

    errors = []

    def run(k):
        try:
            target(k)
        except Exception as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def open_fd_count() -> int:
    """Open file descriptors of this process (Linux /proc; macOS /dev/fd)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(folder):
            return len(os.listdir(folder))
    pytest.skip("cannot count open file descriptors on this platform")


def make_examples(n: int, seed: int = 0, big: int = 0) -> list:
    """Examples of several kinds (ids, texts of varied length, a float32 array in every third);
    ``big``: bytes of incompressible payload in each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        example = {"id": i, "text": f"example {i} " * int(rng.integers(1, 30))}
        if i % 3 == 0:
            example["vec"] = rng.standard_normal(int(rng.integers(0, 8))).astype(np.float32)
        if big:
            example["blob"] = rng.bytes(big)
        out.append(example)
    return out


def write_dataset(path, examples, **options) -> None:
    """``examples`` written by atlas_fast's AtlasDatasetWriter at ``path`` (a path or URL)."""
    from atlas_fast import AtlasDatasetWriter

    with AtlasDatasetWriter(path, **options) as writer:
        for example in examples:
            writer.add_example(example)


def append_dataset(path, examples, **options) -> None:
    """``examples`` appended to the dataset at ``path`` (``AtlasDatasetWriter(append=True)``),
    20 per shard and 4 per block unless ``options`` say otherwise."""
    options.setdefault("shard_size", 20)
    options.setdefault("block_size", 4)
    write_dataset(path, examples, append=True, **options)


def reference_read(root) -> list:
    """Read a dataset the way torch_atlas_ds 0.1.0 does, independently of atlas_fast.

    Sorted sub-directories, each shard's own meta.json, index.npy through numpy, blocks
    decompressed one-shot by python-zstandard (which needs the frame's content size), the
    shared dictionary from the root for strategy 2. What this reads, the reference reads.
    """
    examples = []
    for block in reference_blocks(root):
        examples.extend(pickle.loads(block))
    return examples


def _reference_wheel() -> Path | None:
    """The reference's wheel in ``shared/peers`` of an ancestor of the checkout (the team's
    machines), if any."""
    for parent in Path(__file__).resolve().parents:
        wheel = parent / "shared" / "peers" / "torch_atlas_ds-0.1.0-py3-none-any.whl"
        if wheel.is_file():
            return wheel
    return None


REFERENCE_WHEEL = _reference_wheel()


def reference_examples(root) -> list:
    """Every example of ``root`` as the reference package reads it.

    The package itself where it is installed, or its wheel beside the checkout
    (../shared/peers, put on sys.path) where torch, which it imports, is installed; the
    suite's independent reference algorithm (``reference_read``) elsewhere.
    """
    import importlib.util
    import sys

    try:
        import torch_atlas_ds
    except ImportError:
        if REFERENCE_WHEEL is None or not importlib.util.find_spec("torch"):
            return reference_read(root)
        sys.path.append(str(REFERENCE_WHEEL))  # a pure-Python wheel imports as a zip
        import torch_atlas_ds
    ds = torch_atlas_ds.AtlasDataset(str(root))
    return [ds[i] for i in range(len(ds))]


def reference_blocks(root):
    """Each block of a dataset, decompressed (pickled lists), as reference_read finds them."""
    import json

    import zstandard

    root = Path(root)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["version"] == 1
    shared = None
    if meta["compression_strategy"] == 2:
        shared = zstandard.ZstdCompressionDict((root / "zstd_dict.bin").read_bytes())
    for shard in sorted(p for p in root.iterdir() if p.is_dir()):
        smeta = json.loads((shard / "meta.json").read_text())
        assert smeta["version"] == 1
        if smeta["stored_examples"] == 0:
            continue
        index = np.load(shard / "index.npy", mmap_mode="r")
        data = (shard / "data.bin").read_bytes()
        strategy = smeta["compression_strategy"]
        if strategy == 3:
            zdict = zstandard.ZstdCompressionDict((shard / "zstd_dict.bin").read_bytes())
            dctx = zstandard.ZstdDecompressor(dict_data=zdict)
        elif strategy == 2:
            dctx = zstandard.ZstdDecompressor(dict_data=shared)
        else:
            dctx = zstandard.ZstdDecompressor()
        for b in range(len(index) - 1):
            block = data[int(index[b]) : int(index[b + 1])]
            yield dctx.decompress(block) if strategy != 0 else block


def fork_check(check) -> tuple:
    """Fork; the child runs ``check()`` (true: all is well; bytes: its own report) and writes
    ``b"ok"``, ``b"wrong examples"``, those bytes or the exception it raised to a pipe, then
    exits. Returns ``(pid, read end)`` for ``child_report``; the parent goes on meanwhile."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        status = 1
        try:
            os.close(read)
            out = check()
            os.write(write, out if isinstance(out, bytes) else b"ok" if out else b"wrong examples")
            status = 0
        except BaseException as exc:
            os.write(write, repr(exc).encode()[:500])
        finally:
            os._exit(status)
    os.close(write)
    return pid, read


def child_report(pid: int, read: int, timeout: float = 60.0) -> bytes:
    """Wait for the forked child ``pid`` (killed, and the test failed, if it hangs past
    ``timeout`` seconds: a lock held at fork time, say), then return what it wrote to the
    pipe whose read end is ``read``."""
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (a lock held at fork time?)")
        time.sleep(0.02)
    with os.fdopen(read, "rb") as f:
        return f.read()


def run_capped(task, headroom: int = 3 << 30, timeout: float = 300.0):
    """``task()``'s result (pickled back), run in a forked child whose address space is capped
    ``headroom`` bytes above what it has mapped: a reader that lets a damaged block ask for
    gigabytes gets a MemoryError there instead of taking the machine's memory. Fails the test
    with the child's traceback if ``task`` raised; skips where there is no fork or RLIMIT_AS."""
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/statm"):
        pytest.skip("needs fork and /proc (RLIMIT_AS over the mapped size)")

    def capped():
        import resource
        import traceback

        with open("/proc/self/statm") as f:
            limit = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            return pickle.dumps(("ok", task()))
        except BaseException:
            return pickle.dumps(("raised", traceback.format_exc()[-4000:]))

    report = child_report(*fork_check(capped), timeout)
    try:
        kind, value = pickle.loads(report)
    except Exception:
        kind, value = "died", report.decode(errors="replace")
    if kind != "ok":
        pytest.fail(f"in the capped child ({kind}):\n{value}")
    return value


def memory_errors(exc) -> list:
    """The MemoryErrors in ``exc``'s chain (its causes and contexts)."""
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


# Bad writer options: option, bad value, the error's type and its message, the same
# everywhere (the writers, WriterOptions, convert, the CLI, atlas_fast.ray).
BAD_WRITER_OPTIONS = [
    ("shard_size", 0, InvalidArgumentError, "shard_size must be a positive integer, not 0"),
    ("shard_size", -3, InvalidArgumentError, "shard_size must be a positive integer, not -3"),
    ("shard_size", 2.5, InvalidArgumentTypeError, "shard_size must be a positive integer, not 2.5"),
    ("block_size", 0, InvalidArgumentError, "block_size must be a positive integer, not 0"),
    ("block_size", "4", InvalidArgumentTypeError, "block_size must be a positive integer, not '4'"),
    (
        "block_size",
        True,
        InvalidArgumentTypeError,
        "block_size must be a positive integer, not True",
    ),
    (
        "compression_strategy",
        4,
        InvalidArgumentError,
        "compression_strategy must be 0, 1, 2 or 3 (a CompressionStrategy), not 4",
    ),
    (
        "compression_level",
        23,
        InvalidArgumentError,
        "compression_level must be an integer of at most 22, not 23",
    ),
    (
        "compression_level",
        None,
        InvalidArgumentTypeError,
        "compression_level must be an integer of at most 22, not None",
    ),
    (
        "compression_dict_size",
        1.5,
        InvalidArgumentError,
        "compression_dict_size must be a number within [0, 1], not 1.5",
    ),
    (
        "compression_dict_size",
        -0.1,
        InvalidArgumentError,
        "compression_dict_size must be a number within [0, 1], not -0.1",
    ),
    (
        "compression_dict_size",
        float("nan"),
        InvalidArgumentError,
        "compression_dict_size must be a number within [0, 1], not nan",
    ),
    (
        "compression_dict_size",
        "0.1",
        InvalidArgumentTypeError,
        "compression_dict_size must be a number within [0, 1], not '0.1'",
    ),
    ("workers", 0, InvalidArgumentError, "workers must be a positive integer or None, not 0"),
    (
        "workers",
        1.0,
        InvalidArgumentTypeError,
        "workers must be a positive integer or None, not 1.0",
    ),
]


def straggling_datasink(signals: Path, heed_failure: bool = True, **kwargs):
    """An AtlasDatasink (``kwargs``) of two write tasks, for a job that fails while a task
    is still busy. Task 0 is the straggler: about to write its shard (local: to make its
    directory; to a URL: to write, then upload it under its final name), it stalls, and no
    cancellation reaches it (as a task busy in C or Rust code, or a retry that raced the
    failure). Task 1 fails (``injected failure``) once task 0 has stalled.

    Task 0 goes on when its job's live mark is gone from the staging area (unless not
    ``heed_failure``: a task that outlives the job's wait), or once ``signals/release``
    exists (or after 60 s), and makes ``signals/done`` when it ends.
    ``signals`` is a directory every Ray worker sees (the local cluster's disk).
    """
    from atlas_fast.ray import AtlasDatasink
    from atlas_fast.ray._data import LIVE

    def wait_for(path: Path, until) -> None:
        deadline = time.monotonic() + 60
        while not until() and not path.exists() and time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except BaseException:  # a cancellation: this task does not see it
                pass

    class StragglingDatasink(AtlasDatasink):  # local: pickled by value to the workers
        def write(self, blocks, ctx):
            if ctx.task_idx == 1:
                wait_for(signals / "stalled", lambda: False)
                raise RuntimeError("injected failure")
            try:
                return super().write(blocks, ctx)
            finally:
                if ctx.task_idx == 0:
                    (signals / "done").touch()

        def _shard_writer(self, path, zdict, threads):
            (signals / "stalled").touch()
            wait_for(signals / "release", self._job_failed if heed_failure else lambda: False)
            return super()._shard_writer(path, zdict, threads)

        def _job_failed(self) -> bool:
            if self.remote is None:
                return not (self.staging / LIVE).exists()
            return not self.remote.names(f"{self.job}/{LIVE}", limit=1)

    return StragglingDatasink(**kwargs)


def wait_for_straggler(signals: Path, timeout: float = 60.0) -> None:
    """Wait until the straggler of ``straggling_datasink(signals)`` has ended (fail the test
    if it has not within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not (signals / "done").exists():
        assert time.monotonic() < deadline, "the straggling task never ended"
        time.sleep(0.05)
