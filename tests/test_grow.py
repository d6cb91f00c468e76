"""Growing datasets: ``AtlasDatasetWriter(append=True)`` and ``atlas_fast.merge``, locally.

Appending in several runs gives the examples of one run, read by both backends and by the
reference package; a reader opened before an append keeps reading the old dataset; an
append killed at any moment (random delays, and every file operation of its commit, with
the atomic exchange and with the two-rename fallback) leaves the old dataset or the new
one, whole, and the next append or ``verify --repair`` clears what it left. Merges equal
the concatenation of their sources. Bad input is refused with nothing written.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from helpers import append_dataset as append
from helpers import make_examples, reference_examples, same, write_dataset

import atlas_fast
import atlas_fast.cli.verify
from atlas_fast import AtlasDatasetWriter, AtlasFormatError, InvalidArgumentError
from atlas_fast._writing import grow
from atlas_fast.cli import main

STRATEGIES = [0, 1, 2, 3]


def tree(path: Path) -> dict:
    """Every file under ``path`` with its bytes (what "nothing written" compares)."""
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def read_all(atlas, root) -> list:
    with atlas.AtlasDataset(root) as ds:
        return [ds[i] for i in range(len(ds))]


def check_reads(atlas, root, examples) -> None:
    assert same(read_all(atlas, root), examples)
    assert same(reference_examples(root), examples)


def siblings(root: Path) -> list:
    """What is next to ``root``, once the old trees of this process's appends are removed
    (a private name: close() returns before their removal, which the interpreter's exit
    waits for)."""
    grow.wait_for_removals()
    return sorted(p.name for p in root.parent.iterdir() if p != root)


# -- append in k runs ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("runs", [2, 5, 12])
def test_appending_in_runs_gives_the_examples_of_one_run(tmp_path, atlas, strategy, runs):
    examples = make_examples(260, seed=strategy)
    one = tmp_path / "one" / "ds"
    write_dataset(one, examples, shard_size=20, block_size=4, compression_strategy=strategy)
    root = tmp_path / "many" / "ds"
    cuts = sorted(random.Random(runs).sample(range(1, 260), runs - 1))
    parts = [examples[a:b] for a, b in zip([0, *cuts], [*cuts, 260])]
    write_dataset(root, parts[0], shard_size=20, block_size=4, compression_strategy=strategy)
    stored = json.loads((root / "meta.json").read_text())["compression_strategy"]
    for part in parts[1:]:
        append(root, part, compression_strategy=strategy)
    check_reads(atlas, root, examples)
    meta = json.loads((root / "meta.json").read_text())
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert len(names) == len(meta["shard_sizes"]) > 10  # crossed 10 shards: one width
    assert {len(n) for n in names} == {2}
    assert sum(meta["shard_sizes"]) == 260
    assert siblings(root) == []  # nothing left beside it
    assert meta["compression_strategy"] == stored
    assert same(read_all(atlas, one), examples)
    if stored == 2:  # one shared dictionary, the first run's, compresses every shard
        assert (root / "zstd_dict.bin").is_file()
        for name in names:
            assert json.loads((root / name / "meta.json").read_text())["compression_strategy"] == 2
    report = atlas_fast.cli.verify.verify(root)
    assert report["ok"], report["problems"]


def test_an_append_keeps_the_old_files_and_the_shared_dictionary(tmp_path):
    examples = make_examples(100)
    root = tmp_path / "ds"
    write_dataset(root, examples[:60], shard_size=20, block_size=4)
    before = {p.relative_to(root): p.stat().st_ino for p in root.rglob("*") if p.is_file()}
    append(root, examples[60:], shard_size=7, block_size=3)
    after = {p.relative_to(root): p.stat().st_ino for p in root.rglob("*") if p.is_file()}
    for name, inode in before.items():
        if name.name != "meta.json" or len(name.parts) > 1:
            assert after[name] == inode, name  # hard links: nothing copied or rewritten
    sizes = json.loads((root / "meta.json").read_text())["shard_sizes"]
    assert sizes == [20, 20, 20, 7, 7, 7, 7, 7, 5]  # sizes free per shard
    assert json.loads((root / "3" / "meta.json").read_text())["block_size"] == 3


def test_a_widening_renames_every_shard_and_keeps_the_files(tmp_path, atlas):
    examples = make_examples(240)
    root = tmp_path / "ds"
    write_dataset(root, examples[:180], shard_size=20, block_size=4)  # 9 shards: 0-8
    inode = (root / "8" / "data.bin").stat().st_ino
    append(root, examples[180:])  # 12 shards: 00-11
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"{k:02d}" for k in range(12)]
    assert (root / "08" / "data.bin").stat().st_ino == inode
    check_reads(atlas, root, examples)


def test_a_root_file_of_another_tool_is_carried_over_unchanged(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(30), shard_size=20, block_size=4)
    (root / "tokens.idx").write_bytes(b"describes shards 0-1")
    append(root, make_examples(30, seed=1))
    assert (root / "tokens.idx").read_bytes() == b"describes shards 0-1"


def test_appending_nothing_changes_nothing(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(30), shard_size=20, block_size=4)
    before = tree(root)
    append(root, [])
    assert tree(root) == before
    assert siblings(root) == []


def test_a_strategy_2_dataset_that_fell_back_to_1_takes_appends_with_2(tmp_path, atlas):
    examples = make_examples(40)
    root = tmp_path / "ds"
    write_dataset(root, examples[:10], shard_size=10, block_size=4)  # too small to train
    assert json.loads((root / "meta.json").read_text())["compression_strategy"] == 1
    append(root, examples[10:], shard_size=10, block_size=1)  # strategy 2 asked: 1 kept
    assert json.loads((root / "meta.json").read_text())["compression_strategy"] == 1
    check_reads(atlas, root, examples)


# -- readers opened before ----------------------------------------------------------------


# 10 shards (0-9), widened by the append; 11 shards (00-10), not widened
@pytest.mark.parametrize("count", [190, 220])
def test_a_reader_opened_before_keeps_reading_the_old_dataset(tmp_path, atlas, count):
    examples = make_examples(300)
    root = tmp_path / "ds"
    write_dataset(root, examples[:count], shard_size=20, block_size=4)
    old = atlas.AtlasDataset(root)
    assert same(old[0], examples[0])  # shard 0 opened, the others not yet
    shard = old.shards[5]  # made, not opened
    append(root, examples[count:])  # 15 shards: 00-14
    assert len(old) == count
    assert same([old[i] for i in range(count)], examples[:count])
    assert same([shard[i] for i in range(len(shard))], examples[100:120])
    # Closed, then read again: every shard's files reopened under their (widened) names.
    old.close()
    shard.close()
    assert same([old[i] for i in range(0, count, 7)], examples[0:count:7])
    assert same(shard[3], examples[103])
    old.close()
    check_reads(atlas, root, examples)


# -- bad input ----------------------------------------------------------------------------


def test_appending_with_another_strategy_is_refused_and_writes_nothing(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(50), shard_size=20, block_size=4, compression_strategy=3)
    before = tree(root)
    with pytest.raises(InvalidArgumentError) as info:
        append(root, make_examples(10), compression_strategy=1)
    assert str(root) in str(info.value) and "compression_strategy 3" in str(info.value)
    assert tree(root) == before
    assert siblings(root) == []


@pytest.mark.parametrize("damage", ["no-meta", "shard-missing", "size-mismatch", "index"])
def test_appending_to_a_damaged_dataset_is_refused_and_writes_nothing(tmp_path, damage):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(50), shard_size=20, block_size=4)
    if damage == "no-meta":
        (root / "meta.json").unlink()
    elif damage == "shard-missing":
        shutil.rmtree(root / "1")
    elif damage == "size-mismatch":
        meta = json.loads((root / "1" / "meta.json").read_text())
        meta["stored_examples"] = 19
        (root / "1" / "meta.json").write_text(json.dumps(meta))
    else:
        with open(root / "2" / "data.bin", "ab") as f:
            f.write(b"extra")
    before = tree(root)
    with pytest.raises(AtlasFormatError) as info:
        append(root, make_examples(10))
    assert str(root) in str(info.value)
    assert tree(root) == before
    assert siblings(root) == []


@pytest.mark.parametrize("what", ["absent", "file", "empty-dir"])
def test_appending_to_what_is_not_a_dataset_is_refused(tmp_path, what):
    path = tmp_path / "ds"
    if what == "file":
        path.write_text("x")
    elif what == "empty-dir":
        path.mkdir()
    with pytest.raises(AtlasFormatError) as info:
        append(path, make_examples(10))
    assert str(path) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if what == "absent" else ["ds"])


def test_a_second_append_at_once_is_refused(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(30), shard_size=20, block_size=4)
    with AtlasDatasetWriter(root, 20, 4, append=True) as first:
        first.add_example({"a": 1})
        with pytest.raises(atlas_fast.DatasetBusyError):
            AtlasDatasetWriter(root, 20, 4, append=True)
    assert len(atlas_fast.AtlasDataset(root)) == 31


def test_a_with_block_that_raises_leaves_the_dataset_as_it_was(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, make_examples(30), shard_size=20, block_size=4)
    before = tree(root)
    with pytest.raises(KeyError), pytest.warns(RuntimeWarning, match="as it was"):
        with AtlasDatasetWriter(root, 5, 4, append=True) as writer:
            for example in make_examples(30):
                writer.add_example(example)
            raise KeyError("stop")
    assert tree(root) == before
    assert siblings(root) == []


def test_append_arguments(tmp_path):
    with pytest.raises(TypeError):
        AtlasDatasetWriter(tmp_path / "x", 10, 2, append="yes")


# -- killed -------------------------------------------------------------------------------

# The file operations of an append's commit, counted and killed at in the child.
_OPERATIONS = ("link", "rename", "mkdir", "replace", "unlink", "rmdir")


def _child(root: Path, examples: list, kill_at: int | None, fallback: bool, report) -> None:
    """In a forked child: append ``examples`` to ``root``, killing itself at the file
    operation number ``kill_at`` (None: never; the count of them written to ``report``)."""
    if fallback:
        grow._swap = None
    count = [0]

    def kill_there() -> None:
        count[0] += 1
        if count[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    for name in _OPERATIONS:
        real = getattr(os, name)

        def counted(*args, _real=real, **kwargs):
            kill_there()
            return _real(*args, **kwargs)

        setattr(os, name, counted)
    real_swap = grow.exchange

    def swap(*args):
        kill_there()
        return real_swap(*args)

    grow.exchange = swap
    append(root, examples, shard_size=20, block_size=4)
    grow.wait_for_removals()  # as the exit of a process that os._exit skips
    if report is not None:
        Path(report).write_text(str(count[0]))


def _run_killed(root, examples, *, delay=None, kill_at=None, fallback=False, report=None):
    _in_child_killed(lambda: _child(root, examples, kill_at, fallback, report), delay)


def _in_child_killed(work, delay=None) -> None:
    """Run ``work`` in a forked child, killed after ``delay`` seconds (None: not by us)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            work()
        finally:
            os._exit(0)
    if delay is not None:
        time.sleep(delay)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)


