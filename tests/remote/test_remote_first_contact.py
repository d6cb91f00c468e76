"""What a new user meets reading from S3: a plain-HTTP endpoint needs no extra variable,
bad credentials are said once (no description of zeros), a partial copy is judged as a
local one."""

from __future__ import annotations

import shutil

from helpers import case_dataset, load_expected, same, write_dataset
from servers import upload_tree

from atlas_fast.cli import main
from atlas_fast.cli.verify import verify


def test_an_http_endpoint_needs_no_allow_http(s3, monkeypatch, atlas):
    """AWS_ENDPOINT_URL=http://...: opening, blocks, batches and one shard read without
    AWS_ALLOW_HTTP (the endpoint's scheme says it), on strategy 2 as written by default."""
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    case = "mixed_s2_b4"
    upload_tree(s3.client, s3.bucket, case_dataset(case), case)
    expected = load_expected(case)
    ds = atlas.AtlasDataset(s3.url(case))
    assert same(ds[len(ds) - 1], expected[-1])
    assert all(same(a, b) for a, b in zip(ds.__getitems__(range(len(ds))), expected))
    shard = atlas.AtlasDatasetShard(
        s3.url(f"{case}/1"), compression_dict_bytes=ds.shards[1].compression_dict_bytes
    )
    assert same(shard[0], expected[32])


def test_bad_credentials(s3, monkeypatch, capsys):
    upload_tree(s3.client, s3.bucket, case_dataset("mixed_s1_b4"), "ds")
    s3.server.require_auth()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    url = s3.url("ds")
    assert main(["info", url]) == 1
    out = capsys.readouterr()
    assert out.out == ""  # nothing read, nothing described (was "shards: 0 / examples: 0")
    assert f"{url}/meta.json: access denied: check the credentials" in out.err


def test_a_partial_copy_as_local(s3, tmp_path, atlas):
    root = tmp_path / "ds"
    write_dataset(root, list(range(30)), shard_size=10, block_size=2, compression_strategy=1)
    shutil.rmtree(root / "1")
    upload_tree(s3.client, s3.bucket, root, "ds")
    url = s3.url("ds")
    for where in (root, url):
        report = verify(where, readers=atlas)
        assert not report["ok"] and report["examples"] == 20, where
        assert "(shards 1)" in report["problems"][0]["message"]
        report = verify(where, readers=atlas, partial=True)
        assert report["ok"] and "(shards 1)" in report["notes"][0], where
