"""Token sequences for language models (issue 32): ``TokenSequences`` read through a DataLoader
in a ``TokenShuffleSampler`` epoch, beside the floors and the peers, in one run.

    python benchmarks/bench_tokens.py                      # full run (2-3 minutes on 2 cores)
    python benchmarks/bench_tokens.py --quick              # one copy, 3 repetitions (< 1 minute)
    python benchmarks/bench_tokens.py --json out.json      # every figure, as JSON
    python benchmarks/tables.py import out.json bench_tokens   # into results/, then the tables

The corpus (``atlas_fast.bench.corpus.token_documents``): every stdlib source file as one
document of uint16 word-level token ids (lengths from a few tokens to ~250,000; median ~2,000),
five copies over (49M tokens; ``--quick``: one copy). Written once into the bench cache folder
as: Atlas datasets of blocks of 16 documents, uncompressed (strategy 0) and zstd (strategy 1),
by atlas_fast (each carries its token index, tokens.idx); the zstd one again by the reference
package ``torch_atlas_ds`` (no token index); the concatenation as one flat uint16 file; and,
when the MDS venv has LitData, LitData's own ``optimize`` output for its ``TokensLoader``.

Rows (seq_len 2048, batches of 32 rows (200 a run without workers, 600 with: their start-up
must not dominate), ``torch.utils.data.DataLoader`` with 0 and 2 workers,
``collate_fn=atlas_fast.tokens.collate``; every figure a median of ``--reps`` repetitions, each
pair of contenders run side by side in alternating order, and the ratio the median of the
paired ratios):

- ``uncompressed / memmap``: atlas_fast (``TokenSequences`` + ``TokenShuffleSampler``, the
  sampler's cost included) against a ``numpy.memmap`` gather of the same windows from the flat
  file (keys computed before the clock starts; inputs and targets as int64, as a hand-written
  loader makes them): target >= 0.5x;
- ``zstd / floor``: atlas_fast on the zstd dataset against the floor "decompress each block the
  windows touch once, then copy": each worker decompresses (python-zstandard, the same libzstd)
  every block its batches touch the first time they touch it, and copies the rows as the
  memmap gather does: atlas_fast's time over the floor's (the floor's rate over ours),
  target <= 1.25x;
- ``litdata``: LitData's ``StreamingDataset(item_loader=TokensLoader(block_size=2048),
  shuffle=True)`` over its own ``optimize`` output of the same tokens, through its
  ``StreamingDataLoader`` in the MDS venv (benchmarks/remote_peers.py finds it; skipped with
  the reason when absent), against atlas_fast on the uncompressed dataset with
  ``compact=True``: target >= 1.0x. Both hand the stored uint16 tokens over (atlas_fast also
  where each document starts: ``atlas_fast.tokens.expand`` builds the rows from them where
  they are used); the rows as int64 arrays (``inputs``, ``targets``, ``positions``: 24 bytes
  a token through the workers' shared memory) are a third contender, shown beside;
- ``by hand``: the same windows read through ``AtlasDataset.__getitem__`` (the documents each
  window overlaps, located by a table of document lengths made before the clock starts) and
  concatenated with numpy, the way a user writes it without ``TokenSequences`` (inputs and
  targets, as the memmap loader makes them; a quarter of the batches): target >= 5x;
- ``index build``: ``TokenSequences(..., index="rebuild")`` on the reference's dataset (no
  token index) against a plain pass over the same dataset (``for x in AtlasDataset(root)``),
  each backend, each measurement as many passes as last half a second (after one untimed
  pass each): target >= 0.8x, by the wall clock;
- ``open``: ``TokenSequences(root, 2048)`` on the zstd dataset in a fresh process under
  ``strace -f -e trace=open,openat`` (a Python audit hook when strace is absent): the files
  of the dataset opened must be its meta.json and tokens.idx alone (an assertion: the run
  fails otherwise); their sizes are reported.

Rates are tokens per second (tokens of the rows handed out after the first batch, by the wall
clock from the first batch on); CPU ns/token is the CPU time of this process and its workers
(start-up included) over the tokens of the whole run. Needs torch.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _peer_common import cpu_seconds, token_batches  # noqa: E402

SEQ_LEN = 2048
BATCH = 32
BLOCK = 16
SHARD = 2000
WORKERS = (0, 2)
MIN_SECONDS = 0.5  # what one measurement of the index build and its plain pass lasts, at least
TARGETS = {
    "memmap": (">=", 0.5),
    "floor": ("<=", 1.25),  # a ratio of times: atlas_fast's over the floor's
    "litdata": (">=", 1.0),
    "by hand": (">=", 5.0),
    "index build": (">=", 0.8),
}


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


# -- the datasets ------------------------------------------------------------------------------


def build(cache: Path, copies: int, documents=None) -> dict:
    """The corpus's files (written once): ``{"s0", "s1", "ref", "flat", "lengths", "root"}``;
    ``documents``: only the first so many documents (the tests' small corpus)."""
    from atlas_fast.bench import corpus

    cut = f"-first{documents}" if documents else ""
    root = cache / f"tokens-bench-py{platform.python_version()}-x{copies}{cut}"
    done = root / ".complete"
    paths = {
        "s0": root / "s0",
        "s1": root / "s1",
        "ref": root / "ref-s1",
        "flat": root / "flat.u16",
        "lengths": root / "lengths.npy",
    }
    if not done.exists():
        progress(f"writing the token corpus x{copies} into {root}")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        docs = corpus.token_documents(copies)[:documents]
        import atlas_fast

        for strategy, key in ((0, "s0"), (1, "s1")):
            with atlas_fast.AtlasDatasetWriter(
                paths[key], shard_size=SHARD, block_size=BLOCK, compression_strategy=strategy
            ) as writer:
                for d in docs:
                    writer.add_example(d)
        from atlas_fast.bench import reference

        module, why = reference.load()
        if module is None:
            raise SystemExit(f"the index build row needs the reference package: {why}")
        writer = module.AtlasDatasetWriter(
            str(paths["ref"]), shard_size=SHARD, block_size=BLOCK, compression_strategy=1
        )
        for d in docs:
            writer.add_example(d)
        writer.close()
        np.concatenate(docs).tofile(paths["flat"])
        np.save(paths["lengths"], np.array([len(d) for d in docs], dtype=np.int64))
        done.write_text("ok\n")
    for p in paths.values():
        warm(p)
    paths["root"] = root
    return paths


def warm(path: Path) -> None:
    """Read every file once: the page cache is warm for every contender alike."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in files:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


# -- the contenders' datasets ------------------------------------------------------------------


class PlannedBatches:
    """A ``batch_sampler`` handing out batches of keys computed before the clock starts."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _ranges(keys) -> tuple:
    """``(starts, counts, out)`` of a batch's keys (tuples of ranges): each range's first
    token, its length and its flat position in the batch."""
    flat = np.fromiter(itertools.chain.from_iterable(keys), dtype=np.int64)
    starts, counts = flat[0::2], flat[1::2]
    return starts, counts, np.cumsum(counts) - counts


class FlatTokens:
    """The hand-written loader: the windows copied out of a ``numpy.memmap`` of the flat token
    file, inputs (the token before each) and targets as int64. With ``blocks`` (the stored
    extents of the zstd dataset's blocks and the tokens before each): first decompresses every
    block the batch touches that this process has not decompressed yet (the floor)."""

    def __init__(self, path, blocks=None) -> None:
        self.path = str(path)
        self.blocks = blocks
        self._mm = None
        self._seen: set = set()

    def __getitems__(self, keys):
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint16, mode="r")
            if self.blocks is not None:
                import zstandard

                self._dctx = zstandard.ZstdDecompressor()
                self._data = {}
        mm = self._mm
        starts, counts, out = _ranges(keys)
        if self.blocks is not None:
            cum, files, offsets, shard_of, block_of = self.blocks
            first = np.searchsorted(cum, starts, side="right") - 1
            last = np.searchsorted(cum, starts + counts - 1, side="right") - 1
            for g in set(itertools.chain.from_iterable(map(range, first, last + 1))):
                if g in self._seen:
                    continue
                self._seen.add(g)
                s = shard_of[g]
                data = self._data.get(s)
                if data is None:
                    data = self._data[s] = np.memmap(files[s], dtype=np.uint8, mode="r")
                b = block_of[g]
                self._dctx.decompress(data[offsets[s][b] : offsets[s][b + 1]])
        n = len(keys)
        length = int(counts.sum()) // n
        targets = np.empty(n * length, dtype=np.int64)
        inputs = np.empty(n * length, dtype=np.int64)
        for s, c, o in zip(starts.tolist(), counts.tolist(), out.tolist()):
            if s:
                piece = mm[s - 1 : s + c]
                targets[o : o + c] = piece[1:]
                inputs[o : o + c] = piece[:-1]
            else:
                targets[o : o + c] = mm[:c]
                inputs[o] = 0
                inputs[o + 1 : o + c] = mm[: c - 1]
        return {"inputs": inputs.reshape(n, length), "targets": targets.reshape(n, length)}


