"""Write the golden datasets of tests/golden with the reference package, torch_atlas_ds.

Each case is a folder ``<case>/`` holding ``dataset/`` (written by torch_atlas_ds's
AtlasDatasetWriter, unchanged) and ``expected.pkl`` (the examples it was given, in order,
pickled with protocol 4): the suite reads each dataset through both backends and compares
example for example (tests/test_reference_fixtures.py and the tests taking the
``reference_case`` fixture). README.md in this folder says what each case covers.

Regenerate (needs torch, numpy and zstandard, and the reference package, which is not on
PyPI: ``pip install --no-deps torch_atlas_ds-0.1.0-py3-none-any.whl`` from a wheel built
from https://github.com/EIDOSLAB/torch-atlas-ds)::

    python tests/golden/make.py            # rewrites every case
    python tests/golden/make.py --check    # exits 1 if a case differs from what it writes
    python tests/golden/make.py --out DIR  # writes (or with --check compares) DIR instead

The examples are made from fixed seeds, and strategies 0 and 1 are byte-for-byte
reproducible; the zstd dictionaries of strategies 2 and 3 depend on the libzstd version
(recorded in README.md), so ``--check`` compares those cases by their examples only.
"""

from __future__ import annotations

import argparse
import filecmp
import pickle
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
    "rho sigma tau upsilon phi chi psi omega"
).split()


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(low, high)))


def docs(n: int, seed: int) -> list:
    """Documents: ``{"id": "doc-<i>", "text": ...}`` of 10 to 40 words."""
    rng = random.Random(seed)
    return [{"id": f"doc-{i}", "text": _text(rng, 10, 40)} for i in range(n)]


def mixed(n: int, seed: int) -> list:
    """Examples of every kind a dataset holds, in turn: documents, texts (non-ASCII too),
    bytes, numpy arrays of several dtypes and shapes (empty ones too), tuples of scalars,
    lists, big integers, floats (nan, -0.0, inf), None, nested containers and sets."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    dtypes = [np.uint16, np.int64, np.float32, np.float64, np.bool_, np.int8]
    out = []
    for i in range(n):
        kind = i % 10
        if kind == 0:
            out.append({"id": f"doc-{i}", "text": _text(rng, 5, 60), "score": i / 7})
        elif kind == 1:
            out.append(_text(rng, 1, 12))
        elif kind == 2:
            out.append(rng.randbytes(rng.randrange(0, 64)))
        elif kind == 3:
            dtype = dtypes[(i // 10) % len(dtypes)]
            shape = [(), (0,), (rng.randrange(1, 40),), (3, rng.randrange(1, 5))][(i // 10) % 4]
            out.append((nprng.standard_normal(shape) * 1000).astype(dtype))
        elif kind == 4:
            out.append((i, -6.0, None, True, 3 + 4j))
        elif kind == 5:
            out.append([_text(rng, 1, 3) for _ in range(rng.randrange(0, 4))])
        elif kind == 6:
            out.append(-(rng.getrandbits(70)) if i % 20 == 6 else rng.getrandbits(20))
        elif kind == 7:
            out.append([float("nan"), -0.0, float("inf"), 1e-300][(i // 10) % 4])
        elif kind == 8:
            out.append(f"naïve café ☃ {i} " + "ü" * rng.randrange(0, 8))
        else:
            out.append({"nested": [{"k": (i, None)}, frozenset({i, i + 1})], "set": {i}})
    return out


def big(n: int, seed: int) -> list:
    """Large examples, past pickle's 64 KiB frame (each is pickled out of frame), between
    small ones; a shard holding them needs a uint32 index."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append({"id": i, "small": _text(rng, 1, 4)})
        elif i % 4 == 0:
            out.append(rng.randbytes(66_000 + i))
        else:
            out.append(_text(rng, 13_000, 13_001))  # about 70 KB of text, in a block alone
    return out


class Case(NamedTuple):
    """A case: what makes its examples (from fixed seeds) and the arguments the reference's
    writer takes for it. README.md says what each case covers."""

    examples: Callable[[], list]
    shard_size: int
    block_size: int
    compression_strategy: int
    compression_level: int | None = None  # None: the writer's default

    def writer_options(self) -> dict:
        options = self._asdict()
        del options["examples"]
        return {k: v for k, v in options.items() if v is not None}


# name: Case(examples, shard_size, block_size, compression_strategy[, compression_level]):
# the four strategies over the same kind of examples (seeded by the strategy), then the edges.
CASES = {f"mixed_s{s}_b4": Case(partial(mixed, 75, s), 32, 4, s) for s in range(4)} | {
    "level19_s2": Case(partial(docs, 80, 19), 56, 8, 2, compression_level=19),
    "one_example_s2": Case(lambda: ["only"], 4, 8, 2),
    "tiny_index_s0": Case(lambda: [b"x"] * 5, 5, 5, 0),
    "block1_s3": Case(partial(docs, 16, 1), 8, 1, 3),
    "eleven_shards_s1": Case(partial(mixed, 34, 11), 3, 2, 1),
    "big_examples_s0": Case(partial(big, 3, 0), 2, 2, 0),
}


def write_case(name: str, dest: Path) -> None:
    """``dest/dataset`` and ``dest/expected.pkl`` of case ``name``."""
    from torch_atlas_ds import AtlasDatasetWriter

    case = CASES[name]
    examples = case.examples()
    dest.mkdir(parents=True)
    with AtlasDatasetWriter(str(dest / "dataset"), **case.writer_options()) as writer:
        for example in examples:
            writer.add_example(example)
    with open(dest / "expected.pkl", "wb") as f:
        pickle.dump(examples, f, protocol=4)


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    if filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)[1:] != ([], []):
        return False
    return all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE,
        metavar="DIR",
        help="the folder of the cases, written or compared (default: this one, tests/golden)",
    )
    parser.add_argument("cases", nargs="*", help="only these cases (default: all)")
    args = parser.parse_args(argv)
    names = args.cases or list(CASES)
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            fresh = Path(tmp) / name
            write_case(name, fresh)
            target = args.out / name
            if args.check:
                deterministic = CASES[name].compression_strategy in (0, 1)
                if deterministic:
                    ok = target.is_dir() and _same_tree(fresh, target)
                else:
                    ok = (target / "expected.pkl").is_file() and (
                        (target / "expected.pkl").read_bytes()
                        == (fresh / "expected.pkl").read_bytes()
                    )
                if not ok:
                    differ.append(name)
                continue
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(fresh, target)
    if differ:
        print("differ from what make.py writes:", " ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
