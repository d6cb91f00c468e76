"""The benchmark corpora: the one generator used by ``atlas-fast bench`` and benchmarks/.

Four corpora, built deterministically (three from the standard library's own ``.py`` sources,
text every Python installation carries; one from a seeded generator), so anyone can rebuild
exactly the same bytes with the same Python:

``documents``
    The sources, in sorted path order, cut at blank lines into Dolma-style documents of about
    2 KB: ``{"id", "text", "source", "added", "metadata"}``.
``tokens``
    The same text through a fixed word-level tokenizer (each distinct word or symbol maps to a
    uint16 id by CRC-32), cut into numpy ``uint16`` arrays of 2,048 tokens.
``blobs``
    ``{"id", "data"}`` with 100 KB of incompressible bytes (a SHAKE-256 stream keyed by the
    blob's number), standing in for already-compressed media.
``rows``
    Table rows: dicts of a few typed columns (int, str, float, bool, ``datetime.date``) drawn
    from a seeded ``random.Random``.

``examples(corpus, limit)`` returns a corpus's examples. ``dataset(...)`` writes them once,
into a cache directory, as an Atlas dataset of any strategy, block size and shard size: what
the scripts in benchmarks/ read. For ``atlas-fast bench``, ``build`` writes each corpus once
for every strategy (0-3) and block size (16, 100), plus the floor files: every example pickled
alone, end to end in one file, and the offsets (``floor.bin``, ``floor_offsets.npy``).
``manifest.json`` is written last: a cache directory with a manifest is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
import re
import shutil
import sys
import sysconfig
import time
import zlib
from pathlib import Path

__all__ = [
    "ALL_CONFIGS",
    "CORPORA",
    "DEFAULT_CORPORA",
    "Scale",
    "build",
    "dataset",
    "default_cache_dir",
    "examples",
    "fingerprint",
    "parse_configs",
    "rows",
    "stdlib_documents",
]

CORPORA = ("documents", "tokens", "blobs", "rows")
# What ``atlas-fast bench`` runs without --corpus (rows: on request, to keep the run short).
DEFAULT_CORPORA = ("documents", "tokens", "blobs")
STRATEGIES = (0, 1, 2, 3)
BLOCK_SIZES = (16, 100)
ALL_CONFIGS = tuple(f"s{s}b{b}" for s in STRATEGIES for b in BLOCK_SIZES)
TOKENS_PER_EXAMPLE = 2048
BLOB_BYTES = 100_000
DOC_TARGET_CHARS = 2048
ADDED = "2024-01-01T00:00:00.000Z"  # fixed, so the corpus is byte-for-byte reproducible
MANIFEST_VERSION = 1
_CONFIG_RE = re.compile(r"^s([0-3])b([1-9][0-9]*)$")


class Scale:
    """How many examples each corpus holds (``None``: all the stdlib yields)."""

    def __init__(self, name: str, documents=None, tokens=None, blobs=600, rows=50_000) -> None:
        self.name = name
        self.limits = {"documents": documents, "tokens": tokens, "blobs": blobs, "rows": rows}

    @classmethod
    def full(cls) -> Scale:
        return cls("full", documents=None, tokens=None, blobs=600, rows=50_000)

    @classmethod
    def quick(cls) -> Scale:
        return cls("quick", documents=3000, tokens=800, blobs=120, rows=5000)

    def key(self) -> str:
        """The cache sub-directory: the scale and the Python whose stdlib is the source."""
        parts = [self.name]
        if self.name == "custom":
            parts += [f"{k[0]}{v}" for k, v in self.limits.items()]
        parts.append("py" + platform.python_version())
        return "-".join(parts)


def default_cache_dir() -> Path:
    """``$ATLAS_FAST_CACHE``, else ``atlas_fast`` in the user's cache directory
    (``$XDG_CACHE_HOME``, default ``~/.cache``, as the XDG base directory spec says: an
    empty or relative value is ignored), then ``bench-VERSION``."""
    from .._version import __version__

    base = os.environ.get("ATLAS_FAST_CACHE")
    if base:
        root = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        cache = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        root = cache / "atlas_fast"
    return root / f"bench-{__version__}"


def parse_configs(text: str) -> list:
    """``"s0b16,s2b100"`` -> ``[(0, 16), (2, 100)]``; ``"all"`` -> every strategy and size."""
    if text.strip() == "all":
        return [(s, b) for s in STRATEGIES for b in BLOCK_SIZES]
    out = []
    for item in text.split(","):
        m = _CONFIG_RE.match(item.strip())
        if not m:
            raise ValueError(f"bad dataset configuration {item!r}: expected sNbM, e.g. s2b100")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


# -- the documents ------------------------------------------------------------------------------


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list:
    """The stdlib's .py files (no site-packages), as (relative posix path, path), sorted."""
    root = stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts and rel.parts[0] in ("site-packages", "dist-packages"):
            continue
        if path.is_file():
            files.append((rel.as_posix(), path))
    files.sort()
    return files


