"""The mds converter source, against directories written by mosaicml-streaming's MDSWriter.

Marked ``mds``: mosaicml-streaming caps numpy below 2.2 and imports torchvision, so these
tests run in an environment of their own (``tools/test.sh`` makes it and runs ``-m mds``
there); the main run deselects them (``-m "not mds"`` in pyproject's addopts). They import
streaming without a guard: where they are selected, a missing library is a failure.
"""

from __future__ import annotations

import json
import pickle
from decimal import Decimal

import numpy as np
import pytest
from helpers import same

from atlas_fast.convert._source import SourceError

pytestmark = pytest.mark.mds

COLUMNS = {
    "bytes": "bytes",
    "str": "str",
    "int": "int",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "str_int": "str_int",
    "str_float": "str_float",
    "str_decimal": "str_decimal",
    "json": "json",
    "nd": "ndarray",
    "nd_dtype": "ndarray:int16",
    "nd_fixed": "ndarray:float32:2,3",
    "pil": "pil",
    "png": "png",
    "jpeg": "jpeg",
    "pils": "list[pil]",
    "pngs": "list[png]",
    "jpegs": "list[jpeg]",
    "jpeg_array": "jpeg_array",
}
LOSSY = {"jpeg", "jpegs", "jpeg_array"}
COMPRESSIONS = [None, "zstd", "zstd:7", "gz", "bz2", "br", "snappy"]


@pytest.fixture(scope="module")
def streaming():
    import streaming  # noqa: F401  (the library itself, not a guarded import: see above)
    from streaming.base.format.mds import encodings

    return encodings


def _image(rng, mode="RGB"):
    from PIL import Image

    shape = (6, 8, 3) if mode == "RGB" else (6, 8)
    return Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode)


def _jpeg_bytes(image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="JPEG")
    return buf.getvalue()


def _sample(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "bytes": bytes(rng.integers(0, 256, size=i % 13, dtype=np.uint8)),
        "str": f"document {i} é " * (i % 5),
        "int": i * 7919 - 100_000,
        "u8": np.uint8(i % 256),
        "u16": np.uint16(i * 300),
        "u32": np.uint32(i * 70_000),
        "u64": np.uint64(2**40 + i),
        "i8": np.int8(-(i % 128)),
        "i16": np.int16(-i * 100),
        "i32": np.int32(-i * 70_000),
        "i64": np.int64(-(2**40) - i),
        "f16": np.float16(i / 8),
        "f32": np.float32(i / 3),
        "f64": i / 7,
        "str_int": i - 20,
        "str_float": i / 4,
        "str_decimal": Decimal(f"{i}.{i:03d}"),
        "json": {"i": i, "tags": ["x"] * (i % 3), "nested": {"ok": i % 2 == 0}},
        "nd": rng.integers(-5, 5, size=(1 + i % 3, 2), dtype=np.int64),
        "nd_dtype": rng.integers(-300, 300, size=1 + i % 4, dtype=np.int16),
        "nd_fixed": rng.random((2, 3), dtype=np.float32),
        "pil": _image(rng),
        "png": _image(rng, "L"),
        "jpeg": _image(rng),
        "pils": [_image(rng) for _ in range(i % 3)],
        "pngs": [_image(rng, "L") for _ in range(1 + i % 2)],
        "jpegs": [_image(rng) for _ in range(i % 2)],
        "jpeg_array": [_jpeg_bytes(_image(rng)) for _ in range(1 + i % 2)],
    }


SAMPLES = 40


def _write(
    out, compression=None, hashes=None, columns=COLUMNS, samples=None, size_limit=1 << 13
) -> list[dict]:
    from streaming import MDSWriter

    samples = [_sample(i) for i in range(SAMPLES)] if samples is None else samples
    with MDSWriter(
        out=str(out), columns=columns, compression=compression, hashes=hashes, size_limit=size_limit
    ) as writer:
        for s in samples:
            writer.write(s)
    return samples