def test_an_append_killed_at_any_moment_leaves_the_old_or_the_new_dataset(tmp_path):
    """100 kills: half at random delays over the whole append, half at each file operation
    of the commit in turn (the widening's links and renames, the exchange, the removal of
    the old tree), a third of those with the two-rename fallback. After each, both backends
    and the reference read the old examples or the new ones, whole; then the next append
    (odd trials) or ``verify --repair`` (even ones) leaves nothing beside the dataset."""
    from atlas_fast import _python

    examples = make_examples(240, seed=3)
    old, new = examples[:180], examples  # 9 shards, then 12: the append widens the names
    pristine = tmp_path / "pristine" / "ds"
    write_dataset(pristine, old, shard_size=20, block_size=4)
    root = tmp_path / "work" / "ds"
    shutil.copytree(pristine, root)
    start = time.perf_counter()
    _run_killed(root, new[180:], report=tmp_path / "count")
    took = time.perf_counter() - start
    assert same(read_all(atlas_fast.atlas, root), new)
    operations = int((tmp_path / "count").read_text())  # of an undisturbed append
    assert operations > 40  # the shards written, the old ones linked, the exchange...
    rng = random.Random(0)
    seen = {"old": 0, "new": 0}
    readers = [atlas_fast.atlas, _python]
    for trial in range(100):
        shutil.rmtree(root.parent)
        shutil.copytree(pristine.parent, root.parent)
        fallback = trial % 3 == 2
        if trial < 50:
            _run_killed(root, new[180:], delay=rng.uniform(0, took * 1.2), fallback=fallback)
        else:
            _run_killed(
                root, new[180:], kill_at=1 + (trial - 50) * operations // 50, fallback=fallback
            )
        if not root.exists():  # only between the fallback's two renames
            assert fallback
            grow.remove_leftovers(root)
        got = read_all(readers[trial % 2], root)
        assert same(got, old) or same(got, new), trial
        assert same(reference_examples(root), got), trial
        seen["old" if len(got) == len(old) else "new"] += 1
        if trial % 2:
            append(root, [{"after": trial}])
            assert read_all(readers[0], root)[-1] == {"after": trial}
        else:
            assert main(["verify", "--repair", str(root)]) == 0
        assert siblings(root) == [], trial
    assert seen["old"] and seen["new"], seen


