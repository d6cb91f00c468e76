"""``atlas-fast info`` and ``atlas-fast verify`` on URLs: the same report as the local copy's,
each block fetched once, and clear problems for what cannot be read."""

from __future__ import annotations

import json
import shutil

import pytest
from corrupt import make_examples, read_blocks, write_dataset, write_silently_corrupted
from helpers import case_dataset
from servers import upload_tree

from atlas_fast import AtlasDatasetWriter
from atlas_fast._format import CHECKSUM_FILE
from atlas_fast.cli import main
from atlas_fast.cli.info import info
from atlas_fast.cli.verify import verify

# What a URL's report shares with the local copy's (paths and bytes on disk differ).
SAME = ("kind", "ok", "shards", "examples", "blocks", "compression_strategy", "data_bytes")


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_and_verify_of_a_fixture_through_s3(s3, capsys, atlas, reference_case):
    local = case_dataset(reference_case)
    upload_tree(s3.client, s3.bucket, local, reference_case)
    url = s3.url(reference_case)
    want = info(local, exact=True, readers=atlas)
    got = info(url, exact=True, readers=atlas)
    assert got["ok"], got["problems"]
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert got["compression_ratio"] == want["compression_ratio"]
    assert got["path"] == url and got["disk_bytes"] is None
    assert [r["shard"] for r in got["shard_details"]] == [
        f"{url}/{r['shard'].rpartition('/')[2]}" for r in want["shard_details"]
    ]
    checked = verify(url, readers=atlas, trusted=False)
    assert checked["ok"], checked["problems"]
    assert checked["examples"] == verify(local, readers=atlas)["examples"]

    code, out, err = _cli(capsys, "info", url)
    assert code == 0, err
    assert f"{url} (dataset)" in out and "n/a (in object storage)" in out
    code, out, err = _cli(capsys, "verify", "--json", url)
    assert code == 0 and json.loads(out)["ok"] is True, err


def test_info_and_verify_over_http(nginx, capsys, atlas, reference_case):
    root, proxy = nginx
    shutil.copytree(case_dataset(reference_case), root / "ds")
    url = f"{proxy.url}/ds"
    local = info(root / "ds", exact=True, readers=atlas)
    remote = info(url, exact=True, readers=atlas)
    assert {k: remote[k] for k in SAME} == {k: local[k] for k in SAME}
    code, out, err = _cli(capsys, "verify", url)
    assert code == 0 and out.startswith("OK"), (out, err)


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_a_single_shard_url(s3, tmp_path, capsys, atlas, strategy):
    """A URL whose meta.json has a block_size is a shard; strategy 2's dictionary comes from
    the folder above it, as for a local shard."""
    write_dataset(tmp_path / "ds", strategy, checksums=True)
    upload_tree(s3.client, s3.bucket, tmp_path / "ds", "ds")
    url = s3.url("ds/1")
    report = info(url, exact=True, readers=atlas)
    assert report["ok"], report["problems"]
    assert report["kind"] == "shard" and report["examples"] == 40 and report["blocks"] == 10
    checked = verify(url, readers=atlas)
    assert checked["ok"], checked["problems"]
    assert checked["kind"] == "shard" and checked["blocks_checksummed"] == 10
    code, out, err = _cli(capsys, "info", "--json", url)
    assert code == 0 and json.loads(out)["kind"] == "shard", err


def test_verify_fetches_each_block_once_in_large_requests(s3, tmp_path, atlas):
    """Checksums are checked on the bytes the reader decodes: data.bin is fetched once, in a
    few large requests, not a request per block."""
    local = tmp_path / "ds"
    with AtlasDatasetWriter(local, 400, 4, compression_strategy=1, checksums=True) as w:
        for x in make_examples(800):
            w.add_example(x)
    upload_tree(s3.client, s3.bucket, local, "ds")
    s3.proxy.reset_stats()
    report = verify(s3.url("ds"), readers=atlas)
    assert report["ok"], report["problems"]
    assert report["blocks"] == report["blocks_checksummed"] == 200
    stats = s3.proxy.stats()
    for shard in ("0", "1"):
        data_requests = stats["paths"][f"/{s3.bucket}/ds/{shard}/data.bin"]
        assert data_requests <= 4, stats["paths"]
    stored = sum((local / s / name).stat().st_size for s in "01" for name in ("data.bin",))
    small = sum(p.stat().st_size for p in local.rglob("*") if p.is_file() and p.name != "data.bin")
    assert stats["body_bytes"] <= stored + small + 4096


