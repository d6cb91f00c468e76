"""``BlockShuffleSampler``: an epoch order that shuffles well and still reads whole blocks.

A block format decodes whole blocks, so drawing examples uniformly at random decodes a block
per example. This sampler permutes the blocks, then shuffles the examples within windows of
``window_blocks`` consecutive (permuted) blocks: a batch touches a few blocks, each decoded once.
The sampler reserves ``2 * window_blocks`` blocks in the dataset's cache (a batch may straddle
two windows), so window and cache agree whatever the cache's budget, also in DataLoader
workers, which receive the dataset with its reservation.

For a dataset in object storage the default order permutes extents instead of blocks: runs of
neighbouring blocks of a shard of about ``extent_bytes`` stored bytes (4 MiB), each fetched in
one request. The extents are grouped into windows of ``window_extents`` (4); within one, each
extent's blocks are shuffled and dealt in turn into groups of ``window_blocks`` blocks (so a
group holds blocks of every extent of its window), whose examples are shuffled together. An
epoch then costs about one request per extent, and a batch still mixes several distant parts
of the dataset; read in this process, the sampler names the blocks of about one window of
extents ahead to the dataset (``prefetch``), which fetches their extents meanwhile.

Each epoch's order is a function of ``(seed, epoch)`` alone and can be produced from any
position without the ones before it (the in-window shuffle keys come from a counter-addressable
PCG64 stream), so a rank builds only its own share and a resumed run skips ahead for free.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_state
from ._compat import lazy_classes, torch_subclass
from ._errors import InvalidArgumentError
from ._order import (
    BlockOrder,
    Counted,
    ReadAhead,
    begin_iteration,
    block_lengths,
    blocks_of,
    check_int,
    distributed_defaults,
    extent_blocks,
    extents_of,
)

__all__ = ["BlockShuffleSampler", "block_lengths"]  # noqa: F822 (made by __getattr__)

_check_int = check_int


class _StreamReader:
    """One worker's share of an epoch order (pieces: position ranges, each within one window),
    read in order from position ``start`` of the share."""

    def __init__(self, sampler, epoch: int, layout, pieces: list, start: int):
        self._sampler = sampler
        self._epoch = epoch
        self._layout = layout
        self._pieces = pieces
        k = 0
        while k < len(pieces) and start >= pieces[k][1] - pieces[k][0]:
            start -= pieces[k][1] - pieces[k][0]
            k += 1
        self._next = k  # the next piece to generate
        self._offset = start  # into it
        self._buffer = np.zeros(0, dtype=np.int64)

    def read(self, count: int) -> list:
        """The next ``count`` indices, as arrays."""
        out = []
        while count:
            if not len(self._buffer):
                lo, hi = self._pieces[self._next]
                self._next += 1
                lo += self._offset
                self._offset = 0
                chunks = self._sampler._windows(self._epoch, lo, hi, self._layout)
                self._buffer = np.concatenate(list(chunks))
            part = self._buffer[:count]
            self._buffer = self._buffer[count:]
            out.append(part)
            count -= len(part)
        return out


def _dealing(batch_size, num_workers):
    """What a dealt order depends on: ``(batch_size, num_workers)``, or None when not dealt."""
    if batch_size is None or num_workers is None or num_workers <= 1:
        return None
    return (batch_size, num_workers)


def _said(dealing) -> str:
    return f"dealt to {dealing[1]} workers in batches of {dealing[0]}" if dealing else "not dealt"


class _BlockShuffleSampler:
    """Block-aware shuffling for Atlas datasets, optionally split over distributed ranks.

    Each epoch: the blocks (of all shards) are permuted; then the examples of each window of
    ``window_blocks`` consecutive permuted blocks are shuffled together. Every index appears
    exactly once per epoch. The dataset's cache is told to keep ``2 * window_blocks`` blocks
    (``cache_reserve``): create the sampler before the DataLoader starts its workers.
    ``window_blocks=None`` shuffles the whole epoch uniformly (no locality).

    ``extent_bytes`` (default: 4 MiB for a dataset in object storage, 0 for local files)
    permutes extents rather than blocks: runs of neighbouring blocks of a shard holding about
    that many stored bytes (the block count is taken from the first shard's average block),
    which the dataset then fetches whole, one request each. The extents go in windows of
    ``window_extents``; each extent's blocks are shuffled, dealt in turn into groups of
    ``window_blocks`` blocks that hold blocks of every extent of the window, and each group's
    examples are shuffled together (``benchmarks/shuffle_quality.py`` compares the two
    orders). ``extent_bytes=0`` gives the block order, whatever the dataset. The order depends
    only on ``(seed, epoch)``; call ``set_epoch(e)`` before each epoch, as with
    ``DistributedSampler``.

    With ``num_replicas``/``rank`` (by default from ``torch.distributed`` when it is
    initialised, else 1 and 0) each rank gets a contiguous slice of the epoch's order, all of
    the same length: the order is padded by repeating its start, or its end is dropped with
    ``drop_last``. Contiguous slices keep each rank reading mostly whole blocks.

    With ``batch_size`` and ``num_workers`` (the DataLoader's, when ``num_workers > 1``) the
    windows are dealt to the workers: a DataLoader hands batch ``t`` to worker ``t %
    num_workers``, so batch ``t`` is drawn from the windows of worker ``t % num_workers`` alone
    (windows ``w, w + num_workers, ...`` of this rank's order; with extents, windows of extents)
    and each worker decodes (and fetches) only its own blocks; without it every worker decodes
    most blocks of every window. The batches a worker gets are those of a window shuffle of its
    windows; every index still appears once per epoch. Values other than the DataLoader's cost
    speed, never an index.

    ``state_dict()`` records ``(seed, epoch, yielded)``: how many indices this rank has
    yielded in the epoch; ``load_state_dict`` makes the next iteration continue from there.
    Behind a DataLoader the sampler runs ahead of training (prefetching), so on resume prefer
    ``yielded = batches_done * batch_size`` from the training step.

    A subclass of ``torch.utils.data.Sampler`` when torch is installed; torch is not needed.
    """

    def __init__(
        self,
        dataset,
        *,
        window_blocks=8,
        seed=0,
        num_replicas=None,
        rank=None,
        drop_last=False,
        batch_size=None,
        num_workers=None,
        extent_bytes=None,
        window_extents=4,
    ):
        self.batch_size = check_int("batch_size", batch_size, minimum=1, none=True)
        self.num_workers = check_int("num_workers", num_workers, minimum=0, none=True)
        if (batch_size is None) != (num_workers is None):
            given, other = ("batch_size", "num_workers")[:: 1 if num_workers is None else -1]
            raise InvalidArgumentError(
                f"{given} given without {other}: give both (the DataLoader's batch_size and "
                "num_workers) or neither"
            )
        if window_blocks is not None:
            window_blocks = check_int("window_blocks", window_blocks, minimum=1)
        self.window_blocks = window_blocks
        self.seed = check_int("seed", seed, minimum=0)
        if num_replicas is None or rank is None:
            world, own = distributed_defaults()
            if num_replicas is None:
                num_replicas = world
            if rank is None:
                rank = own
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        self.rank = check_int("rank", rank, minimum=0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"rank must be below num_replicas ({self.num_replicas}), not {rank}")
        self.drop_last = bool(drop_last)
        self.epoch = 0

        self.window_extents = check_int("window_extents", window_extents, minimum=1)
        if extent_bytes is not None:
            extent_bytes = check_int("extent_bytes", extent_bytes, minimum=0)
        self._lengths, shard_blocks = blocks_of(dataset)
        self.extent_blocks = extent_blocks(dataset, extent_bytes)
        # (first block, blocks) of each extent, in the blocks' order (None: no extents)
        self._extents = extents_of(shard_blocks, self.extent_blocks)
        reserve = getattr(dataset, "cache_reserve", None)  # None: a layout, not a reader
        if reserve is not None and window_blocks is not None:
            reserve(2 * window_blocks)
        self._orders = None  # the BlockOrder of self.seed (see _order)
        self._dataset = dataset  # told which blocks come next (ReadAhead)
        self.num_examples = int(self._lengths.sum())
        n, r = self.num_examples, self.num_replicas
        self.num_samples = n // r if self.drop_last else -(-n // r)
        self.total_size = self.num_samples * r
        self._counted = None  # the current (or last) iterator's Counted
        self._resume = None  # (epoch, yielded) from load_state_dict, for the next iteration

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    # -- the order ------------------------------------------------------------------------

    def _order(self) -> BlockOrder:
        """The epochs' orders (made again when ``load_state_dict`` adopts another seed)."""
        order = self._orders
        if order is None or order.entropy != (self.seed,):
            order = self._orders = BlockOrder(
                self._lengths,
                self.window_blocks,
                (self.seed,),
                self._extents,
                self.window_extents,
            )
        return order

    def _layout(self, epoch: int):
        """(permuted blocks, seed of the shuffle keys, each window's first block in the
        permuted blocks (and their count, last), the windows' end positions in the epoch, the
        window of extents of each window or None): ``BlockOrder.layout``."""
        return self._order().layout(epoch)

    def _windows(self, epoch: int, lo: int, hi: int, layout=None):
        """The epoch's order at positions ``lo <= p < hi`` (within one pass), in chunks;
        ``layout``: the epoch's ``_layout``, when the caller has it already."""
        return self._order().windows(epoch, lo, hi, layout)

    def _rank_ranges(self, skip: int = 0):
        """This rank's share of the epoch order after its first ``skip`` positions: ranges
        ``(lo, hi)`` of positions in one pass (more than one when the share wraps around to
        pad: padded positions past n repeat the order from its start)."""
        n = self.num_examples
        p = self.rank * self.num_samples + skip
        end = (self.rank + 1) * self.num_samples
        while p < end:
            lo = p % n
            hi = min(n, lo + end - p)
            yield lo, hi
            p += hi - lo

    def _rank_chunks(self, epoch: int, skip: int):
        """This rank's indices of ``epoch`` after the first ``skip``, in chunks."""
        if _dealing(self.batch_size, self.num_workers):
            yield from self._dealt_chunks(epoch, skip)
            return
        for lo, hi in self._rank_ranges(skip):
            yield from self._windows(epoch, lo, hi)

    # -- windows dealt to DataLoader workers ---------------------------------------------------

    def _streams(self, layout) -> list:
        """Each worker's pieces of this rank's order: ``(lo, hi)`` position ranges, each within
        one window, in order; window ``k`` of the share (a window cut by the share's ends
        counts as one) goes to worker ``k % num_workers``; with extents, window of extents
        ``k`` does (so that each extent is fetched by one worker)."""
        streams = [[] for _ in range(self.num_workers)]
        window_ends, groups = layout[3], layout[4]
        if not len(window_ends):
            return streams
        k = -1
        for lo, hi in self._rank_ranges():
            first = int(np.searchsorted(window_ends, lo, side="right"))
            last = int(np.searchsorted(window_ends, hi - 1, side="right"))
            group = None
            for j in range(first, last + 1):
                a = max(lo, int(window_ends[j - 1]) if j else 0)
                b = min(hi, int(window_ends[j]))
                if groups is None or groups[j] != group:
                    k += 1
                    group = None if groups is None else groups[j]
                streams[k % self.num_workers].append((a, b))
        return streams

    def _deals(self, lengths: list):
        """The dealing of streams of ``lengths`` into batches: per batch, the ``(stream,
        count)`` takes that fill it, batch ``t`` first from stream ``t % len(lengths)``, then
        (once that one is spent) from the next streams, so that every batch but the last is
        whole and batch boundaries stay where the DataLoader cuts them."""
        left = list(lengths)
        total = sum(left)
        workers = len(left)
        t = 0
        while total:
            need = min(self.batch_size, total)
            takes = []
            for step in range(workers):
                if not need:
                    break
                w = (t + step) % workers
                count = min(need, left[w])
                if count:
                    takes.append((w, count))
                    left[w] -= count
                    need -= count
                    total -= count
            yield takes
            t += 1

    def _dealt_chunks(self, epoch: int, skip: int):
        """This rank's indices of ``epoch`` dealt to the workers, after the first ``skip``."""
        layout = self._layout(epoch)  # once: each window's order is cut from it
        streams = self._streams(layout)
        deals = self._deals([sum(b - a for a, b in pieces) for pieces in streams])
        taken = [0] * len(streams)  # positions of each stream before the first batch read
        for takes in deals:
            size = sum(count for _, count in takes)
            if skip < size:
                break
            for w, count in takes:
                taken[w] += count
            skip -= size
        else:
            return
        readers = [
            _StreamReader(self, epoch, layout, streams[w], taken[w]) for w in range(len(streams))
        ]
        while True:
            for w, count in takes:
                chunks = readers[w].read(count)
                for chunk in chunks:
                    if skip >= len(chunk):  # the first batch's indices already yielded
                        skip -= len(chunk)
                        continue
                    yield chunk[skip:]
                    skip = 0
            takes = next(deals, None)
            if takes is None:
                return

    def __iter__(self):
        epoch, skip = begin_iteration(self)
        return self._counted.iterate(self._chunks(epoch, skip))

    @property
    def _yielded(self) -> int:
        """Indices yielded by the current (or last) iterator, counted from the epoch start."""
        return 0 if self._counted is None else self._counted.count()

    def _chunks(self, epoch: int, skip: int):
        chunks = self._rank_chunks(epoch, skip)
        if self.window_blocks is not None and not _dealing(self.batch_size, self.num_workers):
            # Read in this process (no DataLoader workers to deal to): the dataset decodes
            # the next window's blocks ahead, while this one's are read. In object storage
            # in extents, a window of extents ahead: the blocks named then are fetched with
            # their extents (the next window's, while this one's are read); from the second
            # chunk on, so that the first window's extents have the bandwidth to themselves.
            order = self._order()
            near = self.window_blocks * int(self._lengths.max(initial=1))
            horizon, memory = near, None
            if self._fetches_ahead():
                horizon = max(near, order.extent_window_positions())
                memory = 2 * horizon
            read_ahead = ReadAhead(self._dataset, order.starts, horizon, memory, first=near)
            chunks = read_ahead.chunks(chunks)
        return chunks

    def _fetches_ahead(self) -> bool:
        """Whether the order is read in extents from object storage (where naming blocks
        fetches them, and a whole window of extents ahead is what the fetching needs)."""
        return self._extents is not None and bool(
            getattr(self._dataset, "_in_object_storage", False)
        )

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's whole order for ``epoch`` (default: the current one) as an array."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        chunks = list(self._rank_chunks(epoch, 0))
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)

    # -- resuming -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this rank is: epoch, seed and indices yielded so far in the epoch."""
        if self._resume is not None:
            epoch, yielded = self._resume
        else:
            epoch, yielded = self.epoch, self._yielded
        return {
            "epoch": epoch,
            "seed": self.seed,
            "yielded": yielded,
            "window_blocks": self.window_blocks,
            "extent_blocks": self.extent_blocks,
            "window_extents": self.window_extents,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "num_examples": self.num_examples,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue epoch ``state["epoch"]`` after its first ``state["yielded"]`` indices.

        Only ``epoch`` and ``yielded`` are required (``seed`` is adopted when present); the
        other keys ``state_dict()`` writes are checked against this sampler, since the order
        depends on them.
        """
        check_state("BlockShuffleSampler", state, ("epoch", "yielded"))
        keys = ("window_blocks", "num_replicas", "rank", "drop_last", "num_examples")
        keys += ("extent_blocks",) + (("window_extents",) if self.extent_blocks else ())
        for key in keys:
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the state has {key}={state[key]!r}, "
                    f"this sampler {getattr(self, key)!r}"
                )
        # What the order depends on: the dealing (a state without these keys was not dealt).
        theirs = _dealing(state.get("batch_size"), state.get("num_workers"))
        ours = _dealing(self.batch_size, self.num_workers)
        if theirs != ours:
            raise ValueError(
                f"cannot resume: the state's order is {_said(theirs)}, this sampler's "
                f"{_said(ours)} (batch_size, num_workers)"
            )
        epoch = check_int("epoch", state["epoch"], minimum=0)
        yielded = check_int("yielded", state["yielded"], minimum=0)
        if yielded > self.num_samples:
            raise ValueError(
                f"cannot resume after {yielded} indices: an epoch has {self.num_samples}"
            )
        if "seed" in state:
            self.seed = check_int("seed", state["seed"], minimum=0)
        self.epoch = epoch
        self._counted = Counted(yielded)
        self._resume = (epoch, yielded)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(examples={self.num_examples}, "
            f"window_blocks={self.window_blocks}, "
            + (
                f"extent_blocks={self.extent_blocks}, window_extents={self.window_extents}, "
                if self.extent_blocks
                else ""
            )
            + f"seed={self.seed}, epoch={self.epoch}, "
            f"rank={self.rank}/{self.num_replicas})"
        )


def _make_sampler() -> dict:
    cls = torch_subclass(_BlockShuffleSampler, "Sampler", __name__, "BlockShuffleSampler")
    return {"BlockShuffleSampler": cls}


# ``BlockShuffleSampler`` subclasses torch's Sampler: made on first lookup (_compat.py).
__getattr__, __dir__ = lazy_classes(globals(), {"BlockShuffleSampler": _make_sampler})
