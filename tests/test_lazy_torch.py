"""``import atlas_fast`` does not import torch; looking up a reader or sampler does, and the
classes are then torch's subclasses as the reference's were. Each case runs in a fresh
interpreter (this one has long imported torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[1])


def run(code: str, backend: str, *argv: str) -> str:
    """``code`` (or, with ``argv``, the script ``code`` names) in a fresh interpreter
    importing this checkout's atlas_fast with ``backend``; its stdout."""
    environ = dict(os.environ)
    environ.pop("ATLAS_FAST_NO_TORCH", None)
    environ.pop("ATLAS_FAST_NO_EXTENSIONS", None)
    if backend == "python":
        environ["ATLAS_FAST_NO_EXTENSIONS"] = "1"
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, *([code] if argv else ["-c", textwrap.dedent(code)]), *argv],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_writes_and_the_cli_do_not_import_torch(tmp_path, backend):
    """The package, every module a plain use imports, writing a dataset, and the command line
    run as a program (info and verify read the dataset) leave torch unimported; ``dir`` lists
    the lazily made names."""
    out = run(
        f"""
        import sys
        import atlas_fast
        import atlas_fast.atlas, atlas_fast.writer, atlas_fast.sampler, atlas_fast.mix
        import atlas_fast._python, atlas_fast.storage, atlas_fast.cli, atlas_fast.convert
        assert "torch" not in sys.modules
        assert {{"AtlasDataset", "BlockShuffleSampler", "MixtureSampler"}} <= set(dir(atlas_fast))
        assert "AtlasDatasetShard" in dir(atlas_fast.atlas)
        with atlas_fast.AtlasDatasetWriter({str(tmp_path / "ds")!r}, 10, 2) as writer:
            for i in range(25):
                writer.add_example({{"i": i}})
        assert "torch" not in sys.modules
        from atlas_fast.cli import main
        for command in ("info", "verify"):
            sys.argv = ["atlas-fast", command, {str(tmp_path / "ds")!r}]
            assert main() == 0
        assert "torch" not in sys.modules, "the command line imported torch"
        assert not isinstance(atlas_fast.AtlasDataset, type(sys)), "a class, made now"
        print("torch" not in sys.modules, atlas_fast.BACKEND)
        """,
        backend,
    )
    assert out.split()[-1] == backend
    assert out.split()[-2] == "True"  # the CLI's process made its readers without torch


def test_a_reader_lookup_brings_torch_and_its_bases(tmp_path, backend):
    """``atlas_fast.AtlasDataset`` imports torch; readers and samplers are torch's Dataset and
    Sampler, the same class under every name, subclasses too; one class made whatever the
    number of threads looking it up at once; pickled by name."""
    pytest.importorskip("torch", reason="torch is not installed (the test extra has it)")
    out = run(
        f"""
        import pickle, sys, threading
        import atlas_fast
        assert "torch" not in sys.modules
        with atlas_fast.AtlasDatasetWriter({str(tmp_path / "ds")!r}, 10, 2) as writer:
            for i in range(25):
                writer.add_example(i)
        import atlas_fast._python
        module = atlas_fast.atlas if atlas_fast.BACKEND == "cython" else atlas_fast._python
        found = []
        threads = [
            threading.Thread(target=lambda: found.append(module.AtlasDataset))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(map(id, found))) == 1, "one class, whichever thread made it"
        assert "torch" in sys.modules
        from torch.utils.data import Dataset, Sampler
        cls = found[0]
        ds = cls({str(tmp_path / "ds")!r})
        assert isinstance(ds, Dataset) and isinstance(ds.shards[0], Dataset)
        assert atlas_fast.AtlasDataset is atlas_fast.atlas.AtlasDataset
        import atlas_fast as torch_atlas_ds
        from atlas_fast import *  # noqa: F403
        assert AtlasDatasetShard is torch_atlas_ds.atlas.AtlasDatasetShard

        class Mine(cls):
            def __getitem__(self, i):
                return super().__getitem__(i) * 10

        mine = Mine({str(tmp_path / "ds")!r})
        assert isinstance(mine, Dataset) and mine[3] == 30
        assert pickle.loads(pickle.dumps(ds))[24] == 24
        assert type(pickle.loads(pickle.dumps(ds))) is cls
        sampler = atlas_fast.BlockShuffleSampler(ds, seed=1)
        assert isinstance(sampler, Sampler) and sorted(sampler) == list(range(25))
        mixture = atlas_fast.MixtureDataset({{"a": ds}})
        mixed = atlas_fast.MixtureSampler(mixture, {{"a": 1}}, global_batch_size=5)
        assert isinstance(mixed, Sampler)
        print("ok")
        """,
        backend,
    )
    assert out.split() == ["ok"]


DATALOADER = """
import sys
import atlas_fast
from torch.utils.data import DataLoader

if __name__ == "__main__":
    ds = atlas_fast.AtlasDataset(sys.argv[1])
    sampler = atlas_fast.BlockShuffleSampler(ds, seed=0, batch_size=5, num_workers=2)
    loader = DataLoader(
        ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=list,
        multiprocessing_context=sys.argv[2],
    )
    got = sorted(x for batch in loader for x in batch)
    assert got == list(range(25)), got
    print("ok")
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_dataloader_workers(tmp_path, backend, start):
    """A DataLoader over the lazily made classes, its workers forked or spawned (a spawned
    worker unpickles the dataset by name, making the class again in its own process)."""
    pytest.importorskip("torch", reason="torch is not installed (the test extra has it)")
    import atlas_fast

    with atlas_fast.AtlasDatasetWriter(tmp_path / "ds", 10, 2) as writer:
        for i in range(25):
            writer.add_example(i)
    script = tmp_path / "load.py"
    script.write_text(DATALOADER)
    out = run(str(script), backend, str(tmp_path / "ds"), start)
    assert out.split() == ["ok"]
