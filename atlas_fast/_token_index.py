"""The token index: where each block's tokens start in the concatenation of a dataset's
token sequences, in a file at the dataset's root (docs/tokens.md describes the format).

Documents never span blocks, so a window of the concatenation is located with one number per
block (the tokens before it); the lengths of the documents inside a block are found when the
block is decoded. The file holds, per shard, what the shard's entry was made from (its example
and block counts, its data.bin size and a digest of its index.npy) and per block the
cumulative token count: 8 bytes per block, memory-mapped (DataLoader workers share the pages).

Opening a dataset that carries its index reads that file alone (and the root meta.json the
dataset read): each shard's entry is checked against the shard's own files the first time a
process reads the shard (``TokenIndex.check_shard``), and every decoded block's token count
against its entry, so a shard rewritten since is an error, never other tokens. Shards the
index does not cover (appended since), or whose example count changed, get new entries; the
others are kept.

Where the file goes: the dataset's root when writable, else a user cache folder
(``$XDG_CACHE_HOME/atlas-fast/tokens/<digest of the root's path or URL>/``).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._errors import TokenIndexError

__all__ = [
    "FORMAT_VERSION",
    "covering_entries",
    "field_of",
    "index_files",
    "MAGIC",
    "ShardEntry",
    "TokenIndex",
    "cache_folder",
    "index_name",
    "offsets_digest",
    "write_index",
]

MAGIC = b"ATLASTOK"
FORMAT_VERSION = 1
_HEADER = 64
MAX_INDEX_BYTES = 1 << 30  # an index fetched from object storage: 128M blocks at most
_NO_ID = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)  # (low, high) of a shard with no token

# One record per shard: what its entry was made from, then what it holds.
SHARD_DTYPE = np.dtype(
    [
        ("examples", "<u8"),
        ("blocks", "<u8"),
        ("data_bytes", "<u8"),
        ("digest", "V8"),
        ("tokens", "<u8"),
        ("low", "<i8"),
        ("high", "<i8"),
        ("first_block", "<u8"),
    ]
)
assert SHARD_DTYPE.itemsize == 64

_SAFE_FIELD = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def index_name(field) -> str:
    """The index file's name for ``field`` (None: examples are the sequences themselves)."""
    if field is None:
        return "tokens.idx"
    if _SAFE_FIELD.fullmatch(field) and not field.startswith("."):
        return f"tokens.{field}.idx"
    return f"tokens.{hashlib.sha256(field.encode()).hexdigest()[:16]}.idx"


def cache_folder(root, identity: str | None = None) -> Path:
    """The user cache folder of the index of the dataset at ``root`` (a path or URL);
    ``identity``: what the dataset's version is known by (a remote dataset's: the ETag and
    digest of its root meta.json), so that a dataset rewritten at the same URL gets another
    folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    where = str(root) if "://" in str(root) else os.path.abspath(str(root))
    if identity:
        where += "\n" + identity
    key = hashlib.sha256(where.encode()).hexdigest()[:24]
    return Path(base) / "atlas-fast" / "tokens" / key


def offsets_digest(offsets) -> bytes:
    """8 bytes that change when a shard's index.npy (its block offsets) does."""
    data = np.ascontiguousarray(offsets, dtype="<u8").tobytes()
    return hashlib.blake2b(data, digest_size=8).digest()


@dataclass
class ShardEntry:
    """A shard's entry: what it was made from (``examples``, ``data_bytes``, ``digest``) and
    its blocks' token counts (``counts``), smallest and largest id (None: no token)."""

    examples: int
    data_bytes: int
    digest: bytes
    counts: np.ndarray
    low: int | None
    high: int | None


def write_index(path, field, entries: list) -> None:
    """Write the index of ``entries`` (one ``ShardEntry`` per shard, in shard order) to
    ``path`` atomically (a file beside it renamed over it)."""
    write_atomic(path, index_bytes(field, entries))


