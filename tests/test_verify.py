"""``atlas-fast verify`` and ``atlas-fast info``, and the optional checksum sidecar."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import numpy as np
import pytest
from corrupt import (
    copy_case,
    read_all,
    read_blocks,
    write_blocks,
    write_dataset,
    write_silently_corrupted,
)
from helpers import assert_same, case_dataset, load_expected

from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter
from atlas_fast._errors import AtlasFormatError
from atlas_fast._format import CHECKSUM_FILE, block_checksum
from atlas_fast.cli import main
from atlas_fast.cli.info import info
from atlas_fast.cli.verify import verify


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- clean datasets -----------------------------------------------------------------------


def test_verify_clean_fixture(capsys, atlas, reference_case):
    root = case_dataset(reference_case)
    report = verify(root, readers=atlas)
    assert report["ok"], report["problems"]
    assert report["examples"] == len(load_expected(reference_case))
    code, out, _ = _cli(capsys, "verify", str(root))
    assert code == 0 and out.startswith("OK")
    code, out, _ = _cli(capsys, "verify", "--json", "--untrusted", str(root))
    assert code == 0 and json.loads(out)["ok"] is True


def test_verify_single_shard(capsys, reference_case):
    for shard_dir in sorted(p for p in (case_dataset(reference_case)).iterdir()):
        if shard_dir.is_dir():
            code, out, _ = _cli(capsys, "verify", "--json", str(shard_dir))
            report = json.loads(out)
            assert code == 0 and report["kind"] == "shard", report


def test_info_fixture(capsys, atlas, reference_case):
    root = case_dataset(reference_case)
    expected = load_expected(reference_case)
    report = info(root, exact=True, readers=atlas)
    assert report["examples"] == len(expected)
    assert report["shards"] == len(report["shard_details"])
    assert report["ratio_exact"] and report["compression_ratio"] > 0
    if report["compression_strategy"] == 0:
        assert report["compression_ratio"] == pytest.approx(1.0)
    sampled = info(root, sample=2, readers=atlas)
    assert sampled["ratio_blocks"] == min(2, report["blocks"])
    code, out, _ = _cli(capsys, "info", "--json", str(root))
    assert code == 0 and json.loads(out)["examples"] == len(expected)
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0 and f"examples:     {len(expected)}" in out


def test_info_single_shard_of_shared_dictionary(capsys, tmp_path):
    root = tmp_path / "s2"
    write_dataset(root, 2)
    code, out, _ = _cli(capsys, "info", "--json", "--exact", str(root / "1"))
    report = json.loads(out)
    assert code == 0 and report["kind"] == "shard" and report["examples"] == 40
    assert report["compression_ratio"] > 1


# -- problems found, with their location --------------------------------------------------


def test_verify_reports_every_problem(capsys, atlas, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 1, n=120, shard_size=40)
    # shard 0: two bad blocks; shard 1: bad index; shard 2: one bad block
    blocks = read_blocks(root / "0")
    blocks[2] = blocks[2][:-5]
    blocks[7] = b"\x28\xb5\x2f\xfd" + b"\x00" * 20
    write_blocks(root / "0", blocks)
    offsets = np.load(root / "1" / "index.npy")
    offsets[0] = 1
    np.save(root / "1" / "index.npy", offsets)
    blocks = read_blocks(root / "2")
    blocks[9] = blocks[9] + b"xx"
    write_blocks(root / "2", blocks)

    report = verify(root, readers=atlas)
    assert not report["ok"]
    located = {(p["file"], p["block"]) for p in report["problems"]}
    assert (str(root / "0" / "data.bin"), 2) in located
    assert (str(root / "0" / "data.bin"), 7) in located
    assert (str(root / "2" / "data.bin"), 9) in located
    assert any(str(root / "1" / "index.npy") in p["message"] for p in report["problems"])
    assert len(report["problems"]) == 4
    code, out, _ = _cli(capsys, "verify", str(root))
    assert code == 1
    assert out.count("PROBLEM") == 4 and "block 7" in out and "4 problem(s)" in out
    code, out, _ = _cli(capsys, "verify", "--json", str(root))
    assert code == 1 and len(json.loads(out)["problems"]) == 4


def test_verify_metadata_problems(capsys, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 0, n=120, shard_size=40)
    (root / "1" / "meta.json").write_text("{")
    meta = json.loads((root / "meta.json").read_text())
    meta["shard_sizes"][2] = 7
    (root / "meta.json").write_text(json.dumps(meta))
    report = verify(root)
    messages = [p["message"] for p in report["problems"]]
    assert any(str(root / "1" / "meta.json") in m and "JSON" in m for m in messages)
    assert any(str(root / "2") in m and "lists 7" in m for m in messages)
    assert report["shards"] == 2  # shard 0 and 2 were still decoded
    assert main(["verify", str(root)]) == 1


def test_verify_broken_root(capsys, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 2)
    (root / "meta.json").unlink()
    (root / "zstd_dict.bin").unlink()
    report = verify(root)
    messages = " ".join(p["message"] for p in report["problems"])
    assert str(root / "meta.json") in messages
    assert "compression_strategy 2" in messages  # shards that cannot be decoded say so


def test_verify_unsafe_pickle(capsys, tmp_path):
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, 10, 2, compression_strategy=0) as w:
        for i in range(10):
            w.add_example(pickle.PickleBuffer if i == 3 else i)
    assert main(["verify", str(root)]) == 0
    capsys.readouterr()
    code, out, _ = _cli(capsys, "verify", "--untrusted", "--json", str(root))
    report = json.loads(out)
    assert code == 1
    (problem,) = report["problems"]
    assert problem["kind"] == "UnsafePickleError" and problem["block"] == 1
    assert "PickleBuffer" in problem["message"]
    code, _, _ = _cli(capsys, "verify", "--untrusted", "--allow", "pickle.PickleBuffer", str(root))
    assert code == 0


def test_verify_partial_copy_is_a_note_when_said_partial(capsys, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 1, n=120, shard_size=40)
    shutil.rmtree(root / "1")
    report = verify(root)
    assert not report["ok"] and report["shards"] == 2
    assert "shards 1" in report["problems"][0]["message"]
    report = verify(root, partial=True)
    assert report["ok"] and report["shards"] == 2
    assert any("shards 1" in n for n in report["notes"])


def test_usage_errors(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["verify"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--bogus", str(tmp_path)])
    assert exc.value.code == 2
    assert main(["verify", str(tmp_path / "absent")]) == 2
    assert main(["info", str(tmp_path / "absent")]) == 2
    assert main(["verify", "--jobs", "0", str(tmp_path)]) == 2
    assert main(["verify", "--allow", "a.b", str(tmp_path)]) == 2
    assert main([]) == 2


def test_info_on_broken_dataset(capsys, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 1)
    (root / "0" / "index.npy").write_bytes(b"junk")
    code, _, err = _cli(capsys, "info", str(root))
    assert code == 1 and str(root / "0" / "index.npy") in err


def _four_shards(root, strategy=1) -> list:
    """Four shards of 30, 30, 30 and 10 examples (blocks of 4)."""
    return write_dataset(root, strategy, n=100, shard_size=30, block_size=4)


@pytest.mark.parametrize("strategy", [1, 2])
def test_info_describes_every_shard_past_a_bad_one(capsys, atlas, tmp_path, strategy):
    """A shard whose meta.json, index or blocks do not read is reported; the others are
    described, and the command exits 1 (in --json too)."""
    root = tmp_path / "ds"
    _four_shards(root, strategy)
    (root / "0" / "meta.json").write_text("{")
    (root / "1" / "index.npy").write_bytes(b"junk")
    blocks = read_blocks(root / "2")
    write_blocks(root / "2", [blocks[0], b"\x00" * len(blocks[1]), *blocks[2:]])
    report = info(root, exact=True, readers=atlas)
    assert not report["ok"]
    assert [(p["file"], p["block"]) for p in report["problems"]] == [
        (str(root / "0" / "meta.json"), None),
        (str(root / "1" / "index.npy"), None),
        (str(root / "2" / "data.bin"), 1),
    ]
    assert all(p["kind"] == "AtlasFormatError" for p in report["problems"])
    # Shards 1-3 described (1 without its data bytes), 0 not.
    assert [d["shard"] for d in report["shard_details"]] == [str(root / n) for n in "123"]
    assert [d["data_bytes"] is None for d in report["shard_details"]] == [True, False, False]
    assert report["shards"] == 3 and report["examples"] == 70 and report["blocks"] == 8 + 8 + 3
    # The ratio over the blocks that decoded: shards 2 (but block 1) and 3.
    assert report["ratio_blocks"] == 10 and not report["ratio_exact"]
    assert report["compression_strategy"] == strategy

    code, out, err = _cli(capsys, "info", "--exact", str(root))
    assert code == 1
    assert "  shards:       3\n  examples:     70\n" in out
    lines = err.splitlines()
    assert lines[:3] == [f"atlas-fast info: problem: {p['message']}" for p in report["problems"]]
    assert lines[3].startswith("atlas-fast info: 3 problems found; the description covers")
    code, out, err = _cli(capsys, "info", "--json", "--exact", str(root))
    assert code == 1 and json.loads(out)["problems"] == report["problems"]


def test_info_without_the_shared_dictionary(capsys, atlas, tmp_path):
    """Strategy 2 without zstd_dict.bin: every shard is still described, none decoded."""
    root = tmp_path / "ds"
    _four_shards(root, strategy=2)
    (root / "zstd_dict.bin").unlink()
    report = info(root, readers=atlas)
    assert report["shards"] == 4 and report["examples"] == 100
    assert report["compression_ratio"] is None and report["ratio_blocks"] == 0
    files = [p["file"] for p in report["problems"]]
    assert files == [str(root / "zstd_dict.bin")] + [str(root / n / "meta.json") for n in "0123"]
    assert report["problems"][4]["message"] == (
        f"{root / '3' / 'meta.json'}: compression_strategy 2 needs the shared dictionary "
        f"{root / 'zstd_dict.bin'}, which is unavailable: 3 blocks not read"
    )
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 1 and "  compression:  n/a (no block decoded)\n" in out


def test_info_catches_shard_sizes_that_disagree(capsys, atlas, tmp_path):
    """Reading refuses a shard whose size the root's shard_sizes misstates (and verify
    reports it): info reports it too, and exits 1."""
    root = tmp_path / "ds"
    _four_shards(root)
    meta = json.loads((root / "meta.json").read_text())
    meta["shard_sizes"][1] = 7
    (root / "meta.json").write_text(json.dumps(meta))
    message = f"{root / '1'}: stored_examples is 30 but {root / 'meta.json'} lists 7 for shard 1"
    with pytest.raises(AtlasFormatError, match="stored_examples is 30"):
        read_all(atlas.AtlasDataset(root))
    assert [p["message"] for p in verify(root, readers=atlas)["problems"]] == [message]
    report = info(root, readers=atlas)
    assert not report["ok"] and [p["message"] for p in report["problems"]] == [message]
    assert report["shards"] == 4 and report["examples"] == 100  # as the shards say
    for argv in (["info"], ["info", "--json"]):
        code, _, err = _cli(capsys, *argv, str(root))
        assert code == 1 and f"atlas-fast info: problem: {message}\n" in err


def test_info_of_an_empty_dataset(capsys, atlas, tmp_path):
    """No shards: no block size to show, and nothing to report."""
    root = tmp_path / "ds"
    root.mkdir()
    (root / "meta.json").write_text(
        json.dumps({"version": 1, "shard_sizes": [], "compression_strategy": 1})
    )
    report = info(root, readers=atlas)
    assert report["ok"] and report["shards"] == 0 and report["blocks"] == 0
    code, out, err = _cli(capsys, "info", str(root))
    assert code == 0 and err == ""
    assert out.splitlines()[1:4] == [
        "  shards:       0",
        "  examples:     0",
        "  blocks:       0",
    ]
    assert out.splitlines()[-1] == "  compression:  n/a (no blocks)"


def test_info_of_shards_with_different_block_sizes(capsys, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 1, n=80, shard_size=40, block_size=4)
    other = tmp_path / "other"
    write_dataset(other, 1, n=40, shard_size=40, block_size=8)
    shutil.rmtree(root / "1")
    shutil.copytree(other / "0", root / "1")
    code, out, _ = _cli(capsys, "info", str(root))
    assert code == 0 and "  blocks:       15 (block sizes 4, 8)\n" in out


# -- checksums ----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_checksums_written_and_ignored_by_readers(atlas, tmp_path, strategy):
    root = tmp_path / "ds"
    examples = write_dataset(root, strategy, checksums=True)
    for shard_dir in (root / "0", root / "1"):
        sums = np.load(shard_dir / CHECKSUM_FILE)
        blocks = read_blocks(shard_dir)
        assert sums.dtype == np.dtype("<u8") and len(sums) == len(blocks)
        assert [int(s) for s in sums] == [block_checksum(b) for b in blocks]
    got = read_all(atlas.AtlasDataset(root))
    for i, want in enumerate(examples):
        assert_same(got[i], want, f"[{i}]")
    report = verify(root, readers=atlas)
    assert report["ok"] and report["blocks_checksummed"] == report["blocks"] == 20


def test_checksums_default_off(tmp_path):
    write_dataset(tmp_path / "ds", 1)
    assert not (tmp_path / "ds" / "0" / CHECKSUM_FILE).exists()
    with AtlasDatasetShardWriter(tmp_path / "shard", 4, compression_strategy=0) as w:
        w.add_example(1)
    assert not (tmp_path / "shard" / CHECKSUM_FILE).exists()


def test_checksums_find_silent_corruption(capsys, atlas, tmp_path):
    """A flipped byte inside a pickled string still unpickles: only the checksum sees it."""
    root = tmp_path / "ds"
    shard_dir = write_silently_corrupted(root)  # index and sidecar untouched

    read_all(atlas.AtlasDataset(root))  # still decodes: the corruption is silent
    report = verify(root, readers=atlas)
    (problem,) = report["problems"]
    assert problem["file"] == str(shard_dir / "data.bin") and problem["block"] == 3
    assert str(shard_dir / CHECKSUM_FILE) in problem["message"]
    (shard_dir / CHECKSUM_FILE).unlink()
    assert verify(root, readers=atlas)["ok"]  # without the sidecar nothing can tell


def test_bad_checksum_file_is_reported(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 1, checksums=True)
    np.save(root / "0" / CHECKSUM_FILE, np.zeros(3, dtype="<u8"))
    (root / "1" / CHECKSUM_FILE).write_bytes(b"nonsense")
    report = verify(root)
    files = {p["file"] for p in report["problems"]}
    assert files == {str(root / "0" / CHECKSUM_FILE), str(root / "1" / CHECKSUM_FILE)}


def test_fixture_copy_corruption_found(tmp_path, reference_case):
    root = copy_case(reference_case, tmp_path / "ds")
    shard_dir = sorted(p for p in root.iterdir() if p.is_dir())[0]
    blocks = read_blocks(shard_dir)
    last = len(blocks) - 1
    blocks[last] = blocks[last][: max(1, len(blocks[last]) // 3)]
    write_blocks(shard_dir, blocks)
    report = verify(root)
    assert [(p["file"], p["block"]) for p in report["problems"]] == [
        (str(shard_dir / "data.bin"), last)
    ]


def test_verify_fifo_does_not_block(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 0)
    (root / "meta.json").unlink()
    os.mkfifo(root / "meta.json")
    (root / "1" / "data.bin").unlink()
    os.mkfifo(root / "1" / "data.bin")
    report = verify(root)
    messages = " ".join(p["message"] for p in report["problems"])
    assert "not a regular file" in messages and str(root / "1" / "data.bin") in messages
