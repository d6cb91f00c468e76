"""gs:// and az:// URLs.

Google Cloud Storage: datasets read against fake-gcs-server (the emulator, through the
fault-injecting proxy) equal the local read, both backends, with exact ranges, faults, a
replaced object and clear errors; the emulator's usual variable STORAGE_EMULATOR_HOST is
honoured. Writing to gs:// is not tested against a server: fake-gcs-server implements
Google's JSON API, and obstore writes with the XML API (a plain PUT, multipart uploads,
listing, copy, DELETE), which it lacks.

Azure: no Azure Blob Storage emulator installs from PyPI or Debian (Azurite is npm-only), so
the tests stop at the wire: a small recording HTTP server on 127.0.0.1 shows that an az://
URL reaches the configured endpoint, signed with the configured account, for reading and for
writing; and the options map onto obstore's store as the docs say.
"""

from __future__ import annotations

import http.server
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import make_examples, same, write_dataset

import atlas_fast
from atlas_fast import (
    AtlasDatasetWriter,
    AtlasFormatError,
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
)
from atlas_fast.storage import _engines
from atlas_fast.storage._engines import AZURE_EMULATOR_ACCOUNT, ObstoreEngine, emulator_options


def stored_bytes(root) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- Google Cloud Storage, against fake-gcs-server ---------------------------------------------

WRITES = [
    pytest.param({"shard_size": 40, "block_size": 4}, id="s2-5shards"),
    pytest.param({"shard_size": 60, "block_size": 4, "compression_strategy": 3}, id="s3-dict"),
    pytest.param({"shard_size": 50, "block_size": 10, "compression_strategy": 0}, id="s0"),
]


@pytest.mark.parametrize("options", WRITES)
def test_gcs_reads_equal_the_local_read(gcs, atlas, tmp_path, options):
    examples = make_examples(175)
    write_dataset(tmp_path / "ds", examples, **options)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "ds", "ds")
    with atlas.AtlasDataset(gcs.url("ds"), storage_options=gcs.options) as ds:
        assert len(ds) == len(examples)
        assert all(same(a, b) for a, b in zip(iter(ds), examples))
        idx = [174, 0, 87, 1, 40]
        assert all(same(a, examples[i]) for a, i in zip(ds.__getitems__(idx), idx))
    shared = tmp_path / "ds" / "zstd_dict.bin"
    extra = {"compression_dict_bytes": shared.read_bytes()} if shared.exists() else {}
    shard = atlas.AtlasDatasetShard(gcs.url("ds/0"), storage_options=gcs.options, **extra)
    local = atlas.AtlasDatasetShard(tmp_path / "ds" / "0", **extra)
    assert len(shard) == len(local) and all(same(shard[i], local[i]) for i in range(len(local)))
    # Every byte came from the emulator through the proxy, by GETs only.
    stats = gcs.proxy.stats()
    assert set(stats["methods"]) == {"GET"} and stats["body_bytes"] > 0


def test_gcs_random_reads_fetch_exact_ranges(gcs, atlas, tmp_path):
    examples = make_examples(400)
    write_dataset(tmp_path / "ds", examples, shard_size=400, block_size=4, compression_strategy=0)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "ds", "ds")
    ds = atlas.AtlasDataset(gcs.url("ds"), storage_options=gcs.options, cache_blocks=1)
    assert same(ds[0], examples[0])  # metadata and index fetched
    gcs.proxy.reset_stats()
    for i in (397, 5, 250):
        assert same(ds[i], examples[i])
    stats = gcs.proxy.stats()
    data = (tmp_path / "ds" / "0" / "data.bin").stat().st_size
    # One ranged GET per block read: far less than the shard, let alone the dataset.
    assert stats["methods"] == {"GET": 3}, stats
    assert stats["body_bytes"] < data / 20, (stats, data)


def test_storage_emulator_host_points_gs_at_the_emulator(gcs, atlas, tmp_path, monkeypatch):
    examples = make_examples(60)
    write_dataset(tmp_path / "ds", examples, shard_size=25, block_size=5)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "ds", "ds")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.proxy.url)
    with atlas.AtlasDataset(gcs.url("ds")) as ds:  # no storage_options at all
        assert all(same(a, b) for a, b in zip(iter(ds), examples)) and len(ds) == 60
    assert gcs.proxy.stats()["requests"] > 0
    # Without the "http://" a host:port is taken as plain HTTP, as Google's clients do.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.proxy.url.removeprefix("http://"))
    with atlas.AtlasDataset(gcs.url("ds"), storage_options={"request_bytes": 1 << 20}) as ds:
        assert same(ds[59], examples[59])