def write_atomic(path, data: bytes) -> None:
    """``data`` into the file ``path``, atomically (a file beside it renamed over it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tokens-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def index_bytes(field, entries: list) -> bytes:
    """The index file of ``entries`` (one ``ShardEntry`` per shard, in shard order)."""
    name = b"" if field is None else field.encode()
    table = np.zeros(len(entries), dtype=SHARD_DTYPE)
    counts = [np.asarray(e.counts, dtype=np.int64) for e in entries]
    n_blocks = sum(len(c) for c in counts)
    cum = np.zeros(n_blocks + 1, dtype="<u8")
    if n_blocks:
        np.cumsum(np.concatenate(counts), out=cum[1:])
    first = 0
    for k, (e, c) in enumerate(zip(entries, counts)):
        low, high = _NO_ID if e.low is None else (e.low, e.high)
        table[k] = (e.examples, len(c), e.data_bytes, e.digest, int(c.sum()), low, high, first)
        first += len(c)
    header = bytearray(_HEADER)
    header[0:8] = MAGIC
    header[8:12] = FORMAT_VERSION.to_bytes(4, "little")
    header[12:16] = len(name).to_bytes(4, "little")
    header[16:24] = len(entries).to_bytes(8, "little")
    header[24:32] = n_blocks.to_bytes(8, "little")
    header[32:40] = int(cum[-1]).to_bytes(8, "little")
    padded = name + b"\0" * (-len(name) % 8)
    return b"".join((bytes(header), padded, table.tobytes(), cum.tobytes()))


class TokenIndex:
    """A token index file, memory-mapped: ``shards`` (one ``SHARD_DTYPE`` record per shard)
    and ``cum`` (uint64, each block's first token in the concatenation, then the total)."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < _HEADER:
                    raise self._bad(f"{size} bytes, shorter than its header")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise TokenIndexError(f"{self.path}: cannot be read: {exc}") from exc
        m = self._map
        if m[0:8] != MAGIC:
            raise self._bad("not a token index (no ATLASTOK magic)")
        version = int.from_bytes(m[8:12], "little")
        if version != FORMAT_VERSION:
            raise self._bad(f"format version {version}; this atlas_fast reads {FORMAT_VERSION}")
        name_len = int.from_bytes(m[12:16], "little")
        n_shards = int.from_bytes(m[16:24], "little")
        n_blocks = int.from_bytes(m[24:32], "little")
        total = int.from_bytes(m[32:40], "little")
        table_at = _HEADER + name_len + (-name_len % 8)
        cum_at = table_at + n_shards * SHARD_DTYPE.itemsize
        if (
            name_len > 4096
            or n_shards > size
            or n_blocks > size
            or cum_at + 8 * (n_blocks + 1) != size
        ):
            raise self._bad(
                f"{size} bytes, not what its header says ({n_shards} shards, {n_blocks} blocks)"
            )
        try:
            self.field = bytes(m[_HEADER : _HEADER + name_len]).decode() if name_len else None
        except UnicodeDecodeError:
            raise self._bad("its field name is not UTF-8") from None
        self.shards = np.frombuffer(m, dtype=SHARD_DTYPE, count=n_shards, offset=table_at)
        self.cum = np.frombuffer(m, dtype="<u8", count=n_blocks + 1, offset=cum_at)
        self.total = total
        self._check(n_blocks)

    def _bad(self, what: str) -> TokenIndexError:
        return TokenIndexError(f"{self.path}: malformed token index: {what}")

    def _check(self, n_blocks: int) -> None:
        t = self.shards
        cum = self.cum
        if (
            cum[0] != 0
            or int(cum[-1]) != self.total
            or (n_blocks and (np.diff(cum) > (1 << 62)).any())
        ):
            raise self._bad(
                "its cumulative token counts do not start at 0, rise and end at the total"
            )
        blocks = t["blocks"].astype(np.int64)
        firsts = np.cumsum(blocks) - blocks
        if int(blocks.sum()) != n_blocks or (t["first_block"].astype(np.int64) != firsts).any():
            raise self._bad("its shards' blocks do not add up to its block table")
        tokens = cum[firsts + blocks].astype(np.int64) - cum[firsts].astype(np.int64)
        if (t["tokens"].astype(np.int64) != tokens).any():
            raise self._bad("its shards' token counts disagree with its block table")

    def entry(self, k: int) -> ShardEntry:
        """Shard ``k``'s entry, copied out of the mapping."""
        r = self.shards[k]
        first, blocks = int(r["first_block"]), int(r["blocks"])
        counts = np.diff(self.cum[first : first + blocks + 1].astype(np.int64))
        low, high = int(r["low"]), int(r["high"])
        none = (low, high) == _NO_ID
        return ShardEntry(
            int(r["examples"]),
            int(r["data_bytes"]),
            bytes(r["digest"]),
            counts,
            None if none else low,
            None if none else high,
        )


def check_shard(index_path, entry_row, k: int, shard_root, offsets) -> None:
    """Shard ``k``'s entry (a ``SHARD_DTYPE`` record) against its block ``offsets``
    (index.npy): a ``TokenIndexError`` if the shard was rewritten since the entry was made."""
    blocks = len(offsets) - 1
    found = (blocks, int(offsets[-1]) if len(offsets) else 0, offsets_digest(offsets))
    made = (int(entry_row["blocks"]), int(entry_row["data_bytes"]), bytes(entry_row["digest"]))
    if found != made:
        raise TokenIndexError(
            f"{index_path}: shard {k} ({shard_root}) has {found[0]} blocks and {found[1]} bytes "
            f"of data (index.npy digest {found[2].hex()}), the token index was made from "
            f"{made[0]} blocks and {made[1]} bytes (digest {made[2].hex()}): the shard was "
            "rewritten; rebuild the index with TokenSequences(..., index='rebuild')"
        )


# -- building entries ----------------------------------------------------------------------


def _progress_bar(progress, total: int, desc: str):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="block", file=sys.stderr, leave=False)