class ByHand:
    """The windows read through ``AtlasDataset.__getitem__``: each document a window overlaps
    (a table of document starts made before the clock) read and the pieces concatenated."""

    def __init__(self, root, lengths) -> None:
        self.root = str(root)
        self.starts = np.concatenate(([0], np.cumsum(lengths)))
        self._ds = None

    def __getitems__(self, keys):
        if self._ds is None:
            import atlas_fast

            self._ds = atlas_fast.AtlasDataset(self.root)
        ds, doc_starts = self._ds, self.starts
        targets, inputs = [], []
        for key in keys:
            parts, before = [], []
            for s, c in zip(key[::2], key[1::2]):
                if s:  # the token before the range too: the inputs are the tokens shifted
                    s, c = s - 1, c + 1
                else:
                    before.append(np.zeros(1, dtype=np.int64))
                d = int(np.searchsorted(doc_starts, s, side="right")) - 1
                while c > 0:
                    doc = ds[d]
                    a = s - int(doc_starts[d])
                    take = min(c, len(doc) - a)
                    parts.append(doc[a : a + take])
                    s, c, d = s + take, c - take, d + 1
            row = np.concatenate(before + parts).astype(np.int64)
            # (a range after the first brings its own token before: drop them from targets)
            targets.append(row[1:] if len(key) == 2 else _drop_firsts(row, key))
            inputs.append(row[:-1] if len(key) == 2 else _drop_lasts(row, key))
        return {"inputs": np.stack(inputs), "targets": np.stack(targets)}


