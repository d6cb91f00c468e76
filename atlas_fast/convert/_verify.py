"""``verify=True``: every converted example read back and compared with the source read again."""

from __future__ import annotations

from dataclasses import dataclass

from ._compare import difference
from ._progress import Emitter, Progress

__all__ = ["VerifyError", "VerifyJob", "verify_run", "verify_source"]


class VerifyError(ValueError):
    """A converted example differs from the source's (``verify=True``)."""


@dataclass(frozen=True)
class VerifyJob:
    dataset: str
    label: str  # what errors call the dataset (DST, not the staging path)
    start: int  # index of this run's first example in the dataset
    parts: list


def verify_run(job: VerifyJob, worker) -> int:
    """Read the dataset's examples from ``job.start`` on and compare each with the source
    re-read; returns the number compared. A difference raises ``VerifyError``."""
    from .. import atlas

    progress = Emitter(worker.emit)
    with atlas.AtlasDataset(job.dataset) as ds:
        total = len(ds)
        index = job.start
        for part in job.parts:
            for number, expected in enumerate(part.read()):
                where = f"{job.label}: example {index} (example {number} of part {part.label})"
                if index >= total:
                    raise VerifyError(f"{where}: missing, the dataset holds {total} examples")
                found = difference(expected, ds[index])
                if found is not None:
                    raise VerifyError(f"{where} differs from the source: {found}")
                index += 1
                progress.example()
            progress.flush(part.nbytes)
    return index - job.start


def verify_source(pool, source, runs, counts, root, label, phase, progress) -> None:
    """Verify the dataset at ``root`` (``label``: DST's name for it) against ``source``, one
    task per run of parts (``runs``, whose parts hold ``counts`` examples) on the pool's
    workers; ``phase``: what the progress bar says."""
    tasks, start, i = [], 0, 0
    for run in runs:
        tasks.append((verify_run, VerifyJob(str(root), str(label), start, run)))
        start += sum(counts[i : i + len(run)])
        i += len(run)
    examples = sum(counts)
    bar = Progress(progress, sum(p.nbytes for p in source.parts), phase)
    try:
        compared = sum(pool.run(tasks, bar))
    finally:
        bar.close()
    from .. import atlas

    with atlas.AtlasDataset(root) as ds:
        stored = len(ds)
    if compared != examples or stored != examples:
        raise VerifyError(
            f"{label}: the converted dataset holds {stored} examples, the source {compared}"
        )