def build_entries(dataset, shards: list, field, core, progress=None, workers=None) -> dict:
    """``{k: ShardEntry}`` for the dataset's shards ``shards`` (positions), read in parallel:
    runs of blocks on a thread pool (the compiled core decodes and scans with the GIL
    released), with a progress bar of blocks (tqdm, when installed; ``progress``: True,
    False, or None for: when stderr is a terminal)."""
    read_ahead = getattr(dataset, "_read_shard_metadata", None)
    if read_ahead is not None:
        read_ahead()  # in object storage: every shard's index at once, not a round trip each
    readers = {k: dataset._reader(k) for k in shards}
    runs = []
    for k in shards:
        offsets = readers[k]._block_offsets()  # opens the shard: its errors raised here
        n = len(offsets) - 1
        step = 64
        for first in range(0, n, step):
            runs.append((k, first, min(n, first + step)))
    bar = _progress_bar(progress, sum(stop - first for _, first, stop in runs), "token index")
    lock = threading.Lock()
    results: dict = {}

    def count(run):
        k, first, stop = run
        # In object storage the run's blocks are fetched together, neighbours merged into
        # requests of ``request_bytes`` (a local shard's readers ignore it).
        readers[k]._prefetch(list(range(first, stop)))
        out = core.block_token_stats(readers[k], first, stop, field)
        if bar is not None:
            with lock:
                bar.update(stop - first)
        return run, out

    workers = workers or min(8, os.cpu_count() or 1)
    try:
        if workers > 1 and len(runs) > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="atlas-fast-tokens") as pool:
                done = list(pool.map(count, runs))
        else:
            done = [count(run) for run in runs]
    finally:
        if bar is not None:
            bar.close()
    for (k, first, _), out in done:
        results.setdefault(k, []).append((first, out))
    entries = {}
    for k in shards:
        offsets = readers[k]._block_offsets()
        parts = sorted(results.get(k, []), key=lambda p: p[0])
        counts = np.concatenate([c for _, (c, _, _) in parts]) if parts else np.zeros(0, np.int64)
        lows = [lo for _, (_, lo, _) in parts if lo is not None]
        highs = [hi for _, (_, _, hi) in parts if hi is not None]
        entries[k] = ShardEntry(
            len(readers[k]),
            int(offsets[-1]) if len(offsets) else 0,
            offsets_digest(offsets),
            counts,
            min(lows) if lows else None,
            max(highs) if highs else None,
        )
    return entries