def _drop_firsts(row, key):
    """The targets of a row of several ranges read each with the token before it."""
    out, at = [], 0
    for c in key[1::2]:
        out.append(row[at + 1 : at + 1 + c])
        at += c + 1
    return np.concatenate(out)


def _drop_lasts(row, key):
    out, at = [], 0
    for c in key[1::2]:
        out.append(row[at : at + c])
        at += c + 1
    return np.concatenate(out)


def zstd_blocks(root: Path):
    """What the floor needs of the zstd dataset: each block's first token (from its token
    index), each shard's data.bin and block offsets, each block's shard and number in it."""
    import atlas_fast

    ts = atlas_fast.TokenSequences(str(root), SEQ_LEN)
    cum = np.asarray(ts._index.cum, dtype=np.int64)
    first = np.asarray(ts._index.first, dtype=np.int64)
    shards = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: int(p.name))
    files = [str(p / "data.bin") for p in shards]
    offsets = [np.load(p / "index.npy").astype(np.int64) for p in shards]
    shard_of = np.searchsorted(first, np.arange(len(cum) - 1), side="right") - 1
    block_of = np.arange(len(cum) - 1) - first[shard_of]
    return cum, files, offsets, shard_of.tolist(), block_of.tolist()


# -- one measurement ---------------------------------------------------------------------------


def run_loader(dataset, workers: int, batches: int, sampler=None, planned=None) -> dict:
    """Iterate ``batches`` batches of a DataLoader over ``dataset``: ``{"tokens_per_s",
    "cpu_ns_per_token", "tokens"}`` (rates after the first batch; CPU over the whole run,
    workers included once they are joined)."""
    from torch.utils.data import DataLoader

    from atlas_fast.tokens import collate

    kwargs = {"num_workers": workers, "collate_fn": collate}
    if workers:
        kwargs["prefetch_factor"] = 4
        kwargs["persistent_workers"] = False

    def make():
        if planned is not None:
            return DataLoader(dataset, batch_sampler=PlannedBatches(planned), **kwargs)
        return DataLoader(dataset, batch_size=BATCH, sampler=sampler, **kwargs)

    # A compact batch arrives as numpy arrays (collate keeps it so), the others as tensors.
    return token_batches(make, batches, lambda batch: math.prod(batch["targets"].shape))


def paired(fns: dict, reps: int) -> dict:
    """Run each of ``fns`` (name -> () -> result dict) once a repetition, in an order rotated
    from one repetition to the next: ``{name: [results]}``."""
    out: dict = {k: [] for k in fns}
    keys = list(fns)
    for rep in range(reps):
        shift = rep % len(keys)
        for key in keys[shift:] + keys[:shift]:
            out[key].append(fns[key](rep))
    return out


def summary(runs: list) -> dict:
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "cpu_ns_per_token": statistics.median(r["cpu_ns_per_token"] for r in runs),
        "runs": runs,
    }


