"""webdataset tar shards and Megatron-Energon datasets as conversion sources.

A sample is what webdataset groups: consecutive tar members sharing a key (the member name up
to the first dot of its basename, directories kept: ``train/00042.seg.json`` has the key
``train/00042`` and the extension ``seg.json``), as a dict ``{"__key__": key, "__url__":
shard, ext: bytes, ...}`` with the extensions lower-cased, as ``webdataset`` gives them.
``__url__`` is the shard's path relative to the source (or the path given, for a single
tar), never a machine-specific absolute path. Members whose basename has no dot, and
``__*__`` metadata files at the archive's top level, are skipped as webdataset skips them.
Shards may be gzip-compressed (``.tar.gz``/``.tgz``, recognised by their content), as
webdataset reads them.

With ``decode=True`` the values of the extensions webdataset's basic decoders handle are
decoded: txt/text/transcript to ``str`` (UTF-8), cls/cls2/class/count/index/inx/id to
``int``, json/jsn with ``json.loads``, npy with ``numpy.load`` (no pickles). Only the last
dotted component counts: ``seg.json`` decodes as JSON.

A directory holding ``.nv-meta/split.yaml`` is an Energon dataset: one ``Source`` per split of
``split_parts`` (patterns brace-expanded, paths relative to the directory), with the
``exclude`` entries (``shards/x.tar`` whole, or ``shards/x.tar/KEY`` one sample) left out.
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import json
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from .._extras import require
from ._source import Part, Source, SourceError

__all__ = ["brace_expand", "energon_sources", "sources"]

_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_TEXT = {"txt", "text", "transcript"}
_INT = {"cls", "cls2", "class", "count", "index", "inx", "id"}
_JSON = {"json", "jsn"}
_NPY = {"npy"}
_NV_META = ".nv-meta"
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_GZIP_MAGIC = b"\x1f\x8b"


def sources(src, decode: bool = False, unpickle: bool = False) -> list[Source]:
    """The sources of a webdataset: ``src`` is a directory (every ``*.tar``, ``*.tar.gz`` and
    ``*.tgz`` below it, in sorted order, one ``Source``), one tar file, or a brace pattern of
    tar paths (``shards/s-{000..009}.tar``). A directory holding ``.nv-meta/split.yaml`` is
    read as an Energon dataset (see ``energon_sources``). ``unpickle``: give back the
    examples ``atlas-fast export --pickle`` stored pickled (a member ``KEY.__atlas_pickle__``)."""
    text = os.fspath(src)
    if "{" in text and not os.path.exists(text):
        tars = [Path(p) for p in brace_expand(text)]
        root = Path(os.path.commonpath([str(p.parent) for p in tars]))
        return [Source(_parts(root, tars, decode, unpickle=unpickle), None)]
    path = Path(text)
    if (path / _NV_META).is_dir():
        return energon_sources(path, decode=decode)
    if path.is_file():
        return [Source(_parts(path.parent, [path], decode, unpickle=unpickle), None)]
    if not path.is_dir():
        raise SourceError(f"{path}: no such file or directory")
    tars = sorted(
        (
            p
            for p in path.rglob("*")
            if p.name.endswith(_TAR_SUFFIXES) and p.is_file() and _NV_META not in p.parts
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    if not tars:
        raise SourceError(f"{path}: no .tar (or .tar.gz, .tgz) shards found")
    return [Source(_parts(path, tars, decode, unpickle=unpickle), None)]


def energon_sources(src, decode: bool = False) -> list[Source]:
    """One ``Source`` per split of ``src/.nv-meta/split.yaml``, in the order the file lists
    them, each named by its split, with its ``exclude`` entries left out."""
    root = Path(src)
    split_file = root / _NV_META / "split.yaml"
    if not split_file.is_file():
        raise SourceError(f"{split_file}: not found (an Energon dataset needs .nv-meta/split.yaml)")
    yaml = require("yaml", "wds", "reading an Energon split.yaml")
    try:
        spec = yaml.safe_load(split_file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SourceError(f"{split_file}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("split_parts"), dict):
        raise SourceError(f"{split_file}: no 'split_parts' mapping of split name to shards")
    exclude = spec.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise SourceError(f"{split_file}: 'exclude' is not a list of paths")
    excluded = {posixpath.normpath(e) for pattern in exclude for e in brace_expand(pattern)}
    out = []
    for split, patterns in spec["split_parts"].items():
        if isinstance(patterns, str):
            patterns = [patterns]
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise SourceError(f"{split_file}: split_parts.{split}: not a list of shard paths")
        names = [posixpath.normpath(n) for p in patterns for n in brace_expand(p)]
        skip_shards = frozenset(n for n in names if n in excluded)
        tars = [root / n for n in names if n not in skip_shards]
        out.append(Source(_parts(root, tars, decode, frozenset(excluded)), str(split)))
    return out


def _parts(root: Path, tars, decode, skip_samples=frozenset(), unpickle=False) -> list[Part]:
    parts = []
    for tar in tars:
        try:
            nbytes = tar.stat().st_size
        except OSError as exc:
            raise SourceError(f"{tar}: cannot read the shard: {exc.strerror}") from None
        url = tar.relative_to(root).as_posix() if tar.is_relative_to(root) else str(tar)
        skip = frozenset(e[len(url) + 1 :] for e in skip_samples if e.startswith(url + "/"))
        read = functools.partial(_read_samples, str(tar), url, decode, skip, unpickle)
        parts.append(Part(str(tar), nbytes, read))
    return parts


class _Tail:
    """A forward-only reader over ``raw`` that remembers the last bytes it gave out, so that
    the block where a streamed tar stops can be looked at after tarfile has read past it."""

    KEEP = 1 << 16  # more than tarfile reads ahead (one record, 10 KiB) plus a block

    def __init__(self, raw) -> None:
        self.raw = raw
        self.pos = 0  # bytes given out
        self.kept = b""  # the last of them, ending at pos

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.pos += len(data)
        self.kept = (self.kept + data)[-self.KEEP :]
        return data

    def block_at(self, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` (reading on to them if needed; fewer at the end)."""
        if self.pos < offset + size:
            self.read(offset + size - self.pos)
        start = offset - (self.pos - len(self.kept))
        if start < 0:
            raise ValueError(f"offset {offset} is no longer held")
        return self.kept[start : start + size]

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def _read_samples(path, url, decode, skip, unpickle) -> Iterator:
    """``_read_tar``'s samples; one holding a member ``KEY.__atlas_pickle__`` is the example
    pickled there (``unpickle``; else a ``SourceError``)."""
    from ._pickled import PICKLED, from_arrow_row

    for sample in _read_tar(path, url, decode, skip):
        if PICKLED in sample:
            key = sample["__key__"]
            where = lambda key=key: f"{path}: sample {key!r}"  # noqa: E731
            rest = set(sample) - {PICKLED, "__key__", "__url__"}
            if rest:
                raise SourceError(f"{where()}: a pickled example with other members: {rest}")
            sample = from_arrow_row({PICKLED: sample[PICKLED]}, unpickle, where)
        yield sample