def _chunks(text: str):
    """Cut at blank lines into pieces of about DOC_TARGET_CHARS; yields (first line, text)."""
    parts = text.split("\n\n")
    line = 1
    start_line = 1
    current: list = []
    size = 0
    for part in parts:
        current.append(part)
        size += len(part) + 2
        if size >= DOC_TARGET_CHARS:
            chunk = "\n\n".join(current)
            yield start_line, chunk
            line = start_line + chunk.count("\n") + 2
            start_line = line
            current, size = [], 0
    if current:
        chunk = "\n\n".join(current)
        if chunk.strip():
            yield start_line, chunk


def stdlib_documents(limit=None):
    """Dolma-style documents from the stdlib sources, in a fixed order."""
    source = f"python-stdlib-{platform.python_version()}"
    n = 0
    for rel, path in stdlib_files():
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for number, (first_line, chunk) in enumerate(_chunks(text)):
            if limit is not None and n >= limit:
                return
            lines = chunk.count("\n") + 1
            yield {
                "id": f"{rel}#{number}",
                "text": chunk,
                "source": source,
                "added": ADDED,
                "metadata": {
                    "path": rel,
                    "chunk": number,
                    "lines": [first_line, first_line + lines - 1],
                    "bytes": len(chunk.encode("utf-8")),
                },
            }
            n += 1


_TOKEN_RE = re.compile(r"\w+|[^\w\s]|\s+")


def token_arrays(documents, limit=None):
    """uint16 arrays of TOKENS_PER_EXAMPLE word-level token ids of the documents' text."""
    import numpy as np

    vocab: dict = {}
    pending: list = []
    n = 0
    for doc in documents:
        for tok in _TOKEN_RE.findall(doc["text"]):
            tid = vocab.get(tok)
            if tid is None:
                tid = vocab[tok] = zlib.crc32(tok.encode("utf-8")) & 0xFFFF
            pending.append(tid)
        while len(pending) >= TOKENS_PER_EXAMPLE:
            if limit is not None and n >= limit:
                return
            yield np.array(pending[:TOKENS_PER_EXAMPLE], dtype=np.uint16)
            del pending[:TOKENS_PER_EXAMPLE]
            n += 1


def token_documents(copies: int = 1):
    """Whole stdlib source files as token documents (the ``tokens`` tokenizer, uint16 arrays,
    one per file, lengths from a few tokens to over 100,000), the files in sorted order,
    ``copies`` times over: what bench_tokens.py packs into rows."""
    import numpy as np

    vocab: dict = {}
    docs = []
    for _, path in stdlib_files():
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = []
        for tok in _TOKEN_RE.findall(text):
            tid = vocab.get(tok)
            if tid is None:
                tid = vocab[tok] = zlib.crc32(tok.encode("utf-8")) & 0xFFFF
            ids.append(tid)
        docs.append(np.array(ids, dtype=np.uint16))
    return [d for _ in range(copies) for d in docs]


def blobs(limit):
    for i in range(limit):
        data = hashlib.shake_256(b"atlas_fast bench blob %d" % i).digest(BLOB_BYTES)
        yield {"id": f"blob-{i:06d}", "data": data}


_COUNTRIES = ("DE", "FR", "US", "BR", "IN", "JP", "NG", "ES", "IT", "CA", "MX", "KR")


def rows(limit):
    """Table rows: ``{"id", "user", "country", "score", "clicks", "active", "day"}``."""
    import datetime
    import random

    rng = random.Random(20261123)
    first_day = datetime.date(2024, 1, 1)
    for i in range(limit):
        yield {
            "id": i,
            "user": f"user{rng.randrange(20_000):05d}",
            "country": rng.choice(_COUNTRIES),
            "score": round(rng.uniform(0, 100), 3),
            "clicks": rng.randrange(10_000),
            "active": rng.random() < 0.7,
            "day": first_day + datetime.timedelta(days=rng.randrange(730)),
        }


