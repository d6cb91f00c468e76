"""A conversion into object storage, shard by shard: each shard uploaded once its place in
the dataset is known (and, with ``verify``, once verified), then removed from local disk.

The runs (``_write.RunWriter``) tell the converting process what they do, as events
(``Worker.event``): a group of consecutive parts begun (``("group", first)``), a shard
opened in it (``("open", first, run, number)``), the group ended (``("end", first, last)``)
and a shard finished (``("done", run, number, path, size)``: its files final, whoever
finished it). Groups are the dataset's in the order of their first parts, so a shard's
index is known once every part before its group is covered by ended groups:
``ShardStream`` names it then, verifies it (``verify``: in index order, against the source
read again) and hands it to the uploads (``_writing.upload.ShardUploads``).

Local disk is bounded by ``Gate``, a few integers the processes share: the bytes of
finished shards still on local disk (added by the run that finished one, taken off once
it is stored), those the converting process was not told of yet, those named and on their
way up, which run writes the group at the front (the ``frontier``), and the limit
(``staging_bytes``). After finishing a shard a run waits while the shards on local disk
hold more than the limit: every run but the frontier's (whose shards are named as soon as
the converting process is told of them), and the frontier's too while shards not told of
yet or on their way up will free room. So the frontier never waits for a shard that cannot
be named, and the others pause until it catches up with them: local disk holds at most
``staging_bytes`` plus a finished shard per run (and the shards being written).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .._format import read_shard_metadata

__all__ = ["Gate", "ShardStream", "shard_bytes"]

_TOTAL, _NAMED, _UNSEEN, _FRONTIER, _LIMIT, _FAILED = range(6)
GATE_SLOTS = 6
_PAUSE = 0.02  # seconds between looks at the gate while waiting


def shard_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


class Gate:
    """The shared integers of the module's docstring, in ``array`` (a
    ``multiprocessing.Array("q", GATE_SLOTS)``, whose lock guards every access)."""

    def __init__(self, array) -> None:
        self.array = array

    def reset(self, limit: int) -> None:
        with self.array.get_lock():
            self.array[:] = [0, 0, 0, -1, limit, 0]

    def _add(self, slot: int, n: int) -> None:
        with self.array.get_lock():
            self.array[slot] += n

    def held(self, size: int) -> None:
        """A run finished a shard of ``size`` bytes, on local disk (and tells it)."""
        with self.array.get_lock():
            self.array[_TOTAL] += size
            self.array[_UNSEEN] += size

    def seen(self, size: int) -> None:
        """The converting process was told of a finished shard of ``size`` bytes."""
        self._add(_UNSEEN, -size)

    def named(self, size: int) -> None:
        """A shard of ``size`` bytes is named and on its way up."""
        self._add(_NAMED, size)

    def stored(self, size: int) -> None:
        """A named shard of ``size`` bytes has left local disk (stored, or failed)."""
        with self.array.get_lock():
            self.array[_TOTAL] -= size
            self.array[_NAMED] -= size

    def set_frontier(self, run: int) -> None:
        with self.array.get_lock():
            self.array[_FRONTIER] = run

    def fail(self) -> None:
        with self.array.get_lock():
            self.array[_FAILED] = 1

    def may_go(self, run: int) -> bool:
        """Whether ``run`` may write on (see the module's docstring)."""
        with self.array.get_lock():
            total, named, unseen, frontier, limit, failed = self.array[:]
        if failed:
            raise RuntimeError("convert: an upload failed (the converting process raises it)")
        if total <= limit:
            return True
        # The frontier's shards are named as soon as they are seen: it waits for those.
        return frontier == run and named == 0 and unseen == 0

    def wait(self, run: int, pump=None, watch=None) -> None:
        """Wait until ``run`` may go on; ``pump`` handles the converting process's messages
        meanwhile (run 0, in that process), ``watch`` says whether another process died."""
        while not self.may_go(run):
            if pump is not None:
                pump()
            if watch is not None:
                problem = watch()
                if problem:
                    raise RuntimeError(f"convert: {problem}")
            time.sleep(_PAUSE)


@dataclass
class _Group:
    run: int
    shards: list = field(default_factory=list)  # (run, number) in order
    last: int | None = None  # the group's last part, once it ended
    indexed: int = 0  # shards given their index so far


class ShardStream:
    """The shards of one source's conversion, named, verified and uploaded as they come
    (see the module's docstring). ``uploads``: the dataset's ``ShardUploads`` (its
    ``on_stored`` is ``gate.stored``); ``parts``: the source's; ``lower``: a count the
    dataset's shards reach at least (from the examples the source announces), which sets
    the width of the first names; ``verify``: the label errors name the dataset by, or
    None; ``dict_dir``: where the strategy-2 dictionary is published."""

    def __init__(
        self, uploads, gate, parts, *, lower=1, verify=None, dict_dir=None, first=0
    ) -> None:
        self.uploads = uploads
        # An append: the dataset's shards before these (they are numbered after them).
        self.first = first
        self.gate = gate
        self.parts = parts
        self.lower = max(1, lower)
        self.groups: dict = {}  # first part -> _Group
        self.done: dict = {}  # (run, number) -> (path, size): finished, not named yet
        self.index: dict = {}  # (run, number) -> its index in the dataset, once known
        self.ready: dict = {}  # index -> (path, size): named, waiting for those before
        self.covered = 0  # parts before this one are in ended groups
        self.base = 0  # the shards of those groups
        self.opened = 0  # shards opened by every run: the count is at least this
        self.released = 0  # shards handed on (index order)
        self.sizes: list = []  # stored examples of each shard handed on
        self.stored_bytes = 0
        self.dict_dir = dict_dir
        self._verifier = None
        self._checker = None
        if verify is not None:
            self._checker = _Verifier(parts, verify, dict_dir)
            self._verifier = ThreadPoolExecutor(1, thread_name_prefix="atlas-fast-verify")
        self._verifying: list = []

    # -- events ------------------------------------------------------------------------------

    def on_event(self, run: int, event: tuple) -> None:
        """An event of a run (see the module's docstring)."""
        kind = event[0]
        if kind == "group":
            self.groups[event[1]] = _Group(run)
        elif kind == "open":
            self.groups[event[1]].shards.append((event[2], event[3]))
            self.opened += 1
        elif kind == "end":
            self.groups[event[1]].last = event[2]
        elif kind == "done":
            _, owner, number, path, size = event
            self.done[(owner, number)] = (path, size)
            self.gate.seen(size)
        self._advance()
        self.uploads.check()
        if self._checker is not None:
            self._checker.check()

    def _advance(self) -> None:
        group = None
        while (group := self.groups.get(self.covered)) is not None:
            for j in range(group.indexed, len(group.shards)):
                self.index[group.shards[j]] = self.base + j
            group.indexed = len(group.shards)
            if group.last is None:
                break
            self.base += len(group.shards)
            self.covered = group.last + 1
        self.gate.set_frontier(-1 if group is None else group.run)
        for key in [k for k in self.done if k in self.index]:
            self.ready[self.index[key]] = self.done.pop(key)
        while self.released in self.ready:
            self._release(self.released, *self.ready.pop(self.released))
            self.released += 1

    def _release(self, index: int, path: str, size: int) -> None:
        """Shard ``index`` is named: verified (if asked), then uploaded."""
        path = Path(path)
        self.sizes.append(read_shard_metadata(path).stored_examples)
        self.stored_bytes += size
        number = self.first + index
        width = len(str(self.first + max(self.lower, self.opened, index + 1) - 1))
        name = str(number).zfill(width)
        self.gate.named(size)
        if self._verifier is None:
            self.uploads.put(path, number, name, size)
        else:
            self._verifying.append(
                self._verifier.submit(self._verified, path, index, number, name, size)
            )

    def _verified(self, path: Path, index: int, number: int, name: str, size: int) -> None:
        try:
            self._checker.shard(path, index)
        except BaseException:
            self.gate.stored(size)  # it never goes up: the conversion fails
            raise
        self.uploads.put(path, number, name, size)

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> list:
        """Every run has ended: check that every part and shard was handed on, wait for the
        verification; the shards' stored examples, in order."""
        try:
            self._advance()
            if self.covered != len(self.parts) or self.done or self.ready:
                raise RuntimeError(
                    f"convert: parts covered {self.covered} of {len(self.parts)}, shards left "
                    f"unnamed: {len(self.done) + len(self.ready)}"
                )
            for future in self._verifying:
                future.result()
            if self._checker is not None:
                self._checker.end(sum(self.sizes))
        finally:
            self.close()
        return self.sizes

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.shutdown(wait=True, cancel_futures=True)


class _Verifier:
    """``verify`` of a conversion to a URL: each shard, in index order, read back from
    local disk and compared with the source read again (one pass over it, in order)."""

    def __init__(self, parts, label: str, dict_dir) -> None:
        self.parts = parts
        self.label = label
        self.dict_dir = dict_dir
        self.examples = self._source()
        self.index = 0  # the dataset's example compared next
        self.error = None

    def _source(self):
        for part in self.parts:
            for number, example in enumerate(part.read()):
                yield part, number, example

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def shard(self, path: Path, index: int) -> None:
        from .. import atlas
        from .._format import CompressionStrategy
        from ._compare import difference
        from ._dictionary import DictionaryHandOver
        from ._verify import VerifyError

        self.check()  # an earlier shard differed: the source's read is not where it was
        try:
            metadata = read_shard_metadata(path)
            shared = None
            if metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
                shared = DictionaryHandOver(self.dict_dir).published()
            with atlas.AtlasDatasetShard(path, compression_dict_bytes=shared) as shard:
                for stored in shard:
                    found = next(self.examples, None)
                    if found is None:
                        raise VerifyError(
                            f"{self.label}: example {self.index} (shard {index}): not in the "
                            f"source, which holds {self.index} examples"
                        )
                    part, number, expected = found
                    problem = difference(expected, stored)
                    if problem is not None:
                        raise VerifyError(
                            f"{self.label}: example {self.index} (example {number} of part "
                            f"{part.label}) differs from the source: {problem}"
                        )
                    self.index += 1
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def end(self, stored: int) -> None:
        """Every shard compared: the source must hold no more examples."""
        from ._verify import VerifyError

        left = sum(1 for _ in self.examples)
        if left or stored != self.index:
            raise VerifyError(
                f"{self.label}: the converted dataset holds {stored} examples, the source "
                f"{self.index + left}"
            )