def _read_tar(path: str, url: str, decode: bool, skip: frozenset) -> Iterator[dict]:
    """The samples of one tar shard (gzip-compressed or not), read as a stream, in member
    order."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise SourceError(f"{path}: cannot open the shard: {exc.strerror}") from None
    with f:
        gzipped = os.pread(f.fileno(), 2, 0) == _GZIP_MAGIC
        tail = _Tail(gzip.GzipFile(fileobj=f, mode="rb")) if gzipped else None
        try:
            tf = tarfile.open(fileobj=tail or f, mode="r|")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            kind = "not a gzip-compressed tar archive" if gzipped else "not a tar archive"
            raise SourceError(f"{path}: {kind}: {exc}") from None
        sample = None
        last = "the start"
        member = None
        try:
            for member in tf:
                where = f"member {member.name!r} at offset {member.offset}"
                if not member.isfile():
                    continue
                data = tf.extractfile(member).read()
                if len(data) != member.size:
                    raise SourceError(
                        f"{path}: {where}: truncated ({len(data)} of {member.size} bytes)"
                    )
                last = where
                name = member.name
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue
                match = _KEY_EXT.match(name)
                if match is None:
                    continue
                key, ext = match.group(1), match.group(2).lower()
                if sample is None or key != sample["__key__"]:
                    if sample is not None and sample["__key__"] not in skip:
                        yield sample
                    sample = {"__key__": key, "__url__": url}
                if ext in sample:
                    raise SourceError(f"{path}: {where}: a second {ext!r} file for key {key!r}")
                sample[ext] = _decode(path, where, ext, data) if decode else data
            # tarfile stops quietly at a zero block, at the end of the data and at a damaged
            # header alike: only a zero block is the archive's end.
            end = tf.offset
            if tail is None:
                block = os.pread(f.fileno(), tarfile.BLOCKSIZE, end)
            else:
                block = tail.block_at(end, tarfile.BLOCKSIZE)
                tail.drain()  # a damaged or cut gzip stream is found at its end
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            at = f"member {member.name!r} at offset {member.offset}" if member else "the start"
            what = (
                f"the gzip stream: {exc}"
                if gzipped and not isinstance(exc, tarfile.TarError)
                else str(exc)
            )
            raise SourceError(f"{path}: {at}: {what}") from None
        if len(block) < tarfile.BLOCKSIZE or block.count(0) != tarfile.BLOCKSIZE:
            problem = "truncated" if len(block) < tarfile.BLOCKSIZE else "not a tar header"
            raise SourceError(
                f"{path}: offset {end} (after {last}): {problem}: the archive does not end with "
                "an end-of-archive block"
            )
        if sample is not None and sample["__key__"] not in skip:
            yield sample


def _decode(path: str, where: str, ext: str, data: bytes):
    kind = ext.rsplit(".", 1)[-1]
    try:
        if kind in _TEXT:
            return data.decode("utf-8")
        if kind in _INT:
            return int(data)
        if kind in _JSON:
            return json.loads(data)
        if kind in _NPY:
            np = require("numpy", "wds", "decoding .npy members")
            return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError and numpy's are ValueErrors
        raise SourceError(f"{path}: {where}: cannot decode as {kind}: {exc}") from None
    return data


def brace_expand(pattern: str) -> list[str]:
    """Expand shell-style braces as webdataset and Energon do (the ``braceexpand`` package's
    rules): ``{a,b}`` alternatives, ``{00..10}`` and ``{0..10..2}`` integer ranges (zero-padded
    to the wider bound when a bound has a leading zero), ``{a..e}`` letter ranges, nested
    braces; a brace pair with neither a comma nor a range, like ``{x}``, is literal text. A
    backslash escapes the next character."""
    return [_unescape(s) for s in _expand(pattern)]


_RANGE = re.compile(
    r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$|^([A-Za-z])\.\.([A-Za-z])(?:\.\.(-?\d+))?$"
)


def _expand(text: str) -> list[str]:
    start = _find_open(text)
    if start < 0:
        return [text]
    end, commas = _find_close(text, start)
    if end < 0:  # an unmatched "{" is literal
        return [text[: start + 1] + rest for rest in _expand(text[start + 1 :])]
    head, body, tail = text[:start], text[start + 1 : end], text[end + 1 :]
    if commas:
        cuts = [start, *commas, end]
        pieces = [text[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        alternatives = [alt for piece in pieces for alt in _expand(piece)]
    else:
        alternatives = _range(body)
        if alternatives is None:  # literal braces; expand what follows them
            return [head + "{" + b + "}" + t for b in _expand(body) for t in _expand(tail)]
    return [head + alt + t for alt in alternatives for t in _expand(tail)]


def _find_open(text: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "{":
            return i
        i += 1
    return -1


def _find_close(text: str, start: int) -> tuple[int, list[int]]:
    """The index of the "}" matching ``text[start]``, and its top-level commas."""
    depth, commas, i = 0, [], start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i, commas
        elif c == "," and depth == 1:
            commas.append(i)
        i += 1
    return -1, []


def _range(body: str) -> list[str] | None:
    m = _RANGE.match(body)
    if m is None:
        return None
    if m.group(1) is not None:
        lo, hi, step = m.group(1), m.group(2), m.group(3)
        a, b = int(lo), int(hi)
        s = abs(int(step)) if step else 1
        s = s or 1
        width = max(len(lo), len(hi)) if _padded(lo) or _padded(hi) else 0
        values = range(a, b + 1, s) if a <= b else range(a, b - 1, -s)
        return [f"{v:0{width}d}" if width else str(v) for v in values]
    a, b, step = ord(m.group(4)), ord(m.group(5)), m.group(6)
    s = abs(int(step)) if step else 1
    s = s or 1
    values = range(a, b + 1, s) if a <= b else range(a, b - 1, -s)
    return [chr(v) for v in values]


def _padded(bound: str) -> bool:
    digits = bound.lstrip("-")
    return len(digits) > 1 and digits.startswith("0")


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)
