"""The shard writer's entry points for converters and the Ray datasink.

``pickle_block`` + ``add_pickled_block`` (blocks pickled ahead of time, elsewhere) and
``dictionary_source`` + ``train_dictionary`` (a strategy-3 dictionary that comes from
somewhere else): the shards they make are byte for byte those ``add_example`` and the
shard writer's own training make, and every misuse is refused with an error naming the shard.
"""

from __future__ import annotations

import threading

import pytest
import zstandard

from atlas_fast import AtlasDatasetShardWriter, CompressionStrategy
from atlas_fast.writer import pickle_block, train_dictionary


def documents(n):
    return [{"id": i, "text": f"document {i} " + "lorem ipsum dolor " * (i % 13)} for i in range(n)]


def files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def shared_dictionary():
    blocks = [pickle_block(documents(200)[i : i + 10]) for i in range(0, 200, 10)]
    return train_dictionary(blocks)


def shard_writer(path, strategy, **kwargs):
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        kwargs["compression_dict"] = shared_dictionary()
    return AtlasDatasetShardWriter(path, 10, compression_strategy=strategy, **kwargs)


@pytest.mark.parametrize("checksums", [False, True])
@pytest.mark.parametrize("n", [0, 7, 90, 95])  # empty, one short block, full, a short last one
@pytest.mark.parametrize("strategy", list(CompressionStrategy))
def test_pickled_blocks_make_the_shard_add_example_makes(atlas, tmp_path, strategy, n, checksums):
    docs = documents(n)
    with shard_writer(tmp_path / "one", strategy, checksums=checksums) as w:
        for doc in docs:
            w.add_example(doc)
    with shard_writer(tmp_path / "blocks", strategy, checksums=checksums) as w:
        for start in range(0, n, 10):
            block = docs[start : start + 10]
            w.add_pickled_block(pickle_block(block, shard=w.path, number=start // 10), len(block))
        assert len(w) == n
    assert files(tmp_path / "blocks") == files(tmp_path / "one")
    zdict = None
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        zdict = shared_dictionary().as_bytes()
    shard = atlas.AtlasDatasetShard(tmp_path / "blocks", compression_dict_bytes=zdict)
    assert [shard[i] for i in range(len(shard))] == docs


def test_pickled_blocks_follow_examples_at_a_block_boundary(atlas, tmp_path):
    docs = documents(35)
    with AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=1) as w:
        for doc in docs[:20]:
            w.add_example(doc)
        w.add_pickled_block(bytearray(pickle_block(docs[20:30])), 10)  # any bytes-like object
        for doc in docs[30:]:
            w.add_example(doc)
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert [shard[i] for i in range(len(shard))] == docs


def test_a_pickled_block_must_start_a_block(tmp_path):
    w = AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=1)
    w.add_example("one")
    with pytest.raises(ValueError, match=r"s: add_pickled_block after 1 examples added one by"):
        w.add_pickled_block(pickle_block(documents(10)), 10)
    w.close()


@pytest.mark.parametrize("count", [0, -1, 11, 2.0, "10", None])
def test_a_pickled_block_holds_1_to_block_size_examples(tmp_path, count):
    w = AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=1)
    with pytest.raises(ValueError, match=r"count must be 1 to block_size \(10\), not"):
        w.add_pickled_block(pickle_block(documents(10)), count)
    assert len(w) == 0
    w.close()


def test_a_pickled_block_is_bytes(tmp_path):
    w = AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=1)
    with pytest.raises(TypeError, match="needs the bytes of pickle_block, not list"):
        w.add_pickled_block(documents(10), 10)
    w.close()


def test_nothing_follows_a_short_block(atlas, tmp_path):
    docs = documents(15)
    w = AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=0)
    w.add_pickled_block(pickle_block(docs[:10]), 10)
    w.add_pickled_block(pickle_block(docs[10:15]), 5)
    for add in (lambda: w.add_example("more"), lambda: w.add_pickled_block(pickle_block([1]), 1)):
        with pytest.raises(ValueError, match="ended with a short block"):
            add()
    w.close()
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert [shard[i] for i in range(len(shard))] == docs


