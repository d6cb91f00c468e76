"""``atlas-fast info PATH``: describe a dataset or one shard.

Shards, examples, strategy, block size, bytes on disk and the compression ratio (decoded
bytes / stored bytes of data.bin). The ratio is estimated from a sample of blocks spread over
the dataset (``--sample N``, default 64), or measured on every block with ``--exact``. Nothing
is unpickled. Token counts come from the dataset's token index (``tokens.idx``, at its root
or in the user cache folder ``TokenSequences`` uses) when it has one: the file alone is read,
none is ever built. Every shard that can be read is described; each problem met is reported on
standard error (and in ``--json``'s ``problems``) and the exit status is then 1. Run
``atlas-fast verify`` for a full check.

PATH may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://`` or another
fsspec scheme), read as the readers read it; its bytes on disk are then not known (nothing is
listed) and reported as such.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._common import add_dataset_arguments, check_path, print_json, usage_error

__all__ = ["add_arguments", "run", "info"]


def add_arguments(parser) -> None:
    add_dataset_arguments(parser, "description")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--exact", action="store_true", help="decode every block for the compression ratio"
    )
    group.add_argument(
        "--sample",
        type=int,
        default=64,
        metavar="N",
        help="blocks decoded to estimate the compression ratio (default 64)",
    )


def _spread(total: int, wanted: int) -> list:
    """``wanted`` indices spread evenly over ``range(total)`` (all of them if fewer)."""
    if wanted >= total:
        return list(range(total))
    return sorted({(k * total) // wanted for k in range(wanted)})


def info(path, *, exact=False, sample=64, readers=None) -> dict:
    """Describe the dataset or shard at ``path`` (a directory or a URL): every shard that can
    be described.

    What cannot be read is reported, not raised: ``problems`` (dicts with ``file``,
    ``block``, ``kind`` and ``message``, as ``verify``'s) and ``ok`` (no problem found).
    A shard whose meta.json reads is described (its ``data_bytes`` None when its index
    does not read); a root ``shard_sizes`` that disagrees with a shard is a problem, as it is
    when reading. ``readers`` is the module whose reader classes decode (default
    ``atlas_fast.atlas``). ``disk_bytes`` is None for a URL.
    """
    if readers is None:
        from .. import atlas as readers
    from .._errors import AtlasFormatError, StorageError
    from .._format import DATA_FILE, INDEX_FILE, CompressionStrategy, block_count
    from ..storage._dataset import is_remote, to_local
    from .verify import _problem, _record, lacks_shared_dict, open_target, read_shard

    remote = is_remote(path)
    path = path if remote else Path(to_local(path))
    problems: list = []
    target = open_target(path, problems)
    strategy = target.metadata.compression_strategy if target.metadata is not None else None

    rows = []
    made = {}  # shard number -> what a token index entry records of it (examples, blocks, ...)
    blocks = []  # (shard reader, its files, block, stored bytes) for the ratio
    shards = []  # the readers made (they open their files on first use), all closed at the end
    try:
        for shard_dir in target.shard_dirs:
            meta = read_shard(target, shard_dir, problems)
            if meta is None:
                continue
            if target.kind == "shard":
                strategy = meta.compression_strategy
            n_blocks = block_count(meta.stored_examples, meta.block_size)
            row = {
                "shard": str(shard_dir),
                "examples": meta.stored_examples,
                "blocks": n_blocks,
                "block_size": meta.block_size,
                "compression_strategy": meta.compression_strategy,
                "compression_level": meta.compression_level,
                "data_bytes": None,
                "disk_bytes": None,
            }
            rows.append(row)
            _record(
                problems,
                shard_dir.where,
                None,
                lambda r=row, d=shard_dir: r.update(disk_bytes=d.disk_bytes()),
            )
            try:
                offsets = shard_dir.offsets(meta)
            except (AtlasFormatError, StorageError) as exc:
                problems.append(_problem(shard_dir.file(INDEX_FILE), None, exc))
                continue
            row["data_bytes"] = int(offsets[-1])
            if shard_dir.name.isascii() and shard_dir.name.isdigit():
                made[int(shard_dir.name)] = (row, _made_of(meta.stored_examples, offsets))
            if lacks_shared_dict(target, shard_dir, meta, problems, "read"):
                continue
            try:
                shard = shard_dir.reader(readers, target.dict_bytes)
            except Exception as exc:  # AtlasFormatError; anything else is reported too
                problems.append(_problem(shard_dir.where, None, exc))
                continue
            shards.append(shard)
            blocks.extend(
                (shard, shard_dir, b, int(offsets[b + 1] - offsets[b])) for b in range(n_blocks)
            )

        chosen = blocks if exact else [blocks[k] for k in _spread(len(blocks), max(0, sample))]
        stored_sum = decoded_sum = decoded_blocks = 0
        current = None  # the shard whose blocks are being decoded; chosen is in shard order
        for shard, files, b, size in chosen:
            if shard is not current:
                if current is not None:
                    current.close()  # its files, before the next shard's are opened
                current = shard
            data_path = files.file(DATA_FILE)
            try:
                decoded = len(shard._block_bytes(b))
            except Exception as exc:  # AtlasFormatError; anything else is reported too
                problems.append(_problem(data_path, b, exc))
                continue
            stored_sum += size
            decoded_sum += decoded
            decoded_blocks += 1
    finally:
        for shard in shards:
            shard.close()

    root_files = 0
    if target.kind == "dataset" and not remote:
        try:
            root_files = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        except OSError as exc:
            problems.append(_problem(path, None, exc))
    block_sizes = sorted({r["block_size"] for r in rows})
    n_blocks = sum(r["blocks"] for r in rows)
    return {
        "path": str(path),
        "kind": target.kind,
        "ok": not problems,
        "shards": len(rows),
        "examples": sum(r["examples"] for r in rows),
        "blocks": n_blocks,
        "compression_strategy": None if strategy is None else int(strategy),
        "compression_strategy_name": (
            None if strategy is None else CompressionStrategy(strategy).name
        ),
        "block_size": block_sizes[0] if len(block_sizes) == 1 else block_sizes,
        "data_bytes": sum(r["data_bytes"] or 0 for r in rows),
        "disk_bytes": None if remote else root_files + sum(r["disk_bytes"] or 0 for r in rows),
        "compression_ratio": (decoded_sum / stored_sum) if stored_sum else None,
        "ratio_exact": decoded_blocks == n_blocks,
        "ratio_blocks": decoded_blocks,
        "shard_details": rows,
        "token_indexes": _token_indexes(path, target.kind, made, len(rows)),
        "problems": problems,
    }


def _made_of(examples: int, offsets) -> tuple:
    """What a token index's entry records of a shard: examples, blocks, data.bin's size and
    the digest of its block offsets."""
    from .._token_index import offsets_digest

    return (examples, len(offsets) - 1, int(offsets[-1]), offsets_digest(offsets))


def _smallest_dtype(low: int, high: int) -> str:
    import numpy as np

    kinds = ("uint8", "uint16", "uint32", "uint64") if low >= 0 else ("int8", "int16", "int32")
    for name in kinds:
        info = np.iinfo(name)
        if info.min <= low and high <= info.max:
            return name
    return "int64"


def _token_indexes(path, kind: str, made: dict, n_shards: int) -> list:
    """The token indexes of the dataset at ``path`` (at its root, and in the user cache
    folder ``TokenSequences`` saves them in when the root is not writable), read and never
    built: per index its field, tokens, ids, and per shard its tokens, whether the entry
    still matches the shard (``current``), and whether the shard was rewritten with as many
    examples (``rewritten``: ``TokenSequences`` refuses it until ``index="rebuild"``; an
    entry that is only out of date is brought up to date when the dataset is next opened).
    An index that does not read has ``error``."""
    from .._errors import TokenIndexError
    from .._token_index import _NO_ID, TokenIndex, cache_folder

    if kind != "dataset":
        return []
    folders = [cache_folder(path)]
    if not isinstance(path, str):  # a local root
        folders.insert(0, path)
    found = []
    for folder in folders:
        try:
            files = sorted(folder.glob("tokens*.idx"))
        except OSError:
            continue
        for file in files:
            try:
                index = TokenIndex(file)
            except TokenIndexError as exc:
                found.append({"index": str(file), "error": str(exc)})
                continue
            records = index.shards
            shards = []
            for number, (row, now) in sorted(made.items()):
                if number >= len(records):  # added since: the next open adds its entry
                    shards.append(
                        {
                            "shard": row["shard"],
                            "tokens": None,
                            "current": False,
                            "rewritten": False,
                        }
                    )
                    continue
                r = records[number]
                then = (int(r["examples"]), int(r["blocks"]), int(r["data_bytes"]))
                low, high = int(r["low"]), int(r["high"])
                none = (low, high) == _NO_ID
                shards.append(
                    {
                        "shard": row["shard"],
                        "tokens": int(r["tokens"]),
                        "low": None if none else low,
                        "high": None if none else high,
                        "current": then == now[:3] and bytes(r["digest"]) == now[3],
                        # as many examples, other files: refused at read until a rebuild
                        "rewritten": then[0] == now[0]
                        and (then[1:] != now[1:3] or bytes(r["digest"]) != now[3]),
                    }
                )
            has = records["tokens"] > 0
            low = int(records["low"][has].min()) if has.any() else None
            high = int(records["high"][has].max()) if has.any() else None
            found.append(
                {
                    "index": str(file),
                    "field": index.field,
                    "tokens": int(index.total),
                    "blocks": len(index.cum) - 1,
                    "low": low,
                    "high": high,
                    "smallest_dtype": None if low is None else _smallest_dtype(low, high),
                    "current": len(records) == n_shards
                    and len(shards) == n_shards
                    and all(s["current"] for s in shards),
                    "shards": shards,
                }
            )
    return found


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def run(args) -> int:
    path = check_path("info", args.path)
    if path is None:
        return 2
    if args.sample < 1:
        return usage_error("info", "--sample must be at least 1")
    report = info(path, exact=args.exact, sample=args.sample)
    # Nothing read (the root's meta.json, or the shard's, unreadable: absent, access
    # denied ...): no description of zeros, only the problems.
    nothing = report["compression_strategy"] is None and not report["shards"]
    if args.json:
        print_json(report)
    elif not nothing:
        _print(report)
    problems = report["problems"]
    for problem in problems:
        print(f"atlas-fast info: problem: {problem['message']}", file=sys.stderr)
    if nothing:
        print(f"atlas-fast info: {path}: nothing could be read to describe", file=sys.stderr)
        return 1
    if problems:
        print(
            f"atlas-fast info: {_count(len(problems), 'problem')} found; the description covers "
            f"what could be read (atlas-fast verify {path} checks every block)",
            file=sys.stderr,
        )
        return 1
    return 0


def _token_lines(report: dict) -> list:
    """The ``tokens:`` lines: one per token index, or that there is none."""
    indexes = report.get("token_indexes", [])
    if not indexes:
        return ["no token index"]
    lines = []
    for entry in indexes:
        file = Path(entry["index"])
        if "error" in entry:
            lines.append(f"{file} does not read (built again on first use): {entry['error']}")
            continue
        where = file.name if file.parent == Path(report["path"]) else str(file)
        text = f"{entry['tokens']} in {where}"
        if entry["field"] is not None:
            text += f" (field {entry['field']!r})"
        if entry["low"] is not None:
            text += f", ids {entry['low']}-{entry['high']} ({entry['smallest_dtype']})"
        rewritten = sum(s["rewritten"] for s in entry["shards"])
        if rewritten:
            text += (
                f"; {_count(rewritten, 'shard')} rewritten since it was made (TokenSequences "
                "refuses them until index='rebuild')"
            )
        elif not entry["current"]:
            text += "; out of date (brought up to date when TokenSequences next opens it)"
        lines.append(text)
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _print(report: dict) -> None:
    sizes = report["block_size"]
    if isinstance(sizes, int):
        blocks = f"{report['blocks']} (block size {sizes})"
    elif sizes:
        blocks = f"{report['blocks']} (block sizes {', '.join(map(str, sizes))})"
    else:
        blocks = str(report["blocks"])
    strategy = report["compression_strategy"]
    if strategy is not None:
        strategy = f"{strategy} ({report['compression_strategy_name']})"
    else:
        strategy = "unknown (the dataset's meta.json does not read)"
    ratio = report["compression_ratio"]
    if ratio is None:
        compression = "n/a (no blocks)" if not report["blocks"] else "n/a (no block decoded)"
    else:
        how = "exact" if report["ratio_exact"] else f"sampled over {report['ratio_blocks']} blocks"
        compression = f"{ratio:.2f}x decoded/stored ({how})"
    print(f"{report['path']} ({report['kind']})")
    print(f"  shards:       {report['shards']}")
    print(f"  examples:     {report['examples']}")
    print(f"  blocks:       {blocks}")
    for line in _token_lines(report):
        print(f"  tokens:       {line}")
    print(f"  strategy:     {strategy}")
    print(f"  data.bin:     {_size(report['data_bytes'])}")
    if report["disk_bytes"] is None:
        print("  on disk:      n/a (in object storage)")
    else:
        print(f"  on disk:      {_size(report['disk_bytes'])}")
    print(f"  compression:  {compression}")
