"""The writers' argument checks: one rule, one message and one type per bad value.

A bad value raises ``InvalidArgumentError``: a ``ValueError``, and an ``AssertionError`` as
the reference's ``assert`` raised (``except AssertionError`` keeps working); a value of the
wrong type raises ``InvalidArgumentTypeError``, a ``TypeError`` too. Raised explicitly, so
that ``python -O`` (which drops ``assert`` statements) changes nothing:
``test_the_checks_hold_under_python_O`` runs this module again under it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import BAD_WRITER_OPTIONS as BAD

from atlas_fast import (
    AtlasDatasetShardWriter,
    AtlasDatasetWriter,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from atlas_fast.writer import WriterOptions

GOOD = {"shard_size": 10, "block_size": 4}


def make_dataset_writer(path, **kwargs):
    return AtlasDatasetWriter(path, **{**GOOD, **kwargs})


def make_shard_writer(path, **kwargs):
    kwargs = {"block_size": 4, **kwargs}
    kwargs.pop("shard_size", None)
    return AtlasDatasetShardWriter(path, **kwargs)


WRITERS = {"dataset": make_dataset_writer, "shard": make_shard_writer}


CASES = [
    pytest.param(writer, *bad, id=f"{writer}-{bad[0]}={bad[1]!r}")
    for writer in sorted(WRITERS)
    for bad in BAD
    if not (writer == "shard" and bad[0] == "shard_size")  # a shard writer has none
]


@pytest.mark.parametrize("writer, option, value, kind, message", CASES)
def test_a_bad_option_is_refused_before_anything_is_written(
    tmp_path, writer, option, value, kind, message
):
    with pytest.raises(kind) as info:
        WRITERS[writer](tmp_path / "out", **{option: value})
    assert type(info.value) is kind
    assert str(info.value) == message
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, TypeError) == (kind is InvalidArgumentTypeError)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "option, value, kind, message", BAD, ids=[f"{o}={v!r}" for o, v, *_ in BAD]
)
def test_writer_options_say_the_same(option, value, kind, message):
    with pytest.raises(kind) as info:
        WriterOptions(**{option: value})
    assert type(info.value) is kind and str(info.value) == message


def test_strategy_2_needs_its_dictionary(tmp_path):
    with pytest.raises(
        InvalidArgumentError, match=r"compression_strategy 2 .* needs compression_dict"
    ):
        AtlasDatasetShardWriter(tmp_path / "s", 4, 2)
    assert not (tmp_path / "s").exists()


def test_integers_of_any_type_are_taken_as_ints(atlas, tmp_path):
    with AtlasDatasetWriter(
        tmp_path / "ds",
        np.int64(3),
        np.uint8(2),
        compression_strategy=np.int32(1),
        compression_level=np.int16(5),
        compression_dict_size=np.float32(0.5),
        workers=np.int64(1),
    ) as w:
        assert type(w.shard_size) is int and type(w.block_size) is int and w.workers == 1
        for i in range(7):
            w.add_example(i)
    ds = atlas.AtlasDataset(tmp_path / "ds")
    assert [ds[i] for i in range(len(ds))] == list(range(7))
    assert ds.shards[0].metadata.block_size == 2
    assert ds.shards[0].metadata.compression_dict_size == 0.5


DESTINATION_ARGUMENTS = (
    "storage_options",
    "overwrite",
    "staging_dir",
    "staging_bytes",
    "expected_examples",
)


def test_the_defaults_are_the_writers():
    import inspect

    options = WriterOptions()
    for cls in (AtlasDatasetWriter, AtlasDatasetShardWriter):
        for name, parameter in inspect.signature(cls).parameters.items():
            if name in ("path", "shard_size", "block_size", "compression_dict"):
                continue  # no default (shard and block size) or not an option
            if name in ("dictionary_source", "append", *DESTINATION_ARGUMENTS):
                continue  # not options of the format: how a destination is written
            if name in ("token_index", "token_field"):
                continue  # not options of the format: a file beside it (the token index)
            if cls is AtlasDatasetShardWriter and name == "compression_strategy":
                assert parameter.default == 3  # the reference's shard default
                continue
            assert parameter.default == getattr(options, name), (cls, name)


@pytest.mark.skipif(sys.flags.optimize > 0, reason="this is the run that starts the -O one")
def test_the_checks_hold_under_python_O(tmp_path):
    """The module again under ``python -O``: every check above still raises."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-O", "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-x"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


@pytest.mark.parametrize(
    "option, value, kind, message", BAD, ids=[f"{o}={v!r}" for o, v, *_ in BAD]
)
def test_convert_says_the_same(tmp_path, option, value, kind, message):
    """convert()'s options (its workers are processes, checked by the same rule)."""
    from atlas_fast.convert import convert

    src = tmp_path / "src.jsonl"
    src.write_text('{"a": 1}\n')
    with pytest.raises(kind) as info:
        convert(src, tmp_path / "out", "jsonl", **{option: value})
    assert type(info.value) is kind and str(info.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--shard-size", "0", "shard_size must be a positive integer, not 0"),
        ("--block-size", "-2", "block_size must be a positive integer, not -2"),
        (
            "--strategy",
            "4",
            "compression_strategy must be 0, 1, 2 or 3 (a CompressionStrategy), not 4",
        ),
        ("--level", "23", "compression_level must be an integer of at most 22, not 23"),
        ("--dict-size", "1.5", "compression_dict_size must be a number within [0, 1], not 1.5"),
        ("--workers", "0", "--workers must be a positive integer, not 0"),
    ],
)
def test_the_command_line_says_the_same(tmp_path, capsys, flag, value, message):
    from atlas_fast.cli import main

    src = tmp_path / "src.jsonl"
    src.write_text('{"a": 1}\n')
    assert main(["convert", str(src), str(tmp_path / "out"), "--from", "jsonl", flag, value]) == 1
    assert capsys.readouterr().err.startswith(f"atlas-fast convert: error: {message}\n")
    assert not (tmp_path / "out").exists()