def _child_tokens(root: Path, docs: list, kill_at: int | None, report) -> None:
    """``_child`` for a dataset of token arrays (its token index grows with the append)."""
    from token_helpers import write_docs

    count = [0]
    for name in _OPERATIONS:
        real = getattr(os, name)

        def counted(*args, _real=real, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*args, **kwargs)

        setattr(os, name, counted)
    write_docs(root, docs, shard_size=20, block_size=4, append=True)
    grow.wait_for_removals()
    if report is not None:
        Path(report).write_text(str(count[0]))


def test_an_in_place_append_killed_at_any_moment_leaves_the_old_or_the_new_dataset(
    tmp_path,
):
    """One new shard and no widening: the root is changed in place (its folder is not
    exchanged: same inode), the shard renamed in last. Killed at every file operation in
    turn and at random delays, both backends, the reference and TokenSequences (through the
    grown token index) read the old dataset or the new one, whole; the next append or
    ``verify --repair`` puts back what the append had replaced and leaves nothing beside."""
    import numpy as np
    from token_helpers import Model, assert_rows, make_docs, write_docs

    from atlas_fast import _python
    from atlas_fast.tokens import TokenSequences

    docs = make_docs(31, 240, np.uint16, empty=0)
    old, new = docs[:220], docs  # 11 shards ("00".."10"), then 12: one shard, same width
    pristine = tmp_path / "pristine" / "ds"
    write_docs(pristine, old, shard_size=20, block_size=4)
    root = tmp_path / "work" / "ds"

    def run(kill_at=None, delay=None, report=None):
        _in_child_killed(lambda: _child_tokens(root, docs[220:], kill_at, report), delay)

    shutil.copytree(pristine.parent, root.parent)
    inode = os.stat(root).st_ino
    start = time.perf_counter()
    run(report=tmp_path / "count")
    took = time.perf_counter() - start
    assert os.stat(root).st_ino == inode  # changed in place, not exchanged
    assert sorted(os.listdir(root)) == [f"{k:02d}" for k in range(12)] + ["meta.json", "tokens.idx"]
    assert siblings(root) == []
    operations = int((tmp_path / "count").read_text())
    windows = {len(d): Model(d).windows(8) for d in (old, new)}
    rng = random.Random(5)
    seen = {"old": 0, "new": 0}
    readers = [atlas_fast.atlas, _python]
    trials = list(range(1, operations + 1)) + [None] * 16
    for trial, kill_at in enumerate(trials):
        shutil.rmtree(root.parent)
        shutil.copytree(pristine.parent, root.parent)
        if kill_at is None:
            run(delay=rng.uniform(0, took * 1.2))
        else:
            run(kill_at=kill_at)
        atlas = readers[trial % 2]
        if not trial % 2:  # repaired first: the index is then whole again
            assert main(["verify", "--repair", str(root)]) == 0
            grow.open_existing(root, "a test")  # whole: root meta.json and shards agree
        got = read_all(atlas, root)
        assert same(got, old) or same(got, new), trial
        assert same(reference_examples(root), got), trial
        which = old if len(got) == len(old) else new
        seen["old" if which is old else "new"] += 1
        # Killed between the commit and the index's replacement, the index lacks the new
        # shard's entry until a repair: "auto" builds it. Never other tokens.
        mode = "auto" if trial % 2 else "require"
        ts = TokenSequences(atlas.AtlasDataset(root), 8, index=mode)
        assert_rows(ts.__getitems__(list(range(len(ts)))), windows[len(which)])
        if trial % 2:
            extra = np.arange(5, dtype=np.uint16)
            write_docs(root, [extra], shard_size=20, append=True)
            assert same(read_all(readers[0], root), [*which, extra])
        assert siblings(root) == [], trial
    assert seen["old"] and seen["new"], seen