def test_a_closed_shard_takes_no_pickled_block(tmp_path):
    w = AtlasDatasetShardWriter(tmp_path / "s", 10, compression_strategy=0)
    w.close()
    with pytest.raises(ValueError, match="the shard writer is closed"):
        w.add_pickled_block(pickle_block(documents(10)), 10)


def test_pickle_block_takes_any_iterable_of_examples():
    assert pickle_block(iter(range(5))) == pickle_block([0, 1, 2, 3, 4])


def test_train_dictionary_is_the_shard_writers(tmp_path):
    docs = documents(120)
    with AtlasDatasetShardWriter(tmp_path / "s", 10, compression_dict_size=0.05) as w:
        for doc in docs:
            w.add_example(doc)
    blocks = [pickle_block(docs[i : i + 10]) for i in range(0, 120, 10)]
    zdict = train_dictionary(blocks, compression_dict_size=0.05)
    assert zdict.as_bytes() == (tmp_path / "s" / "zstd_dict.bin").read_bytes()
    assert train_dictionary(blocks[:6]) is None  # fewer than 7 blocks: strategy 1


@pytest.mark.parametrize("workers", [1, 2])
def test_a_dictionary_source_replaces_the_training(atlas, tmp_path, workers):
    """The source is given the shard's pickled blocks at close; the shard is the one a
    strategy-2 shard writer with that dictionary writes, but for its own zstd_dict.bin."""
    docs = documents(50)  # 5 blocks: too few to train, the source decides
    zdict = shared_dictionary()
    given = []

    def source(blocks):
        given.append((list(blocks), threading.current_thread()))
        return zdict

    with AtlasDatasetShardWriter(
        tmp_path / "s", 10, workers=workers, dictionary_source=source
    ) as w:
        for doc in docs:
            w.add_example(doc)
    [(blocks, thread)] = given
    assert blocks == [pickle_block(docs[i : i + 10]) for i in range(0, 50, 10)]
    assert thread is threading.current_thread()
    with AtlasDatasetShardWriter(
        tmp_path / "two", 10, compression_strategy=2, compression_dict=zdict, workers=workers
    ) as w:
        for doc in docs:
            w.add_example(doc)
    assert (tmp_path / "s" / "zstd_dict.bin").read_bytes() == zdict.as_bytes()
    assert (tmp_path / "s" / "data.bin").read_bytes() == (
        tmp_path / "two" / "data.bin"
    ).read_bytes()
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert shard.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION
    assert [shard[i] for i in range(len(shard))] == docs


def test_a_dictionary_source_may_fall_back_to_strategy_1(atlas, tmp_path):
    docs = documents(100)
    with AtlasDatasetShardWriter(tmp_path / "s", 10, dictionary_source=lambda blocks: None) as w:
        for doc in docs:
            w.add_example(doc)
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert shard.metadata.compression_strategy == CompressionStrategy.STANDARD_COMPRESSION
    assert not (tmp_path / "s" / "zstd_dict.bin").exists()
    assert [shard[i] for i in range(len(shard))] == docs


@pytest.mark.parametrize("strategy", [0, 1, 2])
def test_a_dictionary_source_is_for_strategy_3_only(tmp_path, strategy):
    kwargs = {"compression_dict": shared_dictionary()} if strategy == 2 else {}
    with pytest.raises(
        ValueError, match=f"dictionary_source is for compression_strategy 3 .*, not {strategy}"
    ):
        AtlasDatasetShardWriter(
            tmp_path / "s", 10, strategy, dictionary_source=lambda b: None, **kwargs
        )
    assert not (tmp_path / "s").exists()


def test_a_dictionary_source_is_callable(tmp_path):
    with pytest.raises(TypeError, match="dictionary_source must be callable, not bytes"):
        AtlasDatasetShardWriter(tmp_path / "s", 10, dictionary_source=b"a dictionary")


def test_the_error_of_a_dictionary_source_is_raised_by_close(tmp_path):
    failure = zstandard.ZstdError("no dictionary today")

    def source(blocks):
        raise failure

    w = AtlasDatasetShardWriter(tmp_path / "s", 10, dictionary_source=source)
    w.add_example(1)
    with pytest.raises(zstandard.ZstdError) as info:
        w.close()
    assert info.value is failure
    assert not (tmp_path / "s" / "meta.json").exists()