def test_verify_finds_silent_corruption_at_its_url(s3, tmp_path, atlas):
    root = tmp_path / "ds"
    write_silently_corrupted(root)
    upload_tree(s3.client, s3.bucket, root, "ds")
    url = s3.url("ds")
    (problem,) = verify(url, readers=atlas)["problems"]
    assert problem["file"] == f"{url}/1/data.bin" and problem["block"] == 3
    assert f"{url}/1/{CHECKSUM_FILE}" in problem["message"]


def test_a_missing_shard_and_a_bad_block_are_problems_named_by_url(s3, tmp_path, atlas):
    root = tmp_path / "ds"
    write_dataset(root, 1, n=120, shard_size=40)
    blocks = read_blocks(root / "0")
    data = bytearray((root / "0" / "data.bin").read_bytes())
    start = sum(len(b) for b in blocks[:2])
    data[start + 4 : start + 12] = b"\xff" * 8  # inside block 2's zstd frame
    (root / "0" / "data.bin").write_bytes(bytes(data))
    shutil.rmtree(root / "2")
    upload_tree(s3.client, s3.bucket, root, "ds")
    url = s3.url("ds")
    # verify: the shard absent from the copy is one problem about the root (as for a local
    # copy, see tests/test_first_contact.py); info: its meta.json does not read
    for report, where in (
        (verify(url, readers=atlas), f"{url}/meta.json"),
        (info(url, exact=True, readers=atlas), f"{url}/2/meta.json"),
    ):
        located = {(p["file"], p["block"]) for p in report["problems"]}
        assert (f"{url}/0/data.bin", 2) in located, report["problems"]
        assert (where, None) in located
        missing = [p for p in report["problems"] if p["file"] == where]
        assert missing[0]["kind"] == "AtlasFormatError"
        assert report["shards"] == 2 and not report["ok"]
    assert "(shards 2)" in verify(url, readers=atlas)["problems"][0]["message"]
    partial = verify(url, readers=atlas, partial=True)
    assert [p["file"] for p in partial["problems"]] == [f"{url}/0/data.bin"]
    assert "(shards 2)" in partial["notes"][0]


def test_urls_that_name_no_dataset(s3, capsys):
    url = s3.url("nothing-here")
    why = f"{url}/meta.json: missing: {url} is not an Atlas dataset or shard"
    code, _, err = _cli(capsys, "info", url)
    assert code == 1 and why in err
    code, out, _ = _cli(capsys, "verify", url)
    assert code == 1 and why in out
    code, out, _ = _cli(capsys, "verify", "s3://no-such-bucket-here/ds")
    assert code == 1 and "the bucket 'no-such-bucket-here' does not exist" in out
    for command in ("info", "verify"):
        code, _, err = _cli(capsys, command, "s3://")
        assert code == 2 and err.startswith(f"atlas-fast {command}: error: s3://: no bucket")
        code, _, err = _cli(capsys, command, "file://elsewhere/ds")
        assert code == 2 and "file:// URL names a local path" in err


def test_a_file_url_is_the_local_path(capsys, atlas, reference_case):
    local = case_dataset(reference_case)
    report = info(f"file://{local}", readers=atlas)
    assert report["path"] == str(local) and report["disk_bytes"] > 0
    code, out, _ = _cli(capsys, "verify", f"file://{local}")
    assert code == 0 and out.startswith("OK")