def fingerprint(corpus: str, example) -> str:
    """A short identity of an example, the same whichever reader returned it."""
    if corpus == "tokens":
        import numpy as np

        arr = np.asarray(example)
        return f"{arr.shape[0]}:" + ",".join(str(int(x)) for x in arr[:8])
    return str(example["id"])


# -- building -----------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (no dependency); silent when ``enabled`` is false."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream=None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._last = 0.0
        self._start = time.perf_counter()
        self.tty = enabled and self.stream.isatty()

    def set(self, label: str) -> None:
        self.label = label
        if self.tty:
            self._draw(force=True)
        elif self.enabled:
            elapsed = time.perf_counter() - self._start
            self.stream.write(f"[{self.done}/{self.total}] {elapsed:6.1f}s {label}\n")
            self.stream.flush()

    def step(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.perf_counter()
        if not force and now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        frac = min(self.done / self.total, 1.0)
        width = 30
        filled = int(frac * width)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r[{bar}] {frac * 100:5.1f}% {now - self._start:6.1f}s {self.label[:60]:<60}"
        self.stream.write(line)
        self.stream.flush()

    def close(self, message: str = "") -> None:
        if self.tty:
            self._draw(force=True)
            self.stream.write("\n")
        if self.enabled and message:
            self.stream.write(message + "\n")
            self.stream.flush()


def shard_size(n: int) -> int:
    # Three shards or so, but at least 700 examples a shard, so block size 100 still has the
    # 7 blocks that dictionary training needs (smaller corpora fall back to strategy 1).
    return max(-(-n // 3), min(n, 700), 1)


def _write_floor(examples, directory: Path):
    import numpy as np

    offsets = [0]
    digest = hashlib.sha256()
    with open(directory / "floor.bin", "wb") as f:
        for ex in examples:
            data = pickle.dumps(ex, protocol=pickle.HIGHEST_PROTOCOL)
            f.write(data)
            digest.update(data)
            offsets.append(offsets[-1] + len(data))
    np.save(directory / "floor_offsets.npy", np.array(offsets, dtype=np.uint64))
    return offsets[-1], digest.hexdigest()


def _write_atlas(examples, path: Path, strategy: int, block_size: int, shard=None) -> dict:
    import warnings

    from ..writer import AtlasDatasetWriter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # dictionary fallback: recorded below
        writer = AtlasDatasetWriter(
            path,
            shard_size=shard or shard_size(len(examples)),
            block_size=block_size,
            compression_strategy=strategy,
        )
        with writer:
            for ex in examples:
                writer.add_example(ex)
    meta = json.loads((path / "meta.json").read_text())
    disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {
        "path": str(path),
        "strategy": strategy,
        "stored_strategy": meta["compression_strategy"],
        "block_size": block_size,
        "shards": len(meta["shard_sizes"]),
        "disk_bytes": disk,
    }


def examples(corpus: str, limit=None) -> list:
    """The first ``limit`` examples of a corpus (``None``: all the stdlib yields; blobs 600,
    rows 50,000), the same list on every call with the same Python."""
    if corpus == "documents":
        return list(stdlib_documents(limit))
    if corpus == "tokens":
        return list(token_arrays(stdlib_documents(None), limit))
    if corpus == "blobs":
        return list(blobs(limit if limit is not None else 600))
    if corpus == "rows":
        return list(rows(limit if limit is not None else 50_000))
    raise ValueError(f"unknown corpus {corpus!r}: one of {', '.join(CORPORA)}")


def _load_examples(corpus: str, scale: Scale):
    return examples(corpus, scale.limits[corpus])


def dataset(
    cache_dir, corpus: str, count, strategy: int, block_size: int, shard_size=None, progress=None
) -> Path:
    """An Atlas dataset of ``examples(corpus, count)``, written once into ``cache_dir``.

    ``shard_size`` defaults to ``shard_size(len(examples))`` (three shards or so). The dataset
    lives in a directory named after every parameter and the Python whose stdlib is the
    source; it is written in a temporary directory and renamed into place when complete.
    """
    shard = "auto" if shard_size is None else str(shard_size)
    name = f"{corpus}-n{count or 'all'}-s{strategy}b{block_size}-sh{shard}"
    root = Path(cache_dir) / f"datasets-py{platform.python_version()}" / name
    if (root / "meta.json").exists():
        return root
    if progress:
        progress(f"writing {name} into {root.parent}")
    data = _memo_examples(corpus, count)
    tmp = root.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _write_atlas(data, tmp, strategy, block_size, shard_size)
    tmp.rename(root)
    return root


_MEMO: dict = {}


def _memo_examples(corpus: str, count):
    """``examples(corpus, count)``, kept for the next dataset of the same corpus (one at most)."""
    key = (corpus, count)
    if key not in _MEMO:
        _MEMO.clear()
        _MEMO[key] = examples(corpus, count)
    return _MEMO[key]


def build(cache_dir, scale: Scale, configs, corpora=DEFAULT_CORPORA, progress=True, rebuild=False):
    """Build (or reuse) the corpora and their Atlas datasets; returns the manifest dict.

    The cache lives in ``cache_dir / scale.key()``. What is missing is built; what a previous
    run built with the same parameters is reused. Every corpus is built in a temporary
    directory and renamed into place when complete.
    """
    root = Path(cache_dir) / scale.key()
    root.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "manifest.json"
    manifest = {}
    if manifest_path.exists() and not rebuild:
        try:
            manifest = json.loads(manifest_path.read_text())
        except ValueError:
            manifest = {}
        if manifest.get("version") != MANIFEST_VERSION:
            manifest = {}
    if rebuild:
        for corpus in corpora:
            shutil.rmtree(root / corpus, ignore_errors=True)
    manifest.setdefault("version", MANIFEST_VERSION)
    manifest.setdefault("scale", scale.key())
    manifest.setdefault("python", platform.python_version())
    manifest.setdefault("stdlib", str(stdlib_root()))
    manifest.setdefault("corpora", {})

    todo = []
    for corpus in corpora:
        entry = manifest["corpora"].get(corpus)
        have = set(entry["datasets"]) if entry else set()
        missing = [(s, b) for s, b in configs if f"s{s}b{b}" not in have]
        if entry is None or missing:
            todo.append((corpus, entry, missing))
    if not todo:
        return manifest

    steps = sum(1 + len(missing) for _, entry, missing in todo)
    bar = Progress(steps, "building the benchmark corpus", enabled=progress)
    bar.set(f"building the corpus in {root}")
    for corpus, entry, missing in todo:
        directory = root / corpus
        bar.set(f"{corpus}: reading the stdlib sources")
        examples = _load_examples(corpus, scale)
        if entry is None:
            shutil.rmtree(directory, ignore_errors=True)
            tmp = root / f".{corpus}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            payload, digest = _write_floor(examples, tmp)
            tmp.rename(directory)
            entry = {
                "examples": len(examples),
                "payload_bytes": payload,
                "sha256": digest,
                "floor": str(directory / "floor.bin"),
                "floor_offsets": str(directory / "floor_offsets.npy"),
                "datasets": {},
            }
            manifest["corpora"][corpus] = entry
        bar.step()
        for strategy, block_size in missing:
            name = f"s{strategy}b{block_size}"
            bar.set(f"{corpus}: writing Atlas {name}")
            final = directory / "atlas" / name
            tmp = directory / "atlas" / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            info = _write_atlas(examples, tmp, strategy, block_size)
            tmp.rename(final)
            info["path"] = str(final)
            entry["datasets"][name] = info
            bar.step()
        _save_manifest(manifest_path, manifest)
        del examples
    bar.close(f"corpus ready in {root}")
    return manifest


def _save_manifest(path: Path, manifest: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, path)


DESCRIPTIONS = {
    "documents": "Dolma-style documents {id, text, source, added, metadata} of ~2 KB cut from "
    "the stdlib's .py sources",
    "tokens": f"numpy uint16 arrays of {TOKENS_PER_EXAMPLE} word-level token ids of the same text",
    "blobs": f"{{id, data}} with {BLOB_BYTES // 1000} KB of incompressible bytes (SHAKE-256), "
    "like already-compressed media",
    "rows": "table rows {id, user, country, score, clicks, active, day}: int, str, float, bool "
    "and datetime.date columns from a seeded generator",
}
