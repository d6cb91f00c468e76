"""``--from hf``: a Hugging Face ``datasets`` directory written by ``save_to_disk``, or Arrow files.

Each row becomes one example: a dict of its columns as stored in Arrow (``to_pylist``), the
values ``datasets`` gives with no format set, except that features that ``datasets`` decodes
on access (``Image``, ``Audio``) stay in their stored form, ``{"bytes": ..., "path": ...}``.
A ``DatasetDict`` directory (``dataset_dict.json``) gives one Atlas dataset per split, under
DST/<split>. A ``Dataset`` directory (``state.json``) is read in the order of its data files;
a directory of ``.arrow`` files (or one file) in sorted order. Files larger than 4 MB are cut
into parts of whole record batches (a part of a stream starts at its first batch's message),
so ``--workers`` can share them. Each part knows its rows.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from .._format import json_object
from ._arrow import group_ranges, pyarrow, rows
from ._files import find_files
from ._source import Part, Source, SourceError

__all__ = ["sources"]


def _json(path: Path) -> dict:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read it ({exc})") from None
    return json_object(text, path, SourceError)


def _data_files(directory: Path) -> list:
    state_path = directory / "state.json"
    if not state_path.is_file():
        return find_files(directory, (".arrow",), "Arrow")
    entries = _json(state_path).get("_data_files")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries
    ):
        raise SourceError(f"{state_path}: '_data_files' is not a list of {{'filename': ...}}")
    files = [directory / e["filename"] for e in entries]
    for path in files:
        if not path.is_file():
            raise SourceError(f"{path}: missing (listed in {state_path})")
    return files


class _Stream:
    """An Arrow IPC stream (what ``datasets`` writes) or file, memory-mapped."""

    def __init__(self, path: Path):
        pa = pyarrow("hf", "converting Hugging Face datasets")
        self.path = path
        self.is_stream = True
        try:
            self._map = pa.memory_map(str(path))
            try:
                reader = pa.ipc.open_stream(self._map)
                self.batches = iter(reader)
            except pa.ArrowInvalid:
                self._map.seek(0)
                reader = pa.ipc.open_file(self._map)
                self.batches = self.file_batches(0, reader.num_record_batches, reader)
                self.is_stream = False
                self._reader = reader
            self.schema = reader.schema
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{path}: not a readable Arrow file ({exc})") from None

    @staticmethod
    def file_batches(start: int, stop: int, reader):
        for i in range(start, stop):
            yield reader.get_batch(i)

    def record_batch_offsets(self):
        """A stream's record batches ``(offset of its message, batch)``, read message by
        message from the schema's end, or None when it has dictionary batches (a batch
        then needs the dictionaries before it: it is read from the start)."""
        pa = pyarrow("hf", "converting Hugging Face datasets")
        if not self.is_stream:
            return None
        source = self._map
        source.seek(0)
        pa.ipc.read_message(source)  # the schema
        found = []
        while True:
            offset = source.tell()
            try:
                message = pa.ipc.read_message(source)
                if message.type != "record batch":
                    return None
                found.append((offset, pa.ipc.read_record_batch(message, self.schema)))
            except EOFError:  # the end-of-stream marker, or the end of the file
                return found
            except (pa.ArrowException, OSError) as exc:
                raise SourceError(
                    f"{self.path}: record batch {len(found)}: cannot read ({exc})"
                ) from None

    def batches_from(self, offset: int):
        """A stream's record batches from the message at ``offset`` (see above)."""
        pa = pyarrow("hf", "converting Hugging Face datasets")
        self._map.seek(offset)
        while True:
            try:
                message = pa.ipc.read_message(self._map)
            except EOFError:
                return
            yield pa.ipc.read_record_batch(message, self.schema)

    def close(self):
        self._map.close()


def _parts(path: Path, unpickle: bool = False) -> list:
    pa = pyarrow("hf", "converting Hugging Face datasets")
    stream = _Stream(path)
    sizes, counts, offsets = [], [], None
    try:
        found = stream.record_batch_offsets()
        if found is not None:
            offsets = [offset for offset, _ in found]
            batches = (batch for _, batch in found)
        else:
            stream.close()
            stream = _Stream(path)
            batches = stream.batches
        for batch in batches:
            sizes.append(batch.nbytes)
            counts.append(batch.num_rows)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path}: record batch {len(sizes)}: cannot read ({exc})") from None
    finally:
        stream.close()
    size = path.stat().st_size
    ranges = group_ranges(sizes)
    if len(ranges) <= 1:
        read = partial(_read, str(path), None, 0, None, unpickle)
        return [Part(str(path), size, read, sum(counts))]
    total = sum(sizes) or 1
    return [
        Part(
            f"{path} (record batches {start}-{stop - 1})",
            size * sum(sizes[start:stop]) // total,
            partial(
                _read,
                str(path),
                (start, stop),
                sum(counts[:start]),
                None if offsets is None else offsets[start],
                unpickle,
            ),
            sum(counts[start:stop]),
        )
        for start, stop in ranges
    ]


def _source(directory: Path, split=None, unpickle=False) -> Source:
    parts = [part for path in _data_files(directory) for part in _parts(path, unpickle)]
    return Source(parts, split)


def sources(src, unpickle: bool = False) -> list:
    """One source per split of a DatasetDict, else one; parts by file or batch range.
    ``unpickle``: give back the examples ``atlas-fast export --pickle`` stored pickled."""
    src = Path(src)
    if src.is_file():
        return [Source(_parts(src, unpickle))]
    if not src.is_dir():
        raise SourceError(f"{src}: no such file or directory")
    dict_path = src / "dataset_dict.json"
    if dict_path.is_file():
        splits = _json(dict_path).get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise SourceError(f"{dict_path}: 'splits' is not a list of names")
        for split in splits:
            if "/" in split or split in ("", ".", "..") or not (src / split).is_dir():
                raise SourceError(f"{src / split}: split {split!r} of {dict_path} is missing")
        return [_source(src / split, split, unpickle) for split in splits]
    return [_source(src, None, unpickle)]


def _read(path: str, batches, first_row: int, offset=None, unpickle=False):
    """Rows of the record batches ``batches`` (``(start, stop)``, None: all) of an Arrow
    file; ``offset``: where the message of a stream's batch ``start`` begins, if known."""
    import itertools

    stream = _Stream(Path(path))
    try:
        if batches is None:
            selected = stream.batches
        elif not stream.is_stream:  # a file: its batches by number
            selected = stream.file_batches(*batches, stream._reader)
        elif offset is not None:
            selected = itertools.islice(stream.batches_from(offset), batches[1] - batches[0])
        else:
            selected = itertools.islice(stream.batches, *batches)
        yield from rows(selected, lambda done: f"{path}: row {first_row + done}", unpickle)
    finally:
        stream.close()