def writable_dir(path: Path) -> bool:
    """Whether a file can be created in the directory ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tokens-probe-", dir=path)
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


# -- the writer's tally ----------------------------------------------------------------------


class Tally:
    """What a dataset writer needs to write the token index of what it writes: each block's
    token count and each shard's smallest and largest id, counted as examples are added.

    ``field`` None: the examples themselves are the sequences (1-D integer numpy arrays or
    lists of ints); a name: the value under that key. ``required`` False (automatic): the
    first example that is not a sequence turns the tally off for good (``active`` False), and
    no index is written; True: it raises ``NotTokensError``.
    """

    def __init__(self, shard_size: int, block_size: int, field, required: bool) -> None:
        self.shard_size = shard_size
        self.block_size = block_size
        self.field = field
        self.required = required
        self.active = True
        self.shards: list = []  # per finished shard: (counts list, low, high)
        self._counts: list = []
        self._low = self._high = None
        self._seen = 0  # examples added

    def add(self, x) -> None:
        """Count one example (the writer's next)."""
        n, low, high = self._measure(x)
        if n is None:
            return
        k = self._seen % self.shard_size
        if k == 0 and self._seen:
            self._close_shard()
        if k % self.block_size == 0:
            self._counts.append(0)
        self._counts[-1] += n
        if n:
            self._low = low if self._low is None or low < self._low else self._low
            self._high = high if self._high is None or high > self._high else self._high
        self._seen += 1

    def _measure(self, x) -> tuple:
        field = self.field
        if field is not None:
            try:
                x = x[field]
            except Exception:
                return self._not_tokens(x)
        if type(x) is np.ndarray:
            if x.ndim == 1 and x.dtype.kind in "iu":
                if not len(x):
                    return 0, None, None
                return len(x), int(x.min()), int(x.max())
        elif type(x) is list and all(type(v) is int for v in x):
            if not x:
                return 0, None, None
            return len(x), min(x), max(x)
        return self._not_tokens(x)

    def _not_tokens(self, x) -> tuple:
        if self.required:
            from ._core._tokens_py import as_tokens

            as_tokens(x, self.field, f"example {self._seen} given to the writer")
        self.active = False
        return None, None, None

    def _close_shard(self) -> None:
        self.shards.append((self._counts, self._low, self._high))
        self._counts, self._low, self._high = [], None, None

    def entries(self, shard_dirs: list, sizes: list) -> list:
        """The ``ShardEntry`` of each finished shard (``shard_dirs``: their folders, in
        order, or each one's block offsets, its index.npy, as an array; ``sizes``: their
        example counts), once every example was added; reads each shard's index.npy."""
        if self._seen and (not self.shards or self._counts):
            self._close_shard()
        if not self.shards:
            self.shards.append(([], None, None))
        if len(shard_dirs) != len(self.shards):
            raise ValueError(f"{len(shard_dirs)} shards written, {len(self.shards)} counted")
        out = []
        for d, size, (counts, low, high) in zip(shard_dirs, sizes, self.shards):
            offsets = d if isinstance(d, np.ndarray) else np.load(Path(d) / "index.npy")
            out.append(
                ShardEntry(
                    size,
                    int(offsets[-1]),
                    offsets_digest(offsets),
                    np.array(counts, dtype=np.int64),
                    low,
                    high,
                )
            )
        return out


def covering_entries(path, field, sizes: list) -> list | None:
    """The entries of the token index at ``path`` when it is one of ``field`` whose shards
    are exactly those of ``sizes`` (one entry per shard, each of that many examples), in
    shard order; else None (no index there, a malformed one, another field, other shards).
    Reads the index alone: what grows a dataset's index without reading its shards."""
    try:
        if not os.path.isfile(path):
            return None
        index = TokenIndex(path)
    except TokenIndexError:
        return None
    if index.field != field or len(index.shards) != len(sizes):
        return None
    if [int(e) for e in index.shards["examples"]] != [int(s) for s in sizes]:
        return None
    return [index.entry(k) for k in range(len(sizes))]


def index_files(root) -> list:
    """The names of the token index files at the root of the local dataset ``root``."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("tokens.") and n.endswith(".idx"))


def field_of(path):
    """The field the token index at ``path`` was made for, or ``...`` when it is not one."""
    try:
        return TokenIndex(path).field
    except TokenIndexError:
        return ...


def index_dataset(root, field=None, progress=None) -> Path:
    """Build the token index of the local dataset at ``root`` and write it there (what
    ``convert --from flat-tokens`` does after converting); its path."""
    from .atlas import AtlasDataset

    with AtlasDataset(root) as ds:
        n = len(ds.shards)
        entries = build_entries(ds, list(range(n)), field, ds._backend, progress)
    path = Path(root) / index_name(field)
    write_index(path, field, [entries[k] for k in range(n)])
    return path
