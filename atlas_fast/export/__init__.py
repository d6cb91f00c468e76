"""``atlas-fast export``: an Atlas dataset written out in another format (see docs/export.md).

The mirror of ``atlas_fast.convert``: ``export(src, dst, to)`` reads the dataset at ``src``
(a path or a URL) with every worker process and writes it to ``dst`` as Parquet, JSON lines,
a Hugging Face ``datasets`` directory, webdataset tar shards or a MosaicML MDS directory;
``convert`` reads each of them back as the same examples.
"""

from __future__ import annotations

from .._checks import check_int
from ..convert._pickled import PICKLED
from ._holds import ExportError
from ._run import TARGETS, ExportSummary

__all__ = [
    "PICKLED",
    "TARGETS",
    "ExportError",
    "ExportSummary",
    "export",
    "export_hf",
    "export_jsonl",
    "export_mds",
    "export_parquet",
    "export_webdataset",
]


def export(
    src,
    dst,
    to,
    *,
    workers=None,
    progress=None,
    overwrite=False,
    pickle=False,
    storage_options=None,
    trusted=True,
    allowed_globals=(),
    staging_dir=None,
):
    """Export the Atlas dataset at ``src`` to ``dst`` in format ``to`` (a key of ``TARGETS``:
    ``"parquet"``, ``"jsonl"``, ``"hf"``, ``"webdataset"``, ``"mds"``); returns an
    ``ExportSummary``.

    ``src`` is a dataset root, a path or a URL (``s3://``, ``gs://``, ``az://``,
    ``https://``...; ``storage_options``, ``trusted`` and ``allowed_globals`` as for
    ``AtlasDataset``). ``dst`` is the directory to write: it must be absent or empty unless
    ``overwrite=True``. The files are written into a staging directory next to it and moved in
    at the end (with ``overwrite``, exchanged with what was there, at once on Linux), so
    ``dst`` is complete or as it was: on any error or interrupt the staging directory is
    removed. ``dst`` may be a URL: the files are written into a temporary directory under
    ``staging_dir`` (default: the system's), then uploaded, the target's index
    (``state.json``, ``index.json``) last; objects already under it are refused unless
    ``overwrite=True``, which deletes them just before the upload (an export that fails
    before leaves them); a failed upload deletes what it put.

    ``workers=N``: the cores to use in total, N processes each writing the parts of the
    dataset it takes (a shard, or a piece of one when shards are fewer than the processes);
    None is the usable cores, at most 8. The files come out in the dataset's order whatever N.
    ``progress``: True for a tqdm bar on stderr, or a callable given ``(examples, 0)``
    increments.

    An example the target cannot hold exactly (see docs/export.md: what ``convert`` would not
    give back as the same types and values, such as an arbitrary object into Parquet) raises
    ``ExportError`` naming the example (its index, its shard) and the type in the way, and
    nothing is written; ``pickle=True`` stores such examples whole, pickled, in the field
    ``PICKLED`` instead (``convert(..., unpickle=True)`` gives them back).
    """
    from ..writer import default_workers
    from ._run import run_export, target_module

    target_module(to)  # an unknown target, before anything else
    workers = default_workers() if workers is None else check_int("workers", workers, minimum=1)
    reader = {"trusted": trusted, "allowed_globals": allowed_globals}
    if storage_options is not None:
        reader["storage_options"] = storage_options
    return run_export(
        src,
        dst,
        to,
        workers=workers,
        progress=progress,
        overwrite=bool(overwrite),
        options={"pickle": bool(pickle)},
        reader=reader,
        staging_dir=staging_dir,
    )


def _for_target(target: str):
    def export_target(src, dst, **options):
        return export(src, dst, target, **options)

    export_target.__name__ = export_target.__qualname__ = f"export_{target}"
    export_target.__doc__ = (
        f"``export(src, dst, {target!r}, **options)``: the Atlas dataset at ``src`` written to "
        f"``dst`` as {target} (options: see ``export``)."
    )
    return export_target


export_parquet = _for_target("parquet")
export_jsonl = _for_target("jsonl")
export_hf = _for_target("hf")
export_webdataset = _for_target("webdataset")
export_mds = _for_target("mds")
