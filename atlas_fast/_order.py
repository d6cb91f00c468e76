"""What the training orders share (``sampler.BlockShuffleSampler``, ``mix.MixtureSampler``).

- argument checks, torch's ``Sampler`` base when torch is installed, the distributed defaults;
- ``block_lengths``: the examples per block of a dataset, from its shards' metadata;
- ``extent_blocks`` and ``extents_of``: the extents a dataset in object storage is read in
  (runs of neighbouring blocks of a shard of about ``EXTENT_BYTES`` stored bytes, each fetched
  in one request);
- ``BlockOrder``: the block-shuffled passes over one dataset's examples, each a function of
  ``(entropy, pass)`` alone and computable from any position (blocks permuted alone, or in
  extents);
- ``ReadAhead``: tells a dataset which blocks an order reads next (its ``prefetch``), so that
  the core decodes them ahead.
"""

from __future__ import annotations

import itertools

import numpy as np

from ._checks import check_int as _check_int
from ._compat import torch_installed

# Layouts of passes a BlockOrder keeps: at most _LAYOUTS, and more than two only while they
# hold at most _LAYOUT_BLOCKS blocks together.
_LAYOUTS = 8
_LAYOUT_BLOCKS = 1 << 16

__all__ = [
    "EXTENT_BYTES",
    "BlockOrder",
    "Counted",
    "ReadAhead",
    "begin_iteration",
    "block_lengths",
    "blocks_of",
    "check_int",
    "distributed_defaults",
    "extent_blocks",
    "extents_of",
]


def distributed_defaults() -> tuple:
    """(world size, rank) from torch.distributed when it is initialised, else (1, 0)."""
    if not torch_installed():
        return 1, 0
    try:
        import torch.distributed as dist
    except Exception:
        return 1, 0
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def check_int(name: str, value, minimum=None, **bounds) -> int:
    """``_checks.check_int`` with ``minimum`` as a positional argument too."""
    return _check_int(name, value, minimum=minimum, **bounds)


def block_lengths(dataset) -> np.ndarray:
    """Examples per block of ``dataset`` (an Atlas dataset or shard), over all its shards.

    From the shards' metadata alone: nothing is opened (a dataset in object storage reads
    every shard's meta.json and index.npy first, concurrently).
    """
    return blocks_of(dataset)[0]


def blocks_of(dataset) -> tuple:
    """``(examples per block over all shards, blocks per shard)`` of ``dataset``."""
    shards = getattr(dataset, "shards", None)
    if shards is None:
        if getattr(dataset, "metadata", None) is None or not hasattr(
            dataset.metadata, "block_size"
        ):
            raise TypeError(
                "BlockShuffleSampler needs an AtlasDataset or AtlasDatasetShard, "
                f"not {type(dataset).__name__}"
            )
        shards = [dataset]
    read_ahead = getattr(dataset, "_read_shard_metadata", None)
    if read_ahead is not None:
        read_ahead()  # in object storage: all at once, not one round trip a shard
    parts = []
    counts = []
    for shard in shards:
        n = len(shard)
        size = shard.metadata.block_size
        full, rest = divmod(n, size)
        parts.append(np.full(full, size, dtype=np.int64))
        if rest:
            parts.append(np.array([rest], dtype=np.int64))
        counts.append(full + (1 if rest else 0))
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if int(lengths.sum()) != len(dataset):
        raise ValueError(
            f"the blocks of {dataset!r} hold {int(lengths.sum())} examples, "
            f"but it has {len(dataset)}"
        )
    return lengths, np.array(counts, dtype=np.int64)


EXTENT_BYTES = 4 << 20  # a remote dataset's default extent: stored bytes fetched in one request


def extent_blocks(dataset, extent_bytes) -> int:
    """Blocks per extent (0: blocks are permuted alone). ``extent_bytes`` None: the default,
    extents of ``EXTENT_BYTES`` for a dataset in object storage, none for local files. The
    dataset is told (``_plan_extents``): from then on (and in its pickled copies) a block it
    misses is fetched with its extent."""
    plan = getattr(dataset, "_plan_extents", None)  # None: a layout without storage
    if extent_bytes is None:
        if plan is None or not getattr(dataset, "_in_object_storage", False):
            return 0
        extent_bytes = EXTENT_BYTES
    if extent_bytes == 0 or plan is None:
        return 0
    return plan(extent_bytes)