def _plain(value):
    """Images as (mode, size, pixels); containers recursively; the rest as it is."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return ("image", value.mode, value.size, np.asarray(value).tobytes())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _read_all(srcs) -> list:
    assert [s.split for s in srcs] == [None]
    out = []
    for part in srcs[0].parts:
        out.extend(pickle.loads(pickle.dumps(part.read))())
    return out


def _as_written(encodings, sample: dict) -> dict:
    """What was written, with lossy columns as the library decodes its own encoding of them."""
    out = {}
    for name, value in sample.items():
        code = COLUMNS[name]
        if name in LOSSY:
            value = encodings.mds_decode(code, encodings.mds_encode(code, value))
        out[name] = _plain(value)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, streaming):
    """An uncompressed directory and what streaming's own LocalDataset reads from it."""
    from streaming import LocalDataset

    root = tmp_path_factory.mktemp("mds") / "plain"
    written = _write(root)
    theirs = [_plain(s) for s in LocalDataset(local=str(root))]
    return root, written, theirs


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_encoding_and_compression(tmp_path, streaming, reference, compression):
    from atlas_fast.convert._mds import sources

    _, written, theirs = reference
    root = tmp_path / "mds"
    _write(root, compression=compression, hashes=["sha1", "xxh64"] if compression else None)
    index = json.loads((root / "index.json").read_text())
    srcs = sources(root)
    assert len(srcs[0].parts) == len(index["shards"]) > 3
    files = [s["zip_data" if compression else "raw_data"]["basename"] for s in index["shards"]]
    assert [p.label for p in srcs[0].parts] == [str(root / f) for f in files]
    assert [p.nbytes for p in srcs[0].parts] == [(root / f).stat().st_size for f in files]
    got = _read_all(srcs)
    assert len(got) == SAMPLES
    for g, t, w in zip(got, theirs, written):
        assert same(_plain(g), t)  # exactly what the library's own reader returns
        assert _compare(_plain(g), _as_written(streaming, w))


def _compare(got: dict, expected: dict) -> bool:
    """Values equal to what was written (scalars by value: the library returns numpy scalars
    for Python numbers; the exact types are checked against its own reader)."""
    assert got.keys() == expected.keys()
    for name in got:
        g, e = got[name], expected[name]
        assert same(g, e) if isinstance(e, np.ndarray) else g == e, name
    return True


def test_pickled_columns_need_allow_unsafe_types(tmp_path, streaming):
    from atlas_fast.convert._mds import sources

    samples = [{"obj": {"set": {1, 2}, "t": (i, "x")}, "n": i} for i in range(5)]
    _write(tmp_path / "p", "zstd", columns={"obj": "pkl", "n": "int"}, samples=samples)
    with pytest.raises(SourceError, match=r"index\.json: shard 0: column 'obj' is 'pkl'"):
        sources(tmp_path / "p")
    assert _read_all(sources(tmp_path / "p", allow_unsafe_types=True)) == samples


def _shard(root, k=0):
    """Shard ``k``'s file (the compressed one if any) and its index.json entry."""
    index = json.loads((root / "index.json").read_text())
    info = index["shards"][k]
    return root / info["zip_data" if info["compression"] else "raw_data"]["basename"], info


def _error(root) -> str:
    from atlas_fast.convert._mds import sources

    with pytest.raises(SourceError) as info:
        _read_all(sources(root))
    return str(info.value)


def _simple(root, compression=None, hashes=None):
    samples = [{"text": f"doc {i}", "n": i, "blob": b"x" * i} for i in range(30)]
    columns = {"text": "str", "n": "int", "blob": "bytes"}
    _write(root, compression, hashes, columns=columns, samples=samples, size_limit=512)
    return samples


def _simple_shard(tmp_path, k=0, compression=None, hashes=None):
    """A small MDS directory, shard ``k``'s file, index entry and bytes (to damage)."""
    root = tmp_path / "m"
    _simple(root, compression, hashes)
    path, info = _shard(root, k)
    return root, path, info, bytearray(path.read_bytes())


def test_corrupt_offset_table(tmp_path, streaming):
    root, path, _, data = _simple_shard(tmp_path)
    data[4 + 4 * 3 : 4 + 4 * 4] = np.uint32(len(data) + 50).tobytes()  # sample 3's start
    path.write_bytes(bytes(data))
    assert _error(root).startswith(f"{path}: sample 3: offset table corrupt (offset 3 is ")


def test_corrupt_sample_sizes_and_text(tmp_path, streaming):
    root, path, info, data = _simple_shard(tmp_path)
    offsets = np.frombuffer(bytes(data), np.uint32, info["samples"] + 1, 4)
    start = int(offsets[4])  # sample 4: "doc 4", 4, b"xxxx"
    variable = [n for n, size in zip(info["column_names"], info["column_sizes"]) if not size]
    sizes = {"text": 5, "n": 8, "blob": 4}
    text = 4 * len(variable) + sum(
        sizes[n] for n in info["column_names"][: info["column_names"].index("text")]
    )
    fixed = bytes(data)
    data[start : start + 4] = np.uint32(1000 + sizes[variable[0]]).tobytes()
    path.write_bytes(bytes(data))
    assert _error(root) == (
        f"{path}: sample 4: its column sizes add up to 1025 bytes, the sample has 25"
    )
    data = bytearray(fixed)
    assert data[start + text : start + text + 5] == b"doc 4"
    data[start + text] = 0xFF  # not UTF-8
    path.write_bytes(bytes(data))
    assert _error(root).startswith(f"{path}: sample 4: cannot decode: UnicodeDecodeError")