# -- merge --------------------------------------------------------------------------------


def test_merge_of_three_datasets_with_different_dictionaries_is_their_concatenation(
    tmp_path, atlas
):
    parts = [make_examples(120 + 30 * k, seed=10 + k) for k in range(3)]
    sources = []
    for k, part in enumerate(parts):
        sources.append(tmp_path / f"s{k}")
        write_dataset(sources[-1], part, shard_size=40, block_size=4)
    dicts = {(s / "zstd_dict.bin").read_bytes() for s in sources}
    assert len(dicts) == 3
    before = [tree(s) for s in sources]
    metadata = atlas_fast.merge(sources, tmp_path / "merged")
    everything = [e for part in parts for e in part]
    check_reads(atlas, tmp_path / "merged", everything)
    assert metadata.compression_strategy == 3
    assert [tree(s) for s in sources] == before  # sources untouched
    merged = tmp_path / "merged"
    for shard in sorted(p for p in merged.iterdir() if p.is_dir()):
        assert json.loads((shard / "meta.json").read_text())["compression_strategy"] == 3
        assert (shard / "zstd_dict.bin").read_bytes() in dicts
    assert atlas_fast.cli.verify.verify(merged)["ok"]


@pytest.mark.parametrize("strategies", [(2, 2), (0, 1, 3), (3, 3), (1, 1)])
def test_merge_keeps_a_shared_strategy_and_mixes_others_under_3(tmp_path, atlas, strategies):
    parts = [make_examples(50 + 10 * k, seed=k) for k in range(len(strategies))]
    sources = [tmp_path / f"s{k}" for k in range(len(strategies))]
    for source, part, strategy in zip(sources, parts, strategies):
        write_dataset(source, part, shard_size=40, block_size=4, compression_strategy=strategy)
    if strategies == (2, 2):  # one dictionary: copy the first's over the second's data
        shutil.rmtree(sources[1])
        shutil.copytree(sources[0], sources[1])
        parts[1] = parts[0]
    metadata = atlas_fast.merge(sources, tmp_path / "m")
    check_reads(atlas, tmp_path / "m", [e for p in parts for e in p])
    want = strategies[0] if len(set(strategies)) == 1 else 3
    assert metadata.compression_strategy == want
    names = sorted(p.name for p in (tmp_path / "m").iterdir() if p.is_dir())
    assert names == [str(k).zfill(len(names[-1])) for k in range(len(names))]


