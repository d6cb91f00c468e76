"""The contract between the facade and the cores (``atlas_fast._contract``), checked on both.

Each core module offers what ``CoreModule`` declares, its classes every method of their
protocol, and they behave alike: the same results, caches and errors for the same calls.
"""

from __future__ import annotations

import inspect
import pickle
import random
import re
import threading
from pathlib import Path

import pytest
from loader_helpers import example, write_dataset

import atlas_fast
import atlas_fast._core._pool
import atlas_fast._core._reader_py
from atlas_fast import _contract, _format
from atlas_fast._errors import AtlasFormatError, MissingSharedDictionary

CORES = [atlas_fast._core._reader_py]
if atlas_fast.BACKEND == "cython":
    import atlas_fast._core._reader

    CORES.append(atlas_fast._core._reader)


def _declared(protocol) -> set:
    """The methods and attributes a protocol declares (its own and its bases')."""
    names = set()
    for cls in protocol.__mro__:
        if cls in (object, _contract.Protocol) or cls.__module__ == "typing":
            continue
        names |= {
            name
            for name in vars(cls)
            if (
                not name.startswith("_")
                or name in {"__len__", "__getitem__", "__getitems__", "__iter__"}
            )
        }
        names |= set(getattr(cls, "__annotations__", {}))
    return names


@pytest.fixture(params=CORES, ids=lambda m: m.BACKEND)
def core(request):
    return request.param


def test_core_modules_offer_the_contract(core):
    for name in _declared(_contract.CoreModule):
        assert hasattr(core, name), name
    for cls, protocol in [
        (core.BlockCache, _contract.BlockCacheCore),
        (core.ShardCore, _contract.ShardCoreProtocol),
        (core.DatasetCore, _contract.DatasetCoreProtocol),
    ]:
        missing = [n for n in _declared(protocol) if not hasattr(cls, n)]
        assert missing == [], (cls, missing)


def test_pool_uses_only_the_declared_batch_source(core, root):
    """``_pool`` works on shard readers through ``BatchSource`` alone, which both cores offer."""
    protocol = _contract.BatchSource
    declared = set(protocol.__annotations__) | {
        name
        for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("__")
    }
    shard = core.ShardCore(
        str(root / "1"),
        _format.read_shard_metadata(root / "1"),
        (root / "zstd_dict.bin").read_bytes(),
        pickle.loads,
        core.BlockCache(None, 4),
        1,
    )
    missing = [n for n in declared if not hasattr(shard, n)]
    assert missing == [], missing
    assert (shard._block_size, shard._n_blocks, shard._compressed) == (4, 10, True)
    source = Path(atlas_fast._core._pool.__file__).read_text()
    used = set(re.findall(r"\breader\.(\w+)", source))
    assert used, "no reader attribute found: the pattern no longer matches _pool's code"
    assert used <= declared, used - declared


def test_facade_uses_only_the_contract():
    """The facade module never names a core's private members."""
    source = inspect.getsource(atlas_fast.atlas)
    for private in ("_load_block", "_direct_load", "_open_files", "_classes_module", "_locate"):
        assert private not in source


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    # 3 shards of 40 examples in blocks of 4 (10 blocks each), shared dictionary.
    return write_dataset(tmp_path_factory.mktemp("contract") / "ds", 120, 40, 4)


def _dataset(core, root, cache):
    shard_dirs = _format.find_shard_dirs(root)
    meta = _format.read_dataset_metadata(root)
    return core.DatasetCore(
        str(root),
        [str(d) for d in shard_dirs],
        meta.shard_sizes,
        [None] * len(shard_dirs),
        (root / "zstd_dict.bin").read_bytes() if (root / "zstd_dict.bin").exists() else None,
        pickle.loads,
        cache,
    )