def compare(name: str, mine: list, theirs: list, key="tokens_per_s") -> dict:
    """The median of the paired ratios of ``key`` (ours over theirs; for a target ``<=``, a
    ratio of times: theirs over ours), against its target."""
    op, bound = TARGETS[name]
    if op == "<=":
        ratios = [b[key] / a[key] for a, b in zip(mine, theirs)]
    else:
        ratios = [a[key] / b[key] for a, b in zip(mine, theirs)]
    value = statistics.median(ratios)
    return {
        "ratio": value,
        "ratios": ratios,
        "target": f"{op} {bound:g}",
        "met": value >= bound if op == ">=" else value <= bound,
    }


# -- the rows ---------------------------------------------------------------------------------


def sampler_of(ts, workers: int, seed: int):
    from atlas_fast.token_sampler import TokenShuffleSampler

    return TokenShuffleSampler(ts, batch_size=BATCH, seed=seed, num_workers=workers)


def sampled_run(ts, workers: int, batches: int):
    """``rep -> run_loader(...)`` of ``ts`` in a ``TokenShuffleSampler`` epoch seeded ``rep``
    (what ``paired`` calls)."""
    return lambda rep: run_loader(ts, workers, batches, sampler=sampler_of(ts, workers, rep))


def keys_of(ts, workers: int, seed: int, batches: int) -> list:
    return list(itertools.islice(sampler_of(ts, workers, seed).batches(), batches))