def test_merge_refuses_datasets_of_different_versions_and_writes_nothing(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_dataset(a, make_examples(20), shard_size=10, block_size=2)
    write_dataset(b, make_examples(20), shard_size=10, block_size=2)
    meta = json.loads((b / "meta.json").read_text())
    meta["version"] = 2
    (b / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(AtlasFormatError) as info:
        atlas_fast.merge([a, b], tmp_path / "m")
    assert str(a) in str(info.value) and str(b) in str(info.value)
    assert "version" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_merge_refuses_a_source_that_is_not_a_dataset_and_an_occupied_destination(tmp_path):
    a = tmp_path / "a"
    write_dataset(a, make_examples(20), shard_size=10, block_size=2)
    with pytest.raises(AtlasFormatError, match="nothing"):
        atlas_fast.merge([a, tmp_path / "nothing"], tmp_path / "m")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        atlas_fast.merge([a], tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "m"]
    with pytest.raises(InvalidArgumentError):
        atlas_fast.merge(a, tmp_path / "m2")


def test_merge_from_the_command_line(tmp_path, atlas, capsys):
    parts = [make_examples(30, seed=k) for k in range(2)]
    for k, part in enumerate(parts):
        write_dataset(tmp_path / f"s{k}", part, shard_size=10, block_size=2)
    paths = [str(tmp_path / name) for name in ("s0", "s1", "m")]
    assert main(["merge", "--json", *paths]) == 0
    assert json.loads(capsys.readouterr().out)["shard_sizes"] == [10] * 6
    check_reads(atlas, tmp_path / "m", parts[0] + parts[1])
    assert main(["merge", paths[0], paths[2]]) == 1
    assert paths[2] in capsys.readouterr().err


def test_an_append_through_a_symlink_grows_the_folder_it_names(tmp_path, atlas):
    examples = make_examples(60)
    real = tmp_path / "real"
    write_dataset(real, examples[:40], shard_size=20, block_size=4)
    (tmp_path / "link").symlink_to(real)
    append(tmp_path / "link", examples[40:])
    assert (tmp_path / "link").is_symlink()
    check_reads(atlas, tmp_path / "link", examples)
    assert siblings(real) == ["link"]


# -- the token index ----------------------------------------------------------------------


def _reads_no_shard(monkeypatch) -> None:
    """Building index entries (``build_entries``) is what reads shards' blocks for the
    index: a private name, patched to fail, so that opening with a complete index is shown
    to read the index and the metadata alone."""
    from atlas_fast import _token_index

    def fail(*args, **kwargs):
        raise AssertionError("the token index was built from the shards")

    monkeypatch.setattr(_token_index, "build_entries", fail)


def _windows_match(atlas, root, docs, seq_len) -> None:
    from token_helpers import Model, assert_rows

    from atlas_fast.tokens import TokenSequences

    ts = TokenSequences(atlas.AtlasDataset(root), seq_len, index="require")
    assert ts.index_path == root / "tokens.idx"
    assert_rows(ts.__getitems__(list(range(len(ts)))), Model(docs).windows(seq_len))


@pytest.mark.parametrize("strategy", [0, 2, 3])
@pytest.mark.parametrize("old", [90, 60])  # 9 shards then 15: widening; 6 then 15
def test_an_append_writes_the_grown_datasets_token_index(
    tmp_path, atlas, monkeypatch, strategy, old
):
    import numpy as np
    from token_helpers import make_docs, write_docs

    docs = make_docs(11, 150, np.uint16, long=1)
    options = {"strategy": strategy, "shard_size": 10, "block_size": 2}
    root = write_docs(tmp_path / "ds", docs[:old], **options)
    write_docs(root, docs[old:], append=True, **options)
    # The index of the same shards written at once: the same bytes.
    once = write_docs(tmp_path / "once", docs, **options)
    assert (root / "tokens.idx").read_bytes() == (once / "tokens.idx").read_bytes()
    _reads_no_shard(monkeypatch)
    _windows_match(atlas, root, docs, 7)
    assert same(reference_examples(root), docs)


def test_an_append_without_an_old_index_leaves_the_index_to_its_first_use(tmp_path, atlas):
    import numpy as np
    from token_helpers import make_docs, write_docs

    docs = make_docs(12, 60, np.uint16)
    root = write_docs(tmp_path / "ds", docs[:40], shard_size=20, token_index=False)
    write_docs(root, docs[40:], shard_size=20, append=True)
    assert not (root / "tokens.idx").exists()
    from atlas_fast.tokens import TokenSequences

    ts = TokenSequences(atlas.AtlasDataset(root), 5)  # built now, from the shards
    assert ts.num_tokens == sum(len(d) for d in docs)


def test_a_merge_of_token_datasets_merges_their_indexes(tmp_path, atlas, monkeypatch):
    import numpy as np
    from token_helpers import make_docs, write_docs

    from atlas_fast import _token_index

    parts = [make_docs(20 + k, 40 + 15 * k, np.uint32, long=k % 2) for k in range(3)]
    sources = []
    for k, docs in enumerate(parts):  # strategies 2 with three dictionaries, and 0
        sources.append(
            write_docs(tmp_path / f"s{k}", docs, strategy=(2, 2, 0)[k], shard_size=16, block_size=2)
        )
    atlas_fast.merge(sources, tmp_path / "m")
    merged = tmp_path / "m"
    everything = [d for docs in parts for d in docs]
    # The same index as one built by reading the merged dataset's shards.
    built = tmp_path / "built"
    shutil.copytree(merged, built)
    (built / "tokens.idx").unlink()
    _token_index.index_dataset(built)
    assert (merged / "tokens.idx").read_bytes() == (built / "tokens.idx").read_bytes()
    _reads_no_shard(monkeypatch)
    _windows_match(atlas, merged, everything, 5)
    # A source without an index: the merged dataset has none (it is built on first use).
    (sources[1] / "tokens.idx").unlink()
    atlas_fast.merge(sources, tmp_path / "m2")
    assert not (tmp_path / "m2" / "tokens.idx").exists()
