"""``TokenShuffleSampler``: the epoch order of a packed ``TokenSequences``, as token ranges.

The order is of tokens, not of windows (docs/tokens.md, "Design: the order of an epoch"):
each epoch permutes the blocks, cuts the stream of their tokens into equal shares (ranks)
and equal lanes (batch ``t`` reads lane ``t % lanes``), shuffles pieces of ``piece_tokens``
tokens within groups of ``group_pieces``, and cuts each batch's rows at the ``seq_len`` its
step is given, from where its lane stands. So the position of any step is arithmetic, a
``seq_len`` may change between steps without a token repeated or skipped, and the order
does not depend on the number of DataLoader workers.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from ._compat import lazy_classes, torch_subclass
from ._core._tokens_py import sorted_unique
from ._errors import InvalidArgumentError
from ._order import check_int, distributed_defaults

__all__ = ["TokenShuffleSampler"]  # noqa: F822 (see __getattr__)

_EPOCHS_KEPT = 2  # epoch layouts kept (a DataLoader's iterator may run into the next epoch)
_CHUNK_MIN = 8  # batches of a lane computed together, at least


def _check_schedule(schedule, seq_len: int) -> tuple:
    """``((first step, seq_len), ...)`` ascending from step 0."""
    if schedule is None:
        return ((0, seq_len),)
    try:
        pairs = [
            (check_int("schedule step", a, minimum=0), check_int("schedule seq_len", b, minimum=1))
            for a, b in schedule
        ]
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(
            f"schedule must be (step, seq_len) pairs, not {schedule!r}"
        ) from None
    if not pairs or pairs[0][0] != 0:
        raise InvalidArgumentError("schedule must start at step 0")
    if any(b[0] <= a[0] for a, b in itertools.pairwise(pairs)):
        raise InvalidArgumentError("schedule steps must increase")
    return tuple(pairs)


class _Epoch:
    """One epoch's block permutation and the stream of its tokens (``starts``: where each
    permuted block starts in it, then its length)."""

    def __init__(self, sampler, epoch: int) -> None:
        index = sampler._index
        cum = np.asarray(index.cum, dtype=np.int64)
        counts = np.diff(cum)
        seq = np.random.SeedSequence([sampler.seed, epoch, 0])
        self.perm = np.random.Generator(np.random.PCG64(seq)).permutation(len(counts))
        self.starts = np.concatenate(([0], np.cumsum(counts[self.perm])))
        self.block_first = cum  # each block's first token in the concatenation
        self.epoch = epoch


class _TokenShuffleSampler:
    """A block-local shuffled order over a packed ``TokenSequences``, resumable from the step
    alone, with ``seq_len`` free to change between steps.

    Yields one key per row (a tuple ``(start, count, ...)`` of ranges of the concatenation,
    which ``TokenSequences`` reads), ``batch_size`` keys per step: give the DataLoader the
    same ``batch_size``. Every rank takes the same number of steps per epoch; each token of
    a rank's share is a target once per epoch, but for less than two batches per lane at
    the end (dropped from that epoch; they come in another epoch's order).

    ``lanes`` (default: ``num_workers``, at least 1): batch ``t`` is read from lane
    ``t % lanes``; with DataLoader workers a divisor of ``lanes``, each lane (and its blocks)
    is read by one worker. ``piece_tokens`` (default: the sequences' ``seq_len``) and
    ``group_pieces`` (default: about ``window_blocks`` blocks' worth of tokens) set the
    shuffle: pieces of ``piece_tokens`` tokens shuffled within groups of ``group_pieces``.
    ``schedule``: ``[(first step, seq_len), ...]`` from step 0, a sequence-length
    curriculum (default: the sequences' ``seq_len`` throughout).

    Without DataLoader workers (``num_workers`` unset or 0) the sampler names the blocks of
    the batches about a group ahead to the dataset (``prefetch``), whose core decodes them
    ahead while the batches before are read; with workers it names none (they read
    elsewhere).

    The order depends on ``(seed, epoch)``, the dataset, ``num_replicas``, ``lanes``,
    ``piece_tokens``, ``group_pieces``, ``batch_size`` and the schedule, never on the number
    of workers. ``set_epoch(e)`` before each epoch; ``set_step(s)`` (or ``load_state_dict``)
    continues an epoch from step ``s`` (batches this rank has trained on), computed, not
    replayed. ``state_dict()`` records what the order depends on; ``load_state_dict`` adopts
    ``seed``, ``lanes``, ``piece_tokens``, ``group_pieces`` and ``schedule`` from it, so a
    resumed run may use another number of workers.
    """

    def __init__(
        self,
        sequences,
        *,
        batch_size,
        seed=0,
        lanes=None,
        num_workers=None,
        piece_tokens=None,
        group_pieces=None,
        window_blocks=8,
        num_replicas=None,
        rank=None,
        schedule=None,
    ):
        if not getattr(sequences, "packed", False):
            raise InvalidArgumentError(
                "TokenShuffleSampler orders packed TokenSequences; for documents "
                "(packed=False) use BlockShuffleSampler(sequences.dataset, ...): row k is "
                "document k"
            )
        self._sequences = sequences
        self._index = sequences._index
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        self.num_workers = check_int("num_workers", num_workers, minimum=0, none=True)
        self.lanes = check_int(
            "lanes", lanes if lanes is not None else max(1, self.num_workers or 1), minimum=1
        )
        self.piece_tokens = check_int(
            "piece_tokens",
            piece_tokens if piece_tokens is not None else sequences.seq_len,
            minimum=1,
        )
        blocks = max(1, len(self._index.cum) - 1)
        mean_block = max(1, self._index.total // blocks)
        window_blocks = check_int("window_blocks", window_blocks, minimum=1)
        if group_pieces is None:
            group_pieces = max(1, round(window_blocks * mean_block / self.piece_tokens))
        self.group_pieces = check_int("group_pieces", group_pieces, minimum=1)
        self.schedule = _check_schedule(schedule, sequences.seq_len)
        if num_replicas is None or rank is None:
            world, own = distributed_defaults()
            num_replicas = world if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        self.rank = check_int("rank", rank, minimum=0)
        if self.rank >= self.num_replicas:
            raise InvalidArgumentError(
                f"rank must be below num_replicas ({self.num_replicas}), not {rank}"
            )
        self.num_tokens = self._index.total
        self.epoch = 0
        self._start = 0  # the step the next iteration starts from (set_step, load_state_dict)
        self._yielded = 0  # keys handed out by the current iteration, from its start
        self._epochs: dict = {}
        reserve = getattr(sequences.dataset, "cache_reserve", None)
        if reserve is not None:  # the blocks of a group of each lane a worker reads
            per_worker = -(-self.lanes // max(1, self.num_workers or 1))
            group_blocks = -(-self.group_pieces * self.piece_tokens // mean_block) + 2
            reserve(per_worker * group_blocks)

    # -- the layout ---------------------------------------------------------------------------

    @property
    def lane_tokens(self) -> int:
        """Tokens of each lane of this rank's share."""
        return (self.num_tokens // self.num_replicas) // self.lanes

    def _layout(self, epoch: int) -> _Epoch:
        layout = self._epochs.get(epoch)
        if layout is None:
            layout = self._epochs[epoch] = _Epoch(self, epoch)
            while len(self._epochs) > _EPOCHS_KEPT:
                del self._epochs[next(iter(self._epochs))]
        return layout

    def _seq_len(self, step: int) -> int:
        length = self.schedule[0][1]
        for first, value in self.schedule:
            if first > step:
                break
            length = value
        return length

    def _consumed(self, lane: int, rounds: int) -> int:
        """Tokens lane ``lane`` has given to its first ``rounds`` batches (steps ``lane``,
        ``lane + lanes``, ...): per piece of the schedule, arithmetic."""
        g = self.lanes
        total = 0
        bounds = [s for s, _ in self.schedule[1:]] + [None]
        for (first, length), end in zip(self.schedule, bounds):
            lo = max(0, -(-(first - lane) // g))  # the first round at or after ``first``
            hi = rounds if end is None else min(rounds, -(-(end - lane) // g))
            if hi > lo:
                total += (hi - lo) * length
        return total * self.batch_size

    def steps(self) -> int:
        """Steps (batches of this rank) in an epoch: up to the first whose lane cannot fill
        its batch. Every rank has the same."""
        g, tl, b = self.lanes, self.lane_tokens, self.batch_size
        best = None
        for lane in range(g):
            lo, hi = 0, tl // (b * min(x for _, x in self.schedule)) + 1
            while lo < hi:  # the first round that does not fit
                mid = (lo + hi) // 2
                if self._consumed(lane, mid + 1) <= tl:
                    lo = mid + 1
                else:
                    hi = mid
            end = lo * g + lane
            best = end if best is None or end < best else best
        return best or 0

    def __len__(self) -> int:
        return (self.steps() - self._start) * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next iteration on, from its first step."""
        self.epoch = check_int("epoch", epoch, minimum=0)
        self._start = 0

    def set_step(self, step: int) -> None:
        """The next iteration continues the current epoch from step ``step``."""
        step = check_int("step", step, minimum=0)
        if step > self.steps():
            raise InvalidArgumentError(f"step {step} is past the epoch's {self.steps()} steps")
        self._start = step

    # -- rows -------------------------------------------------------------------------------

    def _group(self, layout: _Epoch, origin: int, j: int) -> tuple:
        """Group ``j`` of the lane starting at ``origin`` (in the epoch's stream): where its
        slots start in the group, and where each slot's piece starts in the stream."""
        c, k = self.piece_tokens, self.group_pieces
        start = j * k * c
        size = min(k * c, self.lane_tokens - start)
        n = -(-size // c)
        lengths = np.full(n, c, dtype=np.int64)
        lengths[-1] = size - (n - 1) * c
        seq = np.random.SeedSequence([self.seed, layout.epoch, 1, origin + start])
        order = np.random.Generator(np.random.PCG64(seq)).permutation(n)
        slot_starts = np.concatenate(([0], np.cumsum(lengths[order])))
        return slot_starts, origin + start + order * c

    def _lane_ranges(self, layout: _Epoch, lane: int, pos: int, count: int) -> tuple:
        """``(stream starts, lengths)`` of lane positions ``[pos, pos + count)``, in order."""
        origin = self.rank * (self.num_tokens // self.num_replicas) + lane * self.lane_tokens
        kc = self.piece_tokens * self.group_pieces
        starts, lengths = [], []
        end = pos + count
        j = pos // kc
        while pos < end:
            slot_starts, piece_at = self._group(layout, origin, j)
            base = j * kc
            lo, hi = pos - base, min(end, base + int(slot_starts[-1])) - base
            a = int(np.searchsorted(slot_starts, lo, side="right")) - 1
            b = int(np.searchsorted(slot_starts, hi - 1, side="right")) - 1
            s = np.arange(a, b + 1)
            first = np.maximum(slot_starts[s], lo)
            last = np.minimum(slot_starts[s + 1], hi)
            starts.append(piece_at[s] + (first - slot_starts[s]))
            lengths.append(last - first)
            pos = base + hi
            j += 1
        return np.concatenate(starts), np.concatenate(lengths)

    def _chunk(self, layout: _Epoch, lane: int, r0: int, r1: int) -> list:
        """The batches of rounds ``[r0, r1)`` of lane ``lane`` (steps ``lane + r * lanes``),
        computed together: ``[(keys, blocks), ...]``, ``blocks`` the global blocks each batch
        reads (ascending)."""
        g = self.lanes
        lengths = np.array([self._seq_len(r * g + lane) for r in range(r0, r1)], dtype=np.int64)
        pos = self._consumed(lane, r0)
        return self._cut(layout, lane, pos, np.repeat(lengths, self.batch_size), self.batch_size)

    def _rows(self, layout: _Epoch, lane: int, pos: int, count: int, length: int) -> list:
        """The keys of ``count`` rows of ``length`` tokens from position ``pos`` of lane
        ``lane``'s shuffled stream (a mixture reads a token source through this too)."""
        if count == 0:
            return []
        return self._cut(layout, lane, pos, np.full(count, length, dtype=np.int64), count)[0][0]

    def _cut(self, layout: _Epoch, lane: int, pos: int, row_lengths, bsz: int) -> list:
        """Rows of ``row_lengths`` tokens from position ``pos`` of lane ``lane``'s shuffled
        stream, in batches of ``bsz`` rows: ``[(keys, blocks), ...]``, ``blocks`` the global
        blocks each batch reads (ascending)."""
        batches = len(row_lengths) // bsz
        row_bounds = np.zeros(len(row_lengths) + 1, dtype=np.int64)
        np.cumsum(row_lengths, out=row_bounds[1:])
        total = int(row_bounds[-1])
        starts, lengths_ = self._lane_ranges(layout, lane, pos, total)
        # Cut at the rows' ends, then at the permuted blocks' ends.
        offsets = np.zeros(len(lengths_) + 1, dtype=np.int64)
        np.cumsum(lengths_, out=offsets[1:])
        cuts = sorted_unique(np.concatenate((offsets, row_bounds)))
        seg = np.searchsorted(offsets, cuts[:-1], side="right") - 1
        x = starts[seg] + (cuts[:-1] - offsets[seg])
        n = np.diff(cuts)
        row = np.searchsorted(row_bounds, cuts[:-1], side="right") - 1
        bstarts = layout.starts
        i0 = np.searchsorted(bstarts, x, side="right") - 1
        i1 = np.searchsorted(bstarts, x + n - 1, side="right") - 1
        reps = i1 - i0 + 1
        piece = np.repeat(np.arange(len(x)), reps)
        i = i0[piece] + (np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps))
        lo = np.maximum(x[piece], bstarts[i])
        hi = np.minimum(x[piece] + n[piece], bstarts[i + 1])
        keep = hi > lo
        i, lo, hi, piece = i[keep], lo[keep], hi[keep], piece[keep]
        block = layout.perm[i]
        glo = layout.block_first[block] + (lo - bstarts[i])
        rows = row[piece]
        # The blocks of each batch.
        n_blocks = len(layout.perm)
        touched = sorted_unique((rows // bsz) * n_blocks + block)
        batch_of, block_of = np.divmod(touched, n_blocks)
        block_bounds = np.searchsorted(batch_of, np.arange(batches + 1))
        # Ranges contiguous in the concatenation are joined.
        join = np.ones(len(glo), dtype=bool)
        join[1:] = (rows[1:] != rows[:-1]) | (glo[1:] != glo[:-1] + (hi[:-1] - lo[:-1]))
        heads = np.flatnonzero(join)
        sizes = np.add.reduceat(hi - lo, heads) if len(heads) else heads
        flat = np.empty(2 * len(heads), dtype=np.int64)
        flat[0::2] = glo[heads]
        flat[1::2] = sizes
        items = flat.tolist()
        bounds = (2 * np.searchsorted(rows[heads], np.arange(len(row_bounds)))).tolist()
        keys = [tuple(items[a:b]) for a, b in itertools.pairwise(bounds)]
        return [
            (keys[k * bsz : (k + 1) * bsz], block_of[block_bounds[k] : block_bounds[k + 1]])
            for k in range(batches)
        ]

    def _chunk_rounds(self, lane: int, r0: int, steps: int) -> int:
        """The end of the chunk of lane ``lane`` from round ``r0``: about a group of pieces'
        worth of batches (at least _CHUNK_MIN), within the epoch's ``steps``."""
        per_batch = self.batch_size * self._seq_len(r0 * self.lanes + lane)
        rounds = max(_CHUNK_MIN, -(-self.group_pieces * self.piece_tokens // per_batch))
        last = (steps - 1 - lane) // self.lanes + 1  # rounds of this lane in the epoch
        return min(r0 + rounds, last)

    def _plans(self, epoch: int, start: int):
        """``(step, keys, blocks)`` of this rank's batches of ``epoch`` from step ``start``,
        each lane's computed a chunk of rounds at a time."""
        layout = self._layout(epoch)
        steps = self.steps()
        g = self.lanes
        pending: dict = {}  # lane -> (first round, [(keys, blocks), ...])
        for step in range(start, steps):
            lane, r = step % g, step // g
            got = pending.get(lane)
            if got is None or not got[0] <= r < got[0] + len(got[1]):
                end = self._chunk_rounds(lane, r, steps)
                got = pending[lane] = (r, self._chunk(layout, lane, r, end))
            keys, blocks = got[1][r - got[0]]
            yield step, keys, blocks

    def batches(self, epoch: int | None = None, start: int = 0):
        """The keys of each batch of this rank's ``epoch`` (default: the current one) from
        step ``start``, one list per step."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        for _, keys, _ in self._plans(epoch, start):
            yield keys

    def __iter__(self):
        start, self._start = self._start, 0
        self._yielded = start * self.batch_size
        plans = self._plans(self.epoch, start)
        if self.num_workers:  # read in the workers: hints given here would reach no reader
            for _, keys, _ in plans:
                for key in keys:
                    self._yielded += 1
                    yield key
            return
        for keys in self._hinted(plans):
            for key in keys:
                self._yielded += 1
                yield key

    def _hinted(self, plans):
        """The keys of ``plans``, naming to the sequences' dataset (``prefetch``) the blocks
        of the batches up to about a group of pieces ahead: read in this process, its core
        decodes them ahead while the batches before are read."""
        horizon = max(
            1,
            -(-self.group_pieces * self.piece_tokens // (self.batch_size * self.schedule[0][1])),
        )
        named: set = set()
        ahead: deque = deque()
        useful = True
        for plan in plans:
            ahead.append(plan)
            if len(ahead) <= horizon and useful:
                continue
            if useful:
                new = [b for _, _, blocks in ahead for b in blocks.tolist() if b not in named]
                if new:
                    named.update(new)
                    useful = self._sequences._prefetch_blocks(new) is not False
                    if len(named) > 4096:
                        named = set(new)
            yield ahead.popleft()[1]
        while ahead:
            yield ahead.popleft()[1]

    # -- resuming ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the order depends on and where this rank is: ``step`` is the batches handed
        out so far (a DataLoader runs ahead of training: on resume prefer the training step)."""
        return {
            "epoch": self.epoch,
            "step": self._yielded // self.batch_size if self._yielded else self._start,
            "seed": self.seed,
            "lanes": self.lanes,
            "piece_tokens": self.piece_tokens,
            "group_pieces": self.group_pieces,
            "schedule": [list(p) for p in self.schedule],
            "batch_size": self.batch_size,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "num_tokens": self.num_tokens,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue epoch ``state["epoch"]`` from step ``state["step"]``, adopting the order's
        parameters the state holds (``seed``, ``lanes``, ``piece_tokens``, ``group_pieces``,
        ``schedule``); the dataset, ``batch_size`` and ``num_replicas`` must be the same."""
        for key in ("num_tokens", "batch_size", "num_replicas", "rank"):
            if key in state and state[key] != getattr(self, key):
                raise InvalidArgumentError(
                    f"cannot resume: the state has {key}={state[key]!r}, this sampler "
                    f"{getattr(self, key)!r}"
                )
        for key in ("seed", "lanes", "piece_tokens", "group_pieces"):
            if key in state:
                setattr(self, key, check_int(key, state[key], minimum=0 if key == "seed" else 1))
        if "schedule" in state:
            self.schedule = _check_schedule(state["schedule"], self.schedule[0][1])
        self._epochs.clear()
        self.epoch = check_int("epoch", state["epoch"], minimum=0)
        self.set_step(state.get("step", 0))
        self._yielded = 0

    def __repr__(self) -> str:
        return (
            f"TokenShuffleSampler(tokens={self.num_tokens}, batch_size={self.batch_size}, "
            f"lanes={self.lanes}, piece_tokens={self.piece_tokens}, "
            f"group_pieces={self.group_pieces}, seed={self.seed}, epoch={self.epoch}, "
            f"rank={self.rank}/{self.num_replicas})"
        )


def _make_sampler() -> dict:
    cls = torch_subclass(_TokenShuffleSampler, "Sampler", __name__, "TokenShuffleSampler")
    return {"TokenShuffleSampler": cls}


# ``TokenShuffleSampler`` subclasses torch's Sampler: made on first lookup (_compat.py).
__getattr__, __dir__ = lazy_classes(globals(), {"TokenShuffleSampler": _make_sampler})
