"""``--from energon``: a Megatron-Energon dataset, strictly (``.nv-meta/split.yaml`` required).

``--from wds`` reads a directory with ``.nv-meta/`` as Energon too; ``energon`` refuses a
directory without it instead of reading it as plain webdataset shards.
"""

from ._wds import energon_sources as sources

__all__ = ["sources"]