@pytest.mark.timeout(240)
def test_gcs_faults_give_identical_examples(gcs, atlas, tmp_path):
    examples = make_examples(600)
    write_dataset(tmp_path / "ds", examples, shard_size=200, block_size=4, compression_strategy=1)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "ds", "ds")
    options = dict(gcs.options, request_bytes=4 << 10, deadline=60, max_attempts=20)
    gcs.proxy.set(fault_rate=0.05)
    with atlas.AtlasDataset(gcs.url("ds"), storage_options=options) as ds:
        got = list(iter(ds))
        order = np.random.default_rng(1).permutation(len(ds))[:200]
        random = [ds[int(i)] for i in order]
    stats = gcs.proxy.stats()
    assert len(got) == len(examples) and all(same(a, b) for a, b in zip(got, examples))
    assert all(same(a, examples[int(i)]) for a, i in zip(random, order))
    assert sum(stats["faults"].values()) > 0, stats


def test_gcs_object_replaced_mid_read_raises(gcs, atlas, tmp_path):
    # fake-gcs-server ignores If-Match: the ETag of the answer itself gives the change away.
    examples = make_examples(256)
    write_dataset(tmp_path / "a", examples, shard_size=128, block_size=8, compression_strategy=0)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "a", "r")
    ds = atlas.AtlasDataset(gcs.url("r"), storage_options=gcs.options, cache_blocks=1)
    assert [ds[i]["id"] for i in (3, 70, 20)] == [3, 70, 20]
    others = make_examples(256, seed=5)
    write_dataset(tmp_path / "b", others, shard_size=128, block_size=8, compression_strategy=0)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "b", "r")
    with pytest.raises(ObjectChangedError, match=r"r/0/data\.bin \(shard 0, block 12\)") as e:
        ds[100]
    assert "replaced while being read" in str(e.value)


@pytest.mark.timeout(240)
def test_gcs_dataloader_workers(gcs, atlas, tmp_path, monkeypatch):
    """spawn: two workers, two epochs, example-identical. fork: obstore's runtime does not
    survive it and gs:// has no fallback here (gcsfs, hidden), so a clear StorageError naming
    the start methods that work, at once, not a hang."""
    from torch.utils.data import DataLoader

    examples = make_examples(200)
    write_dataset(tmp_path / "ds", examples, shard_size=50, block_size=5)
    gcs.server.upload_tree(gcs.bucket, tmp_path / "ds", "ds")
    ds = atlas.AtlasDataset(gcs.url("ds"), storage_options=gcs.options)
    assert same(ds[7], examples[7])  # the parent has used its client
    loader = DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=True,
        collate_fn=list,
    )
    for _ in range(2):
        got = [x for batch in loader for x in batch]
        assert len(got) == 200 and all(same(a, b) for a, b in zip(got, examples))
    loader._iterator._shutdown_workers()
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # the forked children inherit it
    loader = DataLoader(
        ds, batch_size=16, num_workers=2, multiprocessing_context="fork", collate_fn=list
    )
    batches = iter(loader)
    try:
        with pytest.raises(StorageError, match=r"forked from one that used obstore.*'spawn'"):
            next(batches)
    finally:
        batches._shutdown_workers()  # no worker outlives the test


