"""The errors a new user meets first: each of its type, naming the argument, the example or
the path it is about, on both backends."""

from __future__ import annotations

import pickle
import warnings

import pytest
from helpers import write_dataset

import atlas_fast
from atlas_fast import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    UnpicklableExampleError,
)
from atlas_fast.cli import main
from atlas_fast.cli.verify import verify


@pytest.fixture
def small(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, list(range(30)), shard_size=10, block_size=2, compression_strategy=1)
    return root


@pytest.mark.parametrize("reader", ["AtlasDataset", "AtlasDatasetShard"])
@pytest.mark.parametrize("root", [123, None, 1.5, ["ds"]])
def test_a_root_that_is_no_path(atlas, reader, root):
    with pytest.raises(InvalidArgumentTypeError) as info:
        getattr(atlas, reader)(root)
    assert isinstance(info.value, TypeError)  # as pathlib's error was
    assert f"{reader}: root must be a path" in str(info.value)
    assert type(root).__name__ in str(info.value)


@pytest.mark.parametrize("reader", ["AtlasDataset", "AtlasDatasetShard"])
def test_an_unknown_keyword_names_the_public_class(atlas, small, reader):
    root = small if reader == "AtlasDataset" else small / "0"
    with pytest.raises(TypeError) as info:
        getattr(atlas, reader)(root, cache_byte=1 << 20)
    message = str(info.value)
    assert f"{reader}.__init__()" in message and "'cache_byte'" in message
    assert "Methods" not in message  # not the internal mixin's name


def test_sampler_arguments(atlas, small):
    ds = atlas.AtlasDataset(small)
    with pytest.raises(InvalidArgumentError, match=r"^batch_size must be a positive integer"):
        atlas_fast.BlockShuffleSampler(ds, batch_size=0)
    with pytest.raises(InvalidArgumentError, match=r"^batch_size must be a positive integer"):
        atlas_fast.BlockShuffleSampler(ds, batch_size=0, num_workers=2)
    with pytest.raises(InvalidArgumentError) as info:
        atlas_fast.BlockShuffleSampler(ds, batch_size=4)
    assert "batch_size given without num_workers" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        atlas_fast.BlockShuffleSampler(ds, num_workers=2)
    assert "num_workers given without batch_size" in str(info.value)


@pytest.mark.parametrize("sampler", ["BlockShuffleSampler", "MixtureSampler"])
def test_load_state_dict_of_something_else(atlas, small, sampler):
    ds = atlas.AtlasDataset(small)
    if sampler == "BlockShuffleSampler":
        s = atlas_fast.BlockShuffleSampler(ds)
    else:
        s = atlas_fast.MixtureSampler(
            atlas_fast.MixtureDataset({"a": ds}), {"a": 1}, global_batch_size=5
        )
    with pytest.raises(InvalidArgumentError) as info:
        s.load_state_dict({})
    assert f"{sampler}.load_state_dict: state lacks 'epoch', 'yielded'" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        s.load_state_dict({"epoch": 0})
    assert "lacks 'yielded'" in str(info.value)
    with pytest.raises(InvalidArgumentTypeError) as info:
        s.load_state_dict([0, 5])
    assert "state must be a dict" in str(info.value)
    s.load_state_dict(s.state_dict())  # what state_dict() gives is taken


def _unpicklable():
    return lambda: None  # a local lambda: pickle refuses it


@pytest.mark.parametrize(
    "where, workers", [("middle", None), ("middle", 2), ("last block", None), ("last block", 2)]
)
def test_an_example_that_does_not_pickle(tmp_path, where, workers):
    """Named by its number, of both error types; the dataset's directory is gone, no warning,
    and the writer refuses more."""
    path = tmp_path / "ds"
    before = 24 if where == "middle" else 25  # 25: alone in the last block, pickled at close
    kwargs = {} if workers is None else {"workers": workers}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UnpicklableExampleError) as info:
            with atlas_fast.AtlasDatasetWriter(path, 10, 2, **kwargs) as writer:
                for i in range(before):
                    writer.add_example(i)
                writer.add_example(_unpicklable())
                if where == "middle":
                    writer.add_example(0)
    error = info.value
    assert isinstance(error, InvalidArgumentError) and isinstance(error, pickle.PicklingError)
    assert error.index == before
    assert str(error).startswith(f"{path}: example {before} (shard 2, block ")
    assert isinstance(error.__cause__, Exception)
    assert not path.exists()
    with pytest.raises(ValueError, match="closed"):
        writer.add_example(1)


def test_an_example_that_does_not_pickle_in_a_shard_writer(tmp_path):
    path = tmp_path / "shard"
    with pytest.raises(UnpicklableExampleError) as info:
        with atlas_fast.AtlasDatasetShardWriter(path, 4) as writer:
            for i in range(5):
                writer.add_example(i)
            writer.add_example(_unpicklable())
            writer.add_example(0)
            writer.add_example(0)
    assert info.value.index == 5 and f"{path}: example 5 does not pickle" in str(info.value)
    assert not path.exists()
    assert pickle.loads(pickle.dumps(info.value)).index == 5


@pytest.mark.parametrize("url", ["s4://bucket/ds", "s3a-typo://bucket/ds", "htps://host/ds"])
@pytest.mark.parametrize("reader", ["AtlasDataset", "AtlasDatasetShard"])
def test_an_unknown_url_scheme(atlas, url, reader):
    with pytest.raises(InvalidArgumentError) as info:
        getattr(atlas, reader)(url)
    assert isinstance(info.value, ValueError) and not isinstance(
        info.value, atlas_fast.AtlasFormatError
    )
    scheme = url.partition(":")[0]
    assert str(info.value).startswith(f"{url}: unknown URL scheme {scheme}://")


def test_a_misspelled_storage_option(atlas):
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    url = "s3://some-bucket/ds"
    with pytest.raises(InvalidArgumentError) as info:
        atlas.AtlasDataset(url, storage_options={"endpont_url": "http://127.0.0.1:9"})
    assert str(info.value).startswith(f"{url}: storage_options['endpont_url'] is not a setting")
    assert "Debug source" not in str(info.value)


def test_a_missing_shard_fails_verify_unless_partial(atlas, small, capsys):
    """Reading reads the shards present (as the reference); verify calls a copy lacking some
    a problem, naming them, unless told it is partial."""
    import shutil

    shutil.rmtree(small / "1")
    ds = atlas.AtlasDataset(small)
    assert len(ds) == 20 and ds[10] == 20
    report = verify(small, readers=atlas)
    assert not report["ok"] and report["examples"] == 20
    (problem,) = report["problems"]
    assert problem["file"] == str(small / "meta.json") and "(shards 1)" in problem["message"]
    assert "--partial" in problem["message"]
    report = verify(small, readers=atlas, partial=True)
    assert report["ok"] and "(shards 1)" in report["notes"][0]
    assert main(["verify", str(small)]) == 1
    assert main(["verify", "--partial", str(small)]) == 0
    assert "(shards 1)" in capsys.readouterr().out


def test_info_describes_nothing_it_could_not_read(tmp_path, capsys):
    (tmp_path / "ds").mkdir()
    assert main(["info", str(tmp_path / "ds")]) == 1
    out = capsys.readouterr()
    assert out.out == ""  # no "shards: 0 / examples: 0"
    assert f"{tmp_path / 'ds' / 'meta.json'}: meta.json is missing" in out.err
    assert f"{tmp_path / 'ds'}: nothing could be read to describe" in out.err