def extents_of(shard_blocks: np.ndarray, k: int):
    """``(first block, blocks)`` of each extent of ``k`` blocks (arrays, in the blocks' order
    over all shards), cut from each shard's first block (a shard's last one may be shorter);
    None when ``k`` is 0 (blocks permuted alone)."""
    if not k:
        return None
    firsts = np.cumsum(shard_blocks) - shard_blocks
    starts = [np.arange(f, f + c, k, dtype=np.int64) for f, c in zip(firsts, shard_blocks)]
    starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    ends = np.minimum(starts + k, np.repeat(firsts + shard_blocks, -(-shard_blocks // k)))
    return starts, ends - starts


class BlockOrder:
    """The block-shuffled passes over the examples of one dataset of blocks ``lengths``.

    Pass ``e`` permutes the blocks, then shuffles the examples of each window of
    ``window_blocks`` consecutive permuted blocks together (``None``: one window, a uniform
    shuffle). It depends on ``(*entropy, e)`` alone (``numpy.random.SeedSequence``), and any
    stretch of it is made without the positions before: the in-window shuffle keys come from a
    counter-addressable PCG64 stream.

    With ``extents`` (``(first block, blocks)`` of each extent, ``extents_of``) the extents
    are permuted instead, taken ``window_extents`` at a time; within such a window of extents
    each extent's blocks are shuffled and the window's extents dealt in turn, and the windows
    of ``window_blocks`` blocks are cut afresh in each window of extents (so each holds blocks
    of every extent of its window of extents). Without extents the order is the block order.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        window_blocks,
        entropy: tuple,
        extents=None,
        window_extents: int = 4,
    ) -> None:
        self.lengths = lengths
        self.starts = np.cumsum(lengths) - lengths  # first example of each block
        self.n = int(lengths.sum())
        self.window_blocks = window_blocks
        self.entropy = tuple(entropy)
        self.extents = extents
        self.window_extents = window_extents
        self._layouts: dict = {}  # pass -> layout, of the passes laid out last
        self._keys = None  # (pass, position, Generator): where the last ``windows`` ended

    def plan(self, epoch: int):
        """(permuted blocks, their end positions in the pass, seed of the shuffle keys, the
        first position of each window of extents in the permuted blocks (and their count,
        last) or None without extents)."""
        seeds = np.random.SeedSequence([*self.entropy, epoch]).spawn(2)
        generator = np.random.Generator(np.random.PCG64(seeds[0]))
        if self.extents is None:
            perm = generator.permutation(len(self.lengths))
            firsts = None
        else:
            perm, firsts = self._extent_plan(generator)
        ends = np.cumsum(self.lengths[perm])
        return perm, ends, seeds[1], firsts

    def _extent_plan(self, generator) -> tuple:
        """The blocks in extent order: extents permuted, taken ``window_extents`` at a time,
        each extent's blocks shuffled and the window's extents' blocks taken in turn. Also
        each window of extents' first position in the order (and the number of blocks, last)."""
        starts, counts = self.extents
        nb = int(counts.sum())
        e = generator.permutation(len(starts))
        lens = counts[e]
        before = np.cumsum(lens) - lens  # first position of each (permuted) extent
        blocks = np.repeat(starts[e] - before, lens) + np.arange(nb, dtype=np.int64)
        slot = np.repeat(np.arange(len(e), dtype=np.int64), lens)  # extent of each position
        blocks = blocks[np.lexsort((generator.random(nb), slot))]  # shuffled in each extent
        turn = np.arange(nb, dtype=np.int64) - np.repeat(before, lens)  # rank in its extent
        window = slot // self.window_extents
        perm = blocks[np.lexsort((slot % self.window_extents, turn, window))]
        sizes = np.bincount(window, minlength=-(-len(e) // self.window_extents))
        firsts = np.concatenate(([0], np.cumsum(sizes)))
        return perm, firsts

    def layout(self, epoch: int):
        """(permuted blocks, seed of the shuffle keys, each window's first block in the
        permuted blocks (and their count, last), the windows' end positions in the pass, the
        window of extents of each window or None); the last few passes' are kept."""
        layout = self._layouts.get(epoch)
        if layout is not None:
            return layout
        perm, ends, key_seed, extent_firsts = self.plan(epoch)
        nb = len(perm)
        if self.window_blocks is None:
            starts = np.array([0, nb] if nb else [0], dtype=np.int64)
            groups = None
        elif extent_firsts is None:
            starts = np.append(np.arange(0, nb, self.window_blocks, dtype=np.int64), nb)
            groups = None
        else:  # windows of window_blocks blocks, cut afresh in each window of extents
            sizes = np.diff(extent_firsts)
            first = np.repeat(extent_firsts[:-1], sizes)
            offset = np.arange(nb, dtype=np.int64) - first
            cut = np.flatnonzero(offset % self.window_blocks == 0)
            groups = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)[cut]
            starts = np.append(cut, nb)
        window_ends = ends[starts[1:] - 1] if nb else np.zeros(0, dtype=np.int64)
        layout = (perm, key_seed, starts, window_ends, groups)
        layouts = self._layouts
        layouts[epoch] = layout
        # The last two passes' always; up to _LAYOUTS while they are small (a small source
        # is read several passes at a time by a mixture, and each pass's layout twice).
        while len(layouts) > 2 and (
            len(layouts) > _LAYOUTS or len(layouts) * len(perm) > _LAYOUT_BLOCKS
        ):
            del layouts[next(iter(layouts))]
        return layout

    def windows(self, epoch: int, lo: int, hi: int, layout=None):
        """Pass ``epoch`` at positions ``lo <= p < hi``, in chunks (one per window touched);
        ``layout``: the pass's ``layout``, when the caller has it already."""
        if lo >= hi:
            return
        perm, key_seed, starts, window_ends, _ = self.layout(epoch) if layout is None else layout
        k = int(np.searchsorted(window_ends, lo, side="right"))
        start = int(window_ends[k - 1]) if k else 0
        # One key per position: key p is output p of the stream, whatever the rank. A call
        # that starts where the last one ended continues its generator.
        if self._keys is not None and self._keys[:2] == (epoch, start):
            keys = self._keys[2]
        else:
            keys = np.random.PCG64(key_seed)
            keys.advance(start)
            keys = np.random.Generator(keys)
        self._keys = None  # in use: a generator left unfinished is not continued
        while start < hi:
            blocks = perm[starts[k] : starts[k + 1]]
            lengths = self.lengths[blocks]
            count = int(lengths.sum())
            firsts = self.starts[blocks] - (np.cumsum(lengths) - lengths)
            order = np.repeat(firsts, lengths) + np.arange(count, dtype=np.int64)
            order = order[np.argsort(keys.random(count), kind="stable")]
            start += count
            k += 1
            if start >= hi:  # the next call may continue from here
                self._keys = (epoch, start, keys)
            yield order[max(lo - start + count, 0) : hi - start + count]

    def window_at(self, epoch: int, position: int) -> tuple:
        """``(lo, hi)``: the positions of the window of pass ``epoch`` holding ``position``."""
        window_ends = self.layout(epoch)[3]
        k = int(np.searchsorted(window_ends, position, side="right"))
        return (int(window_ends[k - 1]) if k else 0), int(window_ends[k])

    def extent_window_positions(self) -> int:
        """Positions of a window of extents at most (0 without extents): how far ahead an
        order read in extents names blocks, so that the next window's extents are fetched
        while this one's are read."""
        if self.extents is None or not len(self.lengths):
            return 0
        counts = self.extents[1]
        return int(self.window_extents * counts.max(initial=1) * self.lengths.max(initial=1))


class ReadAhead:
    """Tells ``dataset`` (through its ``prefetch(indices)``, when it has one) which blocks an
    order of its indices reads next: the order's chunks pass through ``chunks()``, and the
    blocks first read within ``horizon`` positions past the chunk handed out are named, in the
    order they are first read; a block named is not named again within ``memory`` positions.
    ``first``: the horizon of the first chunk handed out (default ``horizon``), so that what
    the first reads need is not slowed by what is named far ahead of them.

    ``starts``: the first index of every block, ascending. A dataset read in another process
    (by a DataLoader's workers) is told for nothing: a core acts on a hint at its next read in
    this process only, and keeps just the latest ones until then.
    """

    def __init__(self, dataset, starts: np.ndarray, horizon: int, memory=None, first=None) -> None:
        self._prefetch = getattr(dataset, "prefetch", None)
        self._starts = starts
        self._horizon = max(1, int(horizon))
        self._first = self._horizon if first is None else max(1, int(first))
        self._memory = 8 * self._horizon if memory is None else memory
        self._named: dict = {}  # block -> the position it was named at

    def chunks(self, chunks):
        """``chunks`` (arrays of indices, in order), unchanged, naming blocks ahead."""
        if self._prefetch is None or not len(self._starts):
            yield from chunks
            return
        pending: list = []  # chunks read from ``chunks`` and not yet handed out
        ahead = 0  # positions in ``pending``
        told = 0  # positions of ``pending`` whose blocks were named
        position = 0  # of pending[0] in the order
        source = iter(chunks)
        more = True
        horizon = self._first
        while True:
            while more and ahead < horizon + (len(pending[0]) if pending else 1):
                chunk = next(source, None)
                if chunk is None:
                    more = False
                else:
                    pending.append(chunk)
                    ahead += len(chunk)
            if not pending:
                return
            if told < ahead and self._prefetch is not None:
                self._name(np.concatenate(pending)[told:], position + told)
            told = ahead
            chunk = pending.pop(0)
            ahead -= len(chunk)
            told -= len(chunk)
            position += len(chunk)
            horizon = self._horizon
            yield chunk

    def _name(self, indices: np.ndarray, position: int) -> None:
        """Name the blocks of ``indices`` (the order from ``position`` on)."""
        if not len(indices):
            return
        blocks = np.searchsorted(self._starts, indices, side="right") - 1
        unique, first = np.unique(blocks, return_index=True)
        named = self._named
        recent = position - self._memory
        new = []
        for b in unique[np.argsort(first, kind="stable")].tolist():
            if named.get(b, recent - 1) < recent:
                named[b] = position
                new.append(b)
        if len(named) > 2048:
            for b in [b for b, p in named.items() if p < recent]:
                del named[b]
        if new and self._prefetch(self._starts[new].tolist()) is False:
            self._prefetch = None  # of no use to this dataset


def begin_iteration(sampler) -> tuple:
    """``(epoch, skip)`` of the iteration of ``sampler`` (a ``BlockShuffleSampler`` or a
    ``MixtureSampler``) that starts now: ``skip`` is the indices of the epoch already yielded
    when ``load_state_dict``'s position is of this epoch (it serves one iteration), else 0.
    The sampler's ``_counted`` counts the new iteration from there."""
    epoch, resume = sampler.epoch, sampler._resume
    sampler._resume = None
    skip = resume[1] if resume is not None and resume[0] == epoch else 0
    sampler._counted = Counted(skip)
    return epoch, skip


class Counted:
    """How many indices of an iteration were handed out (``count()``, plus ``start``), the
    iteration (``iterate``) handing out the indices of its chunks (arrays, or lists of keys)
    one at a time
    through ``itertools.chain``: no Python frame per index."""

    def __init__(self, start: int = 0) -> None:
        self._done = start  # indices of the chunks before the current one, plus start
        self._current = None  # the current chunk's list iterator
        self._size = 0  # its length

    def iterate(self, chunks):
        """The indices of ``chunks``, counted. (Not kept here: the iterator refers to this
        object, and a cycle would keep the datasets it reads until a collection.)"""
        return itertools.chain.from_iterable(self._lists(chunks))

    def _lists(self, chunks):
        for chunk in chunks:
            items = chunk if type(chunk) is list else chunk.tolist()
            if items:
                self._done += self._size
                self._current = current = iter(items)
                self._size = len(items)
                yield current

    def count(self) -> int:
        current = self._current
        if current is None:
            return self._done
        return self._done + self._size - current.__length_hint__()
