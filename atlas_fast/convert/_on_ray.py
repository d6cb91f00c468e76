"""``convert(..., ray=True)``: a source written on Ray Data through ``atlas_fast.ray``."""

from __future__ import annotations

from ._source import Source, SourceError

__all__ = ["write_with_ray"]


def _part_rows(parts: list, row: dict) -> list:
    """The Ray Data rows of one part (a Ray task reads one part)."""
    from ..ray import example_to_row

    return [example_to_row(example) for example in parts[row["part"]].read()]


def write_with_ray(source: Source, root, options: dict, storage_options=None) -> tuple:
    """Write ``source`` at ``root`` (a path, or a URL: ``storage_options`` go to the tasks)
    through ``atlas_fast.ray.write_atlas``: a Ray Dataset of one block per part, each read
    by a task, in part order. Returns (examples, shards, the strategy written)."""
    from functools import partial

    from ..ray import write_atlas

    if options["checksums"]:
        raise ValueError("checksums are not written on Ray (atlas_fast.ray.write_atlas)")
    import ray.data

    parts = list(source.parts)
    if not parts:
        raise SourceError("the source has no parts to read")
    dataset = ray.data.from_items(
        [{"part": i} for i in range(len(parts))], override_num_blocks=len(parts)
    ).flat_map(partial(_part_rows, parts))
    # Ray cannot count a flat_map without running it; parts that announce their examples
    # (Parquet, Hugging Face, flat-tokens) give the count, so shards go up under final names.
    counts = [part.examples for part in parts]
    expected = sum(counts) if None not in counts else None
    # A part's SourceError reaches the caller wrapped in Ray's task error, its text kept.
    metadata = write_atlas(
        dataset,
        root,
        shard_size=options["shard_size"],
        block_size=options["block_size"],
        compression_strategy=options["compression_strategy"],
        compression_level=options["compression_level"],
        compression_dict_size=options["compression_dict_size"],
        storage_options=storage_options,
        expected_examples=expected,
    )
    return sum(metadata.shard_sizes), len(metadata.shard_sizes), metadata.compression_strategy
