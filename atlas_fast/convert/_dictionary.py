"""The strategy-2 dictionary handed from run 0 to the other runs of a conversion.

Run 0 trains it from the source's first shard, as a serial run does, and publishes it in a
directory every process sees (``DictionaryHandOver.publish``: the dictionary file, renamed
into place, or a marker saying there is none and the dataset falls back to strategy 1); the
others look for it there (``published``) or wait for it (``wait``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .._format import DICT_FILE

__all__ = ["DictionaryHandOver"]

_NO_DICT = "none"  # the marker: run 0 fell back to strategy 1


class DictionaryHandOver:
    """The dictionary run 0 publishes in ``directory`` (see the module's docstring)."""

    def __init__(self, directory):
        self.directory = Path(directory)

    def published(self):
        """The published dictionary (bytes), None when run 0 fell back to strategy 1, or
        ``...`` while not published yet."""
        path = self.directory / DICT_FILE
        if path.exists():
            return path.read_bytes()
        if (self.directory / _NO_DICT).exists():
            return None
        return ...

    def publish(self, data) -> None:
        """Publish ``data`` (bytes), or None: the dataset falls back to strategy 1."""
        if data is None:
            (self.directory / _NO_DICT).touch()
            return
        tmp = self.directory / f".{DICT_FILE}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.directory / DICT_FILE)

    def wait(self):
        """The dictionary (a ``ZstdCompressionDict``, or None when run 0 fell back to
        strategy 1), once it is published. Ends this process if its parent (the converting
        process) is gone."""
        import zstandard

        parent = os.getppid()
        while (data := self.published()) is ...:
            if os.getppid() != parent:
                raise SystemExit(1)
            time.sleep(0.005)
        return None if data is None else zstandard.ZstdCompressionDict(data)

    # As the ``dictionary_source`` of strategy-3 shard writers, given the shard's blocks:

    def awaited(self, blocks):
        """A run > 0's shard: the dictionary run 0 publishes (``wait``)."""
        return self.wait()

    def trained(self, blocks, *, compression_dict_size, compression_level, shard):
        """Run 0's first shard: the dictionary trained from its blocks, as a serial run
        trains it (the writer's ``train_dictionary``), published as soon as it is (None,
        strategy 1, when it cannot be trained)."""
        from ..writer import train_dictionary

        zdict = train_dictionary(
            blocks,
            compression_dict_size=compression_dict_size,
            compression_level=compression_level,
            shard=shard,
        )
        self.publish(None if zdict is None else zdict.as_bytes())
        return zdict