def test_the_guides_gcs_emulator_example_runs(gcs, tmp_path, monkeypatch):
    """docs/remote.md's GCS emulator lines, with the emulator's address (through the proxy)
    in place of theirs."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "remote.md").read_text()
    section = guide[guide.index("### Google Cloud Storage and Azure") :]
    block = re.search(r"```py\n(.*?)```", section, flags=re.S).group(1)
    code = block[: block.index("# Azurite")].replace("http://127.0.0.1:4443", gcs.proxy.url)
    assert "STORAGE_EMULATOR_HOST=http://127.0.0.1:4443" in block
    examples = make_examples(30)
    write_dataset(tmp_path / "ds", examples, shard_size=10, block_size=5)
    gcs.server.create_bucket("my-bucket")
    try:
        gcs.server.upload_tree("my-bucket", tmp_path / "ds", "ds")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.proxy.url)
        namespace = {"atlas_fast": atlas_fast}
        exec(compile(code, "docs/remote.md: the GCS emulator example", "exec"), namespace)
        assert len(namespace["ds"]) == 30 and same(namespace["ds"][29], examples[29])
    finally:
        gcs.server.delete_bucket("my-bucket")


def test_gcs_missing_dataset_is_a_clear_error(gcs, atlas):
    with pytest.raises(AtlasFormatError, match=r"nothing-here/meta\.json: missing"):
        atlas.AtlasDataset(gcs.url("nothing-here"), storage_options=gcs.options)


# -- Azure: no emulator; a recording server shows what reaches the wire ------------------------


class Recorder:
    """An HTTP server on 127.0.0.1 that records each request (method, path, headers) and
    answers 404 BlobNotFound (or, for a container listing, an empty one)."""

    def __init__(self) -> None:
        self.requests: list = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                recorder.requests.append(
                    (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                if "comp=list" in self.path:
                    status = 200
                    body = b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults>'
                    body += b"<Blobs></Blobs><NextMarker/></EnumerationResults>"
                else:
                    status = 404
                    body = b'<?xml version="1.0" encoding="utf-8"?><Error>'
                    body += b"<Code>BlobNotFound</Code><Message>none</Message></Error>"
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def recorder(monkeypatch):
    for name in ("AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL", "AZURE_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    server = Recorder()
    yield server
    server.close()


def _reads(recorder) -> list:
    return [(m, p, h.get("authorization", "")) for m, p, h in recorder.requests]


def test_az_url_with_emulator_endpoint_reaches_it_signed(recorder, atlas):
    options = {"use_emulator": True, "endpoint": f"{recorder.url}/{AZURE_EMULATOR_ACCOUNT}"}
    with pytest.raises(AtlasFormatError, match=r"az://box/ds/meta\.json: missing"):
        atlas.AtlasDataset("az://box/ds", storage_options=options)
    method, path, auth = _reads(recorder)[0]
    assert (method, path) == ("GET", "/devstoreaccount1/box/ds/meta.json")
    assert auth.startswith("SharedKey devstoreaccount1:")
    assert recorder.requests[0][2].get("x-ms-version")


def test_az_obstore_emulator_variable_and_account_key_reach_the_endpoint(
    recorder, atlas, monkeypatch
):
    # obstore's own way: use_emulator with AZURITE_BLOB_STORAGE_URL.
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", recorder.url)
    with pytest.raises(AtlasFormatError, match="missing"):
        atlas.AtlasDataset("az://box/one", storage_options={"use_emulator": True})
    # An account of one's own at an http endpoint: AZURE_ALLOW_HTTP lets it through.
    monkeypatch.delenv("AZURITE_BLOB_STORAGE_URL")
    monkeypatch.setenv("AZURE_ALLOW_HTTP", "true")
    options = {"account_name": "acct", "account_key": "a2V5", "endpoint": f"{recorder.url}/acct"}
    with pytest.raises(AtlasFormatError, match="missing"):
        atlas.AtlasDataset("abfs://box/two", storage_options=options)
    reads = _reads(recorder)
    assert [(m, p) for m, p, _ in reads] == [
        ("GET", "/devstoreaccount1/box/one/meta.json"),
        ("GET", "/acct/box/two/meta.json"),
    ]
    assert reads[0][2].startswith("SharedKey devstoreaccount1:")
    assert reads[1][2].startswith("SharedKey acct:")


def test_az_writer_reaches_the_endpoint_signed(recorder, tmp_path):
    """The writer's requests go to the configured endpoint, signed with the account; when the
    store refuses the shards (the recorder stores nothing) the root meta.json is never put."""
    options = {"use_emulator": True, "endpoint": f"{recorder.url}/{AZURE_EMULATOR_ACCOUNT}"}
    warning = pytest.warns(RuntimeWarning, match="incomplete and has no meta.json")
    with (
        warning,
        pytest.raises(ObjectNotFoundError, match=r"az://box/out/\d/\w+\.\w+: could not be"),
    ):
        with AtlasDatasetWriter(
            "az://box/out", shard_size=5, block_size=2, storage_options=options
        ) as writer:
            for example in make_examples(10):
                writer.add_example(example)
    reads = _reads(recorder)
    # First the listing that looks for a dataset already there, then the shards' objects.
    assert reads[0][:2] == (
        "GET",
        "/devstoreaccount1/box?restype=container&comp=list&prefix=out%2F",
    )
    puts = {path for method, path, _ in reads if method == "PUT"}
    assert puts and all(p.startswith("/devstoreaccount1/box/out/") for p in puts), puts
    assert "/devstoreaccount1/box/out/meta.json" not in puts
    assert all(auth.startswith("SharedKey devstoreaccount1:") for _, _, auth in reads), reads


# -- options onto obstore's stores -------------------------------------------------------------


def test_emulator_options_gcs(monkeypatch):
    for name in ("GOOGLE_BASE_URL", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_BEARER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert emulator_options("gcs", {"base_url": "x"}) == {"base_url": "x"}
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:4443")
    got = emulator_options("gcs", {})
    assert got["base_url"] == "http://localhost:4443" and got["bearer_token"] == "emulator"
    # Credentials given are kept; a base_url given wins over the variable.
    got = emulator_options("gcs", {"service_account_key": "{}"})
    assert got["base_url"] == "http://localhost:4443" and "bearer_token" not in got
    assert emulator_options("gcs", {"base_url": "https://b"})["base_url"] == "https://b"
    assert "base_url" not in emulator_options("s3", {})


def test_emulator_options_azure(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_USE_EMULATOR", raising=False)
    # use_emulator alone is obstore's business (AZURITE_BLOB_STORAGE_URL or port 10000).
    assert emulator_options("azure", {"use_emulator": True}) == {"use_emulator": True}
    got = emulator_options("azure", {"use_emulator": "true", "endpoint": "http://h:1/devstore"})
    assert got["use_emulator"] is False and got["endpoint"] == "http://h:1/devstore"
    assert got["account_name"] == AZURE_EMULATOR_ACCOUNT and got["account_key"]
    got = emulator_options(
        "azure", {"use_emulator": True, "endpoint": "http://h:1/a", "account_name": "a"}
    )
    assert got["account_name"] == "a"
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "1")
    assert emulator_options("azure", {"endpoint": "http://h:1/a"})["use_emulator"] is False


def test_emulator_options_match_keys_in_any_case(monkeypatch):
    # obstore matches its keys in any case: so do the emulator settings, and an added key
    # never sits beside the user's capitalised spelling of it (obstore refuses duplicates).
    for name in ("GOOGLE_BASE_URL", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_BEARER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:4443")
    got = emulator_options("gcs", {"GOOGLE_BASE_URL": "https://b"})
    assert got == {"google_base_url": "https://b"}
    got = emulator_options("gcs", {"GOOGLE_SERVICE_ACCOUNT_KEY": "{}"})
    assert "bearer_token" not in got and got["google_service_account_key"] == "{}"
    monkeypatch.delenv("AZURE_STORAGE_USE_EMULATOR", raising=False)
    got = emulator_options(
        "azure", {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURE_STORAGE_ENDPOINT": "http://h:1/a"}
    )
    assert got["use_emulator"] is False and got["azure_storage_endpoint"] == "http://h:1/a"
    assert got["account_name"] == AZURE_EMULATOR_ACCOUNT


def test_az_capitalised_emulator_options_reach_the_endpoint(recorder, atlas):
    options = {
        "AZURE_STORAGE_USE_EMULATOR": "true",
        "AZURE_STORAGE_ENDPOINT": f"{recorder.url}/{AZURE_EMULATOR_ACCOUNT}",
    }
    with pytest.raises(AtlasFormatError, match=r"az://box/ds/meta\.json: missing"):
        atlas.AtlasDataset("az://box/ds", storage_options=options)
    assert _reads(recorder)[0][:2] == ("GET", "/devstoreaccount1/box/ds/meta.json")


@pytest.mark.parametrize(
    ("scheme", "kind", "variable"),
    [("gs", "gcs", "GOOGLE_ALLOW_HTTP"), ("az", "azure", "AZURE_ALLOW_HTTP")],
)
def test_options_reach_the_store(monkeypatch, scheme, kind, variable):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv(variable, raising=False)
    options = {"gcs": {"base_url": "http://h:1", "bearer_token": "t"}}.get(
        kind, {"account_name": "acct", "account_key": "a2V5", "endpoint": "http://h:1/acct"}
    )
    engine = ObstoreEngine(kind, scheme, "box", dict(options, client_options={"timeout": "9s"}))
    config = engine.store.config
    assert all(config[k] == v for k, v in options.items() if k != "bearer_token"), config
    assert engine.store.client_options["timeout"] == "9s"
    assert "allow_http" not in engine.store.client_options
    monkeypatch.setenv(variable, "true")
    engine = ObstoreEngine(kind, scheme, "box", options)
    assert engine.store.client_options["allow_http"] in (True, "true")


def test_engine_cache_follows_the_emulator_variables(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    first, _ = _engines.engine_for("gs", "box", {})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:2")
    second, _ = _engines.engine_for("gs", "box", {})
    assert first is not second
    assert second.store.config["base_url"] == "http://127.0.0.1:2"