def test_truncated_and_hashed_shards(tmp_path, streaming):
    root, path, _, data = _simple_shard(tmp_path, 1, hashes=["sha1"])
    path.write_bytes(data[:-10])
    assert _error(root) == (
        f"{path}: {len(data) - 10} bytes, index.json says {len(data)}: truncated?"
    )
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert _error(root) == f"{path}: sha1 hash differs from index.json's: corrupt"


def test_corrupt_zstd_shard(tmp_path, streaming):
    root, path, _, data = _simple_shard(tmp_path, 0, "zstd")
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert _error(root).startswith(f"{path}: ")


def test_missing_files(tmp_path, streaming):
    from atlas_fast.convert._mds import sources

    root = tmp_path / "m"
    _simple(root)
    path, _ = _shard(root, 1)
    path.unlink()
    with pytest.raises(SourceError, match=rf"^{path}: cannot read shard 1 of index\.json"):
        sources(root)
    (root / "index.json").unlink()
    with pytest.raises(SourceError, match=r"index\.json: not found"):
        sources(root)
    with pytest.raises(SourceError, match=r"nothing: no such file or directory"):
        sources(tmp_path / "nothing")


# End to end, through the framework: ``convert()`` and ``atlas-fast convert``.


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_end_to_end(tmp_path, atlas, streaming, reference, workers):
    from convert_helpers import read_back

    from atlas_fast.convert import convert

    _, _, theirs = reference
    _write(tmp_path / "src", compression="zstd", hashes=["xxh64"])
    summary = convert(
        tmp_path / "src", tmp_path / "out", "mds", workers=workers, verify=True, shard_size=15
    )
    assert summary.examples == SAMPLES and summary.shards >= 3 and summary.verified
    got = read_back(atlas, tmp_path / "out")
    assert len(got) == SAMPLES
    for g, t in zip(got, theirs):
        assert same(_plain(g), t)


def test_cli_corrupt_shard_leaves_no_destination(tmp_path, capsys, streaming):
    from convert_helpers import assert_absent

    from atlas_fast import cli

    root, path, _, data = _simple_shard(tmp_path, 2)
    data[-3:] = b"\xff\xff\xff"  # the last sample's text: not UTF-8
    path.write_bytes(bytes(data))
    dst = tmp_path / "out"
    assert cli.main(["convert", str(root), str(dst), "--from", "mds", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"{path}: sample " in err and "cannot decode" in err
    assert_absent(dst)


def test_convert_pickled_columns_option(tmp_path, atlas, streaming):
    from convert_helpers import read_back

    from atlas_fast.convert import convert

    samples = [{"obj": {"set": {1, 2}}, "n": i} for i in range(4)]
    _write(tmp_path / "p", columns={"obj": "pkl", "n": "int"}, samples=samples)
    with pytest.raises(SourceError, match="allow_unsafe_types"):
        convert(tmp_path / "p", tmp_path / "out", "mds")
    convert(tmp_path / "p", tmp_path / "out", "mds", allow_unsafe_types=True)
    assert read_back(atlas, tmp_path / "out") == samples
    # the same from the command line
    from atlas_fast import cli

    argv = ["convert", str(tmp_path / "p"), str(tmp_path / "cli"), "--from", "mds", "--quiet"]
    assert cli.main(argv) == 1
    assert not (tmp_path / "cli").exists()
    assert cli.main([*argv, "--allow-unsafe-types"]) == 0
    assert read_back(atlas, tmp_path / "cli") == samples


def test_corrupt_image_is_named_by_sample(tmp_path, streaming):
    """Images are decoded (PIL loads lazily) while the sample is read, so a broken one is a
    SourceError here, not a PIL error when the writer pickles the example."""
    from PIL import Image

    from atlas_fast.convert._mds import sources

    rng = np.random.default_rng(0)
    samples = [{"png": _image(rng), "n": i} for i in range(3)]
    _write(tmp_path / "m", columns={"png": "png", "n": "int"}, samples=samples)
    path, info = _shard(tmp_path / "m")
    data = bytearray(path.read_bytes())
    offsets = np.frombuffer(bytes(data), np.uint32, info["samples"] + 1, 4)
    idat = data.index(b"IDAT", int(offsets[1])) + 4
    data[idat : idat + 8] = b"\x00" * 8
    path.write_bytes(bytes(data))
    part = sources(tmp_path / "m")[0].parts[0]
    got = []
    with pytest.raises(SourceError, match=rf"^{path}: sample 1: cannot decode: "):
        got.extend(part.read())
    assert len(got) == 1 and isinstance(got[0]["png"], Image.Image)
