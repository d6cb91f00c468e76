"""The object-storage guide's examples run, against moto's S3 server with the dataset they
name uploaded (tests/test_docs.py runs every other page's); its writing examples write there.
The Ray example (a ``py`` block: it needs a Ray cluster) is tests/remote/test_remote_ray.py's
write."""

from __future__ import annotations

import re
from pathlib import Path

from servers import upload_tree

import atlas_fast

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "remote.md"


def test_the_remote_guide_runs(s3, tmp_path, monkeypatch):
    local = tmp_path / "web-2026"
    # the writer's defaults (strategy 2), as a user's dataset; no AWS_ALLOW_HTTP (the
    # endpoint's http:// says it), as the guide does not ask for it
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with atlas_fast.AtlasDatasetWriter(local, shard_size=100, block_size=10) as writer:
        for i in range(250):
            writer.add_example({"id": i})
    s3.client.create_bucket(Bucket="my-bucket")
    upload_tree(s3.client, "my-bucket", local, "datasets/web-2026")
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert blocks, "no python block found in the guide"
    namespace = {"__name__": "__docs__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"{GUIDE}:block {k}", "exec"), namespace)
    assert namespace["ds"][123] == {"id": 123}
    assert namespace["alone"][0] == namespace["shard"][0] == {"id": 100}
    # Its writing examples wrote what they say.
    assert list(namespace["new"]) == [{"id": i} for i in range(250)]
    converted = atlas_fast.AtlasDataset("s3://my-bucket/datasets/from-jsonl")
    assert list(converted) == [{"n": i} for i in range(50)]
    assert namespace["ds"].cache_dir == "atlas-cache"  # the disk cache's example, last
    assert any((tmp_path / "atlas-cache" / "blocks").iterdir())
