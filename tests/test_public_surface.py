"""The public surface, declared once and pinned: adding or removing a public name of the package
or of a public class fails here until the lists below (and the docs) say so.

A public name is one without a leading underscore, on the class or on an instance. The readers
subclass a core's classes (so that ``ds[i]`` is the core's own ``__getitem__``), so a core's
internals must stay private names: both backends show the same surface.
"""

from __future__ import annotations

import subprocess
import sys

import atlas_fast

PACKAGE = {
    "AtlasDataset",
    "AtlasDatasetShard",
    "CompressionStrategy",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "AtlasDatasetWriter",
    "AtlasDatasetShardWriter",
    "BlockShuffleSampler",
    "MixtureDataset",
    "MixtureSampler",
    "merge",
    "AtlasFormatError",
    "DatasetBusyError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "MissingSharedDictionary",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "StorageError",
    "UnsafePickleError",
    "NotTokensError",
    "TokenIndexError",
    "TokenSequences",
    "TokenShuffleSampler",
    "UnpicklableExampleError",
    "CacheInfo",
    "DEFAULT_CACHE_BYTES",
    "BACKEND",
    "zstd_library",
    "__version__",
}

# The reference's names (torch_atlas_ds 0.1.0), then ours
READER = {"VERSION", "root", "mmap_index", "metadata"} | {
    "trusted",
    "allowed_globals",
    "cache_bytes",
    "cache_blocks",
    "cache_info",
    "cache_reserve",
    "close",
    "prefetch",
    "storage_options",
    "cache_dir",
    "cache_dir_bytes",
}
DATASET = READER | {"shards", "actual_shard_sizes", "cumulative_shard_sizes"}
SHARD = READER | {"compression_dict_bytes", "read_block"}
WRITER_COMMON = {"VERSION", "path", "add_example", "close"} | {"abort", "checksums", "workers"}
DATASET_WRITER = WRITER_COMMON | {
    "shard_size",
    "block_size",
    "compression_strategy",
    "compression_level",
    "compression_dict_size",
    "current_shard",
    "shard_sizes",
    "shared_dict",
}
SHARD_WRITER = WRITER_COMMON | {"metadata", "stored_examples", "compressor", "add_pickled_block"}
SAMPLER = {"set_epoch", "state_dict", "load_state_dict", "epoch_indices"} | {
    "seed",
    "epoch",
    "rank",
    "num_replicas",
    "drop_last",
    "window_blocks",
    "extent_blocks",  # the blocks per extent it reads in (0: the block order)
    "window_extents",
    "batch_size",
    "num_workers",
    "num_examples",
    "num_samples",
    "total_size",
}

MIXTURE = {"sources", "names", "locate", "index", "source_range", "prefetch", "close"} | {
    "token_rows"
}
MIXTURE_SAMPLER = {"set_epoch", "state_dict", "load_state_dict", "epoch_indices"} | {
    "set_weights",
    "schedule",
    "config",
    "consumed",
    "source_order",
    "mixture",
    "names",
    "seed",
    "epoch",
    "epoch_length",
    "total_steps",
    "global_batch_size",
    "batch_size",
    "window",
    "window_blocks",
    "unit",
    "rank",
    "num_replicas",
    "seq_len_schedule",
}
MIX_MODULE = {"MixtureDataset", "MixtureSampler", "from_config"}
TOKENS_MODULE = {"TokenSequences", "collate", "expand"}
TOKEN_SEQUENCES = {
    "dataset",
    "seq_len",
    "packed",
    "field",
    "start_input",
    "vocab_size",
    "dtype",
    "pad_value",
    "varlen",
    "compact",
    "num_tokens",
    "index_path",
}
TOKEN_SAMPLER = {"set_epoch", "set_step", "state_dict", "load_state_dict", "batches", "steps"} | {
    "batch_size",
    "seed",
    "epoch",
    "lanes",
    "lane_tokens",
    "num_workers",
    "piece_tokens",
    "group_pieces",
    "schedule",
    "num_replicas",
    "rank",
    "num_tokens",
}


def _public(obj) -> set:
    return {name for name in dir(obj) if not name.startswith("_")}


def _dataset(tmp_path):
    root = tmp_path / "ds"
    with atlas_fast.AtlasDatasetWriter(root, shard_size=50, block_size=10) as writer:
        for i in range(120):
            writer.add_example(i)
    return root


def test_the_package_exports_exactly_its_names():
    assert set(atlas_fast.__all__) == PACKAGE
    assert len(atlas_fast.__all__) == len(PACKAGE)  # listed once
    # and nothing public beside them but the submodules users import by name (in a fresh
    # process: a submodule another test imported becomes an attribute of the package)
    code = "import atlas_fast; print(' '.join(n for n in dir(atlas_fast) if n[0] != '_'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) - PACKAGE == {
        "atlas",
        "writer",
        "sampler",
        "storage",
        "mix",
        "tokens",
        "token_sampler",
    }


def test_readers_show_their_declared_names_only(atlas, tmp_path):
    ds = atlas.AtlasDataset(_dataset(tmp_path))
    assert ds[119] == 119  # opened and read: lazily made attributes exist too
    assert _public(ds) == DATASET
    assert _public(ds.shards[2]) == SHARD
    assert _public(atlas.AtlasDataset) <= DATASET
    assert _public(atlas.AtlasDatasetShard) <= SHARD


def test_writers_show_their_declared_names_only(tmp_path):
    with atlas_fast.AtlasDatasetWriter(tmp_path / "w", shard_size=50, block_size=10) as writer:
        writer.add_example(0)
        assert _public(writer) == DATASET_WRITER
    with atlas_fast.AtlasDatasetShardWriter(tmp_path / "s", block_size=10) as shard:
        shard.add_example(0)
        assert _public(shard) == SHARD_WRITER


def test_the_sampler_shows_its_declared_names_only(atlas, tmp_path):
    sampler = atlas_fast.BlockShuffleSampler(atlas.AtlasDataset(_dataset(tmp_path)), seed=0)
    assert _public(sampler) == SAMPLER


def test_the_mixture_shows_its_declared_names_only(atlas, tmp_path):
    from atlas_fast import mix

    assert set(mix.__all__) == MIX_MODULE
    mixture = atlas_fast.MixtureDataset({"a": atlas.AtlasDataset(_dataset(tmp_path))})
    sampler = atlas_fast.MixtureSampler(mixture, {"a": 1}, global_batch_size=4, seed=0)
    assert mixture[list(sampler)[-1]] in range(120)  # iterated: lazily made attributes too
    assert _public(mixture) == MIXTURE
    assert _public(sampler) == MIXTURE_SAMPLER


def test_token_sequences_show_their_declared_names_only(atlas, tmp_path):
    from atlas_fast import tokens

    assert set(tokens.__all__) == TOKENS_MODULE
    root = tmp_path / "t"
    with atlas_fast.AtlasDatasetWriter(root, shard_size=50, block_size=10) as writer:
        for i in range(20):
            writer.add_example(list(range(i)))
    ts = atlas_fast.TokenSequences(atlas.AtlasDataset(root), 4)
    assert ts[3]["targets"].shape == (4,)
    assert _public(ts) == TOKEN_SEQUENCES
    sampler = atlas_fast.TokenShuffleSampler(ts, batch_size=2)
    assert len(list(sampler)) == len(sampler)
    assert _public(sampler) == TOKEN_SAMPLER
