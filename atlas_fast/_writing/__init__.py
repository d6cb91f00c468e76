"""The writer's machinery below ``atlas_fast.writer``'s reference-shaped classes.

``options``: ``WriterOptions``, every writer option with its default and its check.
``blocks``: a block pickled, a strategy-3 dictionary trained, a shard's data.bin stored.
``pipeline``: the dataset writer's threads (full shards finished on a pool).
``context``: errors keep their type; where they happened is noted.
``commit``: atomic files and staged shards moved into place.
"""