def rows_section(paths: dict, args, results: dict) -> None:
    import atlas_fast

    lengths = np.load(paths["lengths"])
    blocks = zstd_blocks(paths["s1"])
    for workers in WORKERS:
        n = args.worker_batches if workers else args.batches
        for data, rival in (("s0", "memmap"), ("s1", "floor")):
            ts = atlas_fast.TokenSequences(str(paths[data]), SEQ_LEN)

            def base(rep, ts=ts, workers=workers, rival=rival, n=n):
                planned = keys_of(ts, workers, rep, n)
                flat = FlatTokens(paths["flat"], blocks if rival == "floor" else None)
                return run_loader(flat, workers, n, planned=planned)

            fns = {"atlas_fast": sampled_run(ts, workers, n), rival: base}
            if data == "s0":

                def hand(rep, ts=ts, workers=workers, n=n):
                    n = max(10, n // 4)  # slower: a quarter of the batches
                    planned = keys_of(ts, workers, rep, n)
                    return run_loader(ByHand(paths["s0"], lengths), workers, n, planned=planned)

                fns["by hand"] = hand
            got = paired(fns, args.reps)
            what = "uncompressed" if data == "s0" else "zstd"
            case = f"{what}, {workers} workers"
            row = {name: summary(runs) for name, runs in got.items()}
            row["compared"] = {
                name: compare(name, got["atlas_fast"], runs)
                for name, runs in got.items()
                if name != "atlas_fast"
            }
            if "by hand" in got:
                # What the physical limit itself reaches against reading by hand: no loader
                # gets a larger ratio over it than this, whatever its target.
                row["memmap_over_by_hand"] = statistics.median(
                    a["tokens_per_s"] / b["tokens_per_s"]
                    for a, b in zip(got["memmap"], got["by hand"])
                )
            results["rows"][case] = row
            show(case, row)


def show(case: str, row: dict) -> None:
    cells = "; ".join(
        f"{name} {r['tokens_per_s'] / 1e6:.1f}M tok/s {r['cpu_ns_per_token']:.2f} ns/tok"
        for name, r in row.items()
        if isinstance(r, dict) and "tokens_per_s" in r
    )
    ratios = "; ".join(
        f"x {name} {c['ratio']:.2f} (target {c['target']}: {'met' if c['met'] else 'MISSED'})"
        for name, c in row.get("compared", {}).items()
    )
    if "memmap_over_by_hand" in row:
        ratios += f"; (memmap x by hand {row['memmap_over_by_hand']:.2f})"
    print(f"{case:28s} {cells}\n{'':28s} {ratios}", flush=True)


# -- LitData ----------------------------------------------------------------------------------


def litdata_section(paths: dict, args, results: dict) -> None:
    import remote_peers

    python, version, reason = remote_peers.find_peer("litdata")
    if python is None:
        print(f"litdata rows skipped: {reason}", flush=True)
        results["litdata"] = {"available": False, "reason": reason}
        return
    out = paths["root"] / f"litdata-{version}"
    script = HERE / "_peer_litdata_tokens.py"
    env = remote_peers._env()
    if not (out / ".complete").exists():
        progress(f"writing LitData's optimize output into {out}")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [str(python), str(script), "write", "--tokens", str(paths["flat"]), "--lengths",
             str(paths["lengths"]), "--block", str(SEQ_LEN), "--out", str(out / "data")],
            env=env, check=True, timeout=3600,
        )  # fmt: skip
        (out / ".complete").write_text("ok\n")
    import atlas_fast

    compact = atlas_fast.TokenSequences(str(paths["s0"]), SEQ_LEN, compact=True)
    rows = atlas_fast.TokenSequences(str(paths["s0"]), SEQ_LEN)
    results["litdata"] = {"available": True, "version": version, "rows": {}}
    for workers in WORKERS:
        n = args.worker_batches if workers else args.batches

        def peer(rep, workers=workers, n=n):
            done = subprocess.run(
                [str(python), str(script), "read", "--input", str(out / "data"), "--workers",
                 str(workers), "--batches", str(n), "--seed", str(rep)],
                env=env, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(f"LitData read failed:\n{done.stderr[-2000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        got = paired(
            {
                "atlas_fast": sampled_run(compact, workers, n),
                "litdata": peer,
                "atlas_fast, int64 rows": sampled_run(rows, workers, n),
            },
            args.reps,
        )
        row = {name: summary(runs) for name, runs in got.items()}
        row["compared"] = {"litdata": compare("litdata", got["atlas_fast"], got["litdata"])}
        row["rows_over_litdata"] = compare(
            "litdata", got["atlas_fast, int64 rows"], got["litdata"]
        )["ratio"]
        case = f"litdata, {workers} workers"
        results["litdata"]["rows"][case] = row
        show(case, row)


# -- the index build ---------------------------------------------------------------------------


def index_section(paths: dict, args, results: dict) -> None:
    import atlas_fast
    import atlas_fast._python

    root = paths["ref"]
    backends = {"cython": atlas_fast.atlas.AtlasDataset, "python": atlas_fast._python.AtlasDataset}
    if atlas_fast.BACKEND != "cython":
        del backends["cython"]
    tokens = int(np.load(paths["lengths"]).sum())
    cache = Path(tempfile.mkdtemp(prefix="bench-tokens-cache-"))
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    results["index"] = {}
    try:
        for name, cls in backends.items():

            def build_once(cls=cls):
                (root / "tokens.idx").unlink(missing_ok=True)
                ds = cls(str(root))
                atlas_fast.TokenSequences(ds, SEQ_LEN, index="rebuild", progress=False)
                ds.close()
                (root / "tokens.idx").unlink(missing_ok=True)

            def plain_once(cls=cls):
                ds = cls(str(root))
                for _ in ds:
                    pass
                ds.close()

            # Untimed once each (first-use costs), then as many passes a measurement as make
            # it last about MIN_SECONDS: a pass over the quick corpus takes milliseconds.
            build_once()
            t0 = time.perf_counter()
            plain_once()
            inner = max(1, math.ceil(MIN_SECONDS / max(time.perf_counter() - t0, 1e-3)))

            def timed(once, inner=inner):
                gc.collect()
                c0, t0 = cpu_seconds(), time.perf_counter()
                for _ in range(inner):
                    once()
                seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                done = tokens * inner
                return {"tokens_per_s": done / seconds, "cpu_ns_per_token": cpu * 1e9 / done}

            def build(rep, build_once=build_once):
                return timed(build_once)

            def plain(rep, plain_once=plain_once):
                return timed(plain_once)

            got = paired({"index build": build, "plain pass": plain}, args.reps)
            row = {k: summary(v) for k, v in got.items()}
            row["compared"] = {
                "index build": compare("index build", got["index build"], got["plain pass"])
            }
            row["passes_per_measurement"] = inner
            case = f"index build, atlas_fast[{name}]"
            results["index"][case] = row
            show(case, row)
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
        shutil.rmtree(cache, ignore_errors=True)


# -- what opening reads ------------------------------------------------------------------------

_OPEN = """
import sys
import atlas_fast
root = sys.argv[1]
if sys.argv[2] == "hook":
    seen = []
    sys.addaudithook(lambda event, a: event == "open" and seen.append(str(a[0])))
ts = atlas_fast.TokenSequences(root, 2048)
assert len(ts) > 0
if sys.argv[2] == "hook":
    print("\\n".join(p for p in seen if isinstance(p, str)))
"""


def opened_files(root: Path) -> tuple:
    """``(how, files of the dataset opened, directories listed)`` by opening its token
    sequences in a fresh process (strace when installed, else an audit hook)."""
    root = root.resolve()
    strace = shutil.which("strace")
    path = [str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    if strace:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "strace.log"
            subprocess.run(
                [strace, "-f", "-qq", "-e", "trace=open,openat", "-o", str(log),
                 sys.executable, "-c", _OPEN, str(root), "strace"],
                env=env, check=True, timeout=600,
            )  # fmt: skip
            lines = log.read_text().splitlines()
        files, dirs = set(), set()
        for line in lines:
            if '"' not in line or "= -1" in line:
                continue
            path = line.split('"')[1]
            if not path.startswith(str(root)):
                continue
            (dirs if "O_DIRECTORY" in line else files).add(os.path.relpath(path, root))
        return "strace", sorted(files), sorted(dirs)
    done = subprocess.run(
        [sys.executable, "-c", _OPEN, str(root), "hook"],
        env=env, check=True, timeout=600, capture_output=True, text=True,
    )  # fmt: skip
    files = {os.path.relpath(p, root) for p in done.stdout.splitlines() if p.startswith(str(root))}
    return "audit hook", sorted(files), []


def open_section(paths: dict, results: dict) -> None:
    root = paths["s1"]
    how, files, dirs = opened_files(root)
    allowed = {"meta.json", "tokens.idx"}
    sizes = {f: (root / f).stat().st_size for f in files if (root / f).is_file()}
    results["open"] = {
        "how": how,
        "files": files,
        "directories": dirs,
        "bytes": sizes,
        "met": set(files) <= allowed,
    }
    print(f"open: {how}: files {files} ({sum(sizes.values())} bytes), directories {dirs}")
    if not set(files) <= allowed:
        raise SystemExit(f"opening read more than meta.json and tokens.idx: {files}")


# -- the run ----------------------------------------------------------------------------------


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one copy of the corpus, 3 reps")
    parser.add_argument("--reps", type=int, help="repetitions (default 5; --quick 3)")
    parser.add_argument("--batches", type=int, help="batches a run reads (default 200)")
    parser.add_argument(
        "--worker-batches",
        type=int,
        help="batches a run with workers reads (default 600: their start-up not to dominate)",
    )
    parser.add_argument(
        "--documents", type=int, help="only the corpus's first N documents (the tests' runs)"
    )
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    parser.add_argument("--cache-dir", type=Path, help="where the corpus is written once")
    parser.add_argument(
        "--sections",
        default="open,rows,litdata,index",
        help="which sections to run, separated by ',' (default: all)",
    )
    args = parser.parse_args(argv)
    args.reps = args.reps or (3 if args.quick else 5)
    args.batches = args.batches or (60 if args.quick else 200)
    args.worker_batches = args.worker_batches or (60 if args.quick else 600)
    import atlas_fast
    from atlas_fast.bench import corpus
    from atlas_fast.bench.system import describe, load_average

    cache = args.cache_dir or corpus.default_cache_dir()
    paths = build(Path(cache), 1 if args.quick else 5, args.documents)
    shown = sys.argv[1:] if argv is None else list(argv)
    started = time.time()
    results = {
        "schema": "bench_tokens/1",
        "title": "Token sequences: TokenSequences + TokenShuffleSampler",
        "command": " ".join(["python", "benchmarks/bench_tokens.py", *shown]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": {**describe(), "load_average_before": load_average()},
        "atlas_fast": {"version": atlas_fast.__version__, "backend": atlas_fast.BACKEND},
        "settings": {
            "seq_len": SEQ_LEN,
            "batch_size": BATCH,
            "block_size": BLOCK,
            "reps": args.reps,
            "batches": args.batches,
            "worker_batches": args.worker_batches,
            "by_hand_batches": "a quarter of the others",
            "tokens": int(np.load(paths["lengths"]).sum()),
            "documents": len(np.load(paths["lengths"])),
        },
        "rows": {},
    }
    print(f"# {results['title']}; {results['date']}; load average {load_average()}", flush=True)
    sections = {s.strip() for s in args.sections.split(",")}
    if "open" in sections:
        open_section(paths, results)
    if "rows" in sections:
        rows_section(paths, args, results)
    if "litdata" in sections:
        litdata_section(paths, args, results)
    if "index" in sections:
        index_section(paths, args, results)
    results["machine"]["load_average_after"] = load_average()
    results["duration_seconds"] = round(time.time() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
