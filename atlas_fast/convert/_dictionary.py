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

__all__ = ["DictionaryHandOver", "shard_writer_classes"]

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


def shard_writer_classes():
    """``(AwaitingDictShardWriter, PublishingShardWriter)``: strategy-3 shard writers whose
    dictionary is the shared one; each instance is given its ``hand_over``."""
    from ..writer import AtlasDatasetShardWriter, train_dictionary

    class AwaitingDictShardWriter(AtlasDatasetShardWriter):
        """A strategy-3 shard whose dictionary is not trained but awaited: the one run 0
        publishes from the source's first shard (the rule of ``AtlasDatasetWriter``)."""

        hand_over: DictionaryHandOver

        def __init__(self, *args, **kwargs):
            super().__init__(*args, dictionary_source=self._awaited, **kwargs)

        def _awaited(self, blocks):
            return self.hand_over.wait()

    class PublishingShardWriter(AtlasDatasetShardWriter):
        """Run 0's first shard under strategy 2: it publishes the dictionary it trains as
        soon as it is trained, so that the others compress with it while this shard still
        compresses its own blocks (None, strategy 1, when it cannot be trained)."""

        hand_over: DictionaryHandOver

        def __init__(self, *args, **kwargs):
            super().__init__(*args, dictionary_source=self._trained, **kwargs)

        def _trained(self, blocks):
            zdict = train_dictionary(
                blocks,
                compression_dict_size=self.metadata.compression_dict_size,
                compression_level=self.metadata.compression_level,
                shard=self.path,
            )
            self.hand_over.publish(None if zdict is None else zdict.as_bytes())
            return zdict

    return AwaitingDictShardWriter, PublishingShardWriter
