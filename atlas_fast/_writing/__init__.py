"""The writer's machinery below ``atlas_fast.writer``'s reference-shaped classes.

``commit``: atomic files and staged shards moved into place.
"""