def test_cores_behave_alike(root):
    expected = [example(i) for i in range(120)]
    results = []
    for core in CORES:
        cache = core.BlockCache(None, 4)
        ds = _dataset(core, root, cache)
        got = [ds[i] for i in (0, 1, 9, 119, -1, -120, 50)]
        assert got == [expected[i] for i in (0, 1, 9, 119, -1, -120, 50)]
        assert ds.__getitems__([3, 100, 3]) == [expected[i] for i in (3, 100, 3)]
        assert list(ds) == expected
        info = ds.cache_info()
        assert isinstance(info, _contract.CacheInfo)
        keys = cache.keys()
        shard_meta = _format.read_shard_metadata(root / "1")
        shard = core.ShardCore(
            str(root / "1"),
            shard_meta,
            (root / "zstd_dict.bin").read_bytes(),
            pickle.loads,
            core.BlockCache(1 << 20, None),
            0,
        )
        blocks = [shard.read_block(b) for b in range(10)]
        raw = shard._raw_block(2)
        data = shard._block_bytes(2)
        assert pickle.loads(data) == blocks[2] == expected[48:52]
        assert shard._block_offsets().tolist()[-1] == (root / "1" / "data.bin").stat().st_size
        errors = _errors(ds, shard)
        with pytest.raises(MissingSharedDictionary) as missing:
            core.ShardCore(str(root / "1"), shard_meta, None, pickle.loads, cache, 0)
        assert missing.value.shard_root == str(root / "1")
        assert isinstance(missing.value, AtlasFormatError)
        ds.close()
        assert ds.cache_info().currsize == 0
        # The compiled core decodes a random read's example alone and keeps the block's pickle
        # (partial decoding): which blocks it holds are the same; its hit/miss split, recency
        # order and bytes may differ (a block held as its pickle is charged the pickle's size,
        # one held whole what its objects take).
        assert info.currsize > 0
        alike = (info.hits + info.misses, info.max_bytes, info.blocks)
        results.append((alike, info.max_blocks, sorted(keys), raw, data, errors))
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("blocks", [40, 3])
@pytest.mark.parametrize("strategy", [2, 0])
def test_batches_are_counted_alike(tmp_path_factory, blocks, strategy):
    """A batch (which the compiled core reads in C when it touches few blocks, all cached or
    small) looks up every distinct block once, in the order the batch first reads it, before
    it loads any; then it loads the misses in that order: the same counts (one hit or miss
    per block, also when a load evicts a block looked up before), the same recency order
    (caches of 40 and 3 blocks), the same errors, in both cores, dataset and shard,
    compressed or not."""
    root = tmp_path_factory.mktemp("alike") / "ds"
    write_dataset(root, 120, 40, 4, strategy)
    expected = [example(i) for i in range(120)]
    rng = random.Random(4)
    batches = [[rng.randrange(40, 80) for _ in range(12)] for _ in range(6)]
    batches += [list(range(120)), [-1, 0, -120, 7] * 3, [5], []]  # 30 blocks; negative; one
    results = []
    for core in CORES:
        cache = core.BlockCache(None, blocks)
        ds = _dataset(core, root, cache)
        shard_cache = core.BlockCache(None, blocks)
        dict_file = root / "zstd_dict.bin"
        shard = core.ShardCore(
            str(root / "1"),
            _format.read_shard_metadata(root / "1"),
            dict_file.read_bytes() if dict_file.exists() else None,
            pickle.loads,
            shard_cache,
            0,
        )
        first = batches[0]
        assert ds.__getitems__(first) == [expected[i] for i in first]
        assert tuple(ds.cache_info())[:2] == (0, len({i // 4 for i in first}))  # (hits, misses)
        for batch in batches + batches:
            assert ds.__getitems__(batch) == [expected[i] for i in batch]
            local = [i % 40 for i in batch]
            assert shard.__getitems__(local) == [expected[40 + i] for i in local]
        errors = []
        for reader, batch in ((ds, [41, 42, 120]), (ds, [41, "1"]), (shard, [1, 2, 40])):
            with pytest.raises((IndexError, TypeError)) as bad:
                reader.__getitems__(batch)
            errors.append((type(bad.value), str(bad.value)))
        counts = (tuple(ds.cache_info()), tuple(shard.cache_info()))
        results.append((counts, cache.keys(), shard_cache.keys(), errors))
    assert all(r == results[0] for r in results)


def _errors(ds, shard) -> list:
    errors = []
    for call in (
        lambda: ds[120],
        lambda: ds[-121],
        lambda: ds["1"],
        lambda: ds[1.0],
        lambda: shard.read_block(10),
        lambda: shard._block_bytes(-1),
        lambda: ds.__getitems__([0, 2**70]),
    ):
        with pytest.raises((IndexError, TypeError)) as exc:
            call()
        errors.append((type(exc.value), str(exc.value)))
    return errors


def test_dataset_shard_mismatch_names_both_files(core, root, tmp_path):
    cache = core.BlockCache(None, 2)
    shard_dirs = _format.find_shard_dirs(root)
    ds = core.DatasetCore(
        str(root),
        [str(d) for d in shard_dirs],
        [40, 41, 40],
        [None] * 3,
        (root / "zstd_dict.bin").read_bytes(),
        pickle.loads,
        cache,
    )
    assert ds[0] == example(0)
    with pytest.raises(AtlasFormatError) as info:
        ds[45]
    assert str(root / "1" / "meta.json") in str(info.value)
    assert str(root / "meta.json") in str(info.value)


def test_index_rule_is_one(core):
    for n in (0, 1, 7):
        for i in (-8, -7, -1, 0, 1, 6, 7, 2**70, -(2**70)):
            try:
                want = _contract.normalize_index(i, n)
            except IndexError as exc:
                want = str(exc)
            assert want == (i + n if -n <= i < 0 else i if 0 <= i < n else want)


@pytest.mark.skipif(atlas_fast.BACKEND != "cython", reason="needs the compiled core")
def test_c_constants_mirror_the_python_ones():
    c = atlas_fast._core._reader.C_CONSTANTS
    assert c["MAX_ZSTD_RATIO"] == _format.MAX_ZSTD_RATIO
    assert c["DEFAULT_MAX_BLOCK_BYTES"] == _format._DEFAULT_MAX_BLOCK_BYTES
    assert c["STREAM_STEP"] == atlas_fast._core._reader_py.STREAM_STEP
    assert c["PREFETCH_MIN_STORED"] == atlas_fast._core._pool.POOL_MIN_BLOCK_BYTES
    # A pass in order reads ahead smaller frames on the C thread than the pool takes.
    assert 0 < c["READ_AHEAD_MIN_STORED"] < c["PREFETCH_MIN_STORED"]
    from atlas_fast._core import _objsize

    assert c["MEASURE_FIRST"] == _objsize.MEASURE_FIRST
    assert c["MEASURE_EVERY"] == _objsize.MEASURE_EVERY
    assert c["WINDOW"] == _objsize.WINDOW


def test_threads_share_one_dataset_through_a_small_cache(atlas, root):
    """ds[i], __getitems__, iteration and shard reads at once on one object, with a cache
    small enough to evict all the time: every example exact."""
    expected = [example(i) for i in range(120)]
    ds = atlas.AtlasDataset(root, cache_blocks=2)
    failures = []
    start = threading.Barrier(6)

    def singles(seed):
        rng = random.Random(seed)
        start.wait()
        for _ in range(600):
            i = rng.randrange(-120, 120)
            if ds[i] != expected[i]:
                failures.append(("item", i))

    def batches(seed):
        rng = random.Random(seed)
        start.wait()
        for _ in range(40):
            batch = [rng.randrange(120) for _ in range(rng.randrange(1, 40))]
            if ds.__getitems__(batch) != [expected[i] for i in batch]:
                failures.append(("batch", seed))

    def passes(seed):
        start.wait()
        for _ in range(4):
            if list(ds) != expected:
                failures.append(("iter", seed))
            if ds.shards[seed % 3].read_block(2) != expected[40 * (seed % 3) + 8 :][:4]:
                failures.append(("block", seed))

    kinds = (singles, batches, passes)
    threads = [threading.Thread(target=kinds[k % 3], args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    info = ds.cache_info()
    assert info.blocks <= 2 and info.misses > 0 and info.hits > 0


def test_a_dictionary_is_digested_once_per_content(core, tmp_path):
    """Both cores share one digested dictionary per distinct content (``_shards``), found by
    a key hashed on the dictionary's length and ends and compared whole: dictionaries alike
    but in the middle are two."""
    import zstandard

    from atlas_fast._core import _shards

    samples = [
        f"record {i}: {'alpha beta gamma ' * (i % 9)}{i * 7919}".encode() for i in range(600)
    ]
    data = zstandard.train_dictionary(4096, samples).as_bytes()
    middle = bytearray(data)
    middle[len(data) // 2] ^= 0xFF
    path = tmp_path / "zstd_dict.bin"
    first = _shards._digested_dict(core.ZstdDict, data, path)
    assert _shards._digested_dict(core.ZstdDict, bytes(bytearray(data)), path) is first
    other = _shards._digested_dict(core.ZstdDict, bytes(middle), path)
    assert other is not first
    assert _shards._digested_dict(core.ZstdDict, bytes(middle), path) is other
    assert _shards._digested_dict(core.ZstdDict, data[:-1], path) is not first
