"""The readers the benchmark times, each behind one small adapter.

An adapter knows how to open its data for a *target* (a dict naming the corpus, the Atlas
dataset or peer copy, and the floor files) and how to read it in each access pattern. Peers
are imported only inside their own worker process (see ``_worker``), so a missing or broken
peer is reported as skipped and never touches the others.

Adapter interface::

    name, kind ("atlas" | "peer" | "floor"), corpora (which corpora it reads)
    load() -> version string        # imports; raises Skip(reason) if unavailable
    prepare(target) -> dict          # builds the peer's copy of the corpus if needed
    open(target) -> handle           # what "open time" measures, with the first read
    length(handle), get(handle, i)
    get_batch(handle, indices) -> (examples, how)
    sequential(handle) -> (iterator, how)
    shuffled(handle, seed) -> (iterator, how)
    close(handle)
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import json
import mmap
import os
import pickle
import shutil
import sys
import types
from pathlib import Path

from .._format import DICT_FILE

__all__ = ["READERS", "Skip", "make_reader"]


class Skip(Exception):
    """The reader cannot run here (not installed, or it failed to import): the reason."""


def _loop_batch(reader, handle, indices):
    get = reader.getter(handle)
    return [get(i) for i in indices]


def _getitems_or_loop(reader, handle, indices):
    """The batch through the peer's ``__getitems__`` where it has one, else a loop of ``ds[i]``."""
    getitems = getattr(handle, "__getitems__", None)
    if getitems is not None:
        return getitems(indices), "__getitems__"
    return _loop_batch(reader, handle, indices), "loop of ds[i] (no __getitems__)"


def _require(module: str, package: str | None = None) -> None:
    """Skip unless ``module`` (of the pip package ``package``, if named otherwise) is installed."""
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{package or module} is not installed (pip install 'atlas-fast[bench]')")


def _import(module: str, package: str | None = None):
    """A peer's ``module``, imported; Skip saying why when it is not installed or fails to."""
    _require(module, package)
    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise Skip(f"import {module} failed: {type(exc).__name__}: {exc}") from exc


def _permutation(n: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).permutation(n)


class _Base:
    kind = "peer"
    corpora: tuple = ("documents",)
    label = ""
    version = ""

    store = None  # a peer's folder under the target's peer_dir (None: its name)

    def prepare(self, target) -> dict:
        return {}

    def _dir(self, target) -> Path:
        return Path(target["peer_dir"]) / (self.store or self.name)

    def length(self, h) -> int:
        return len(h)

    def getter(self, h):
        """``f(i)`` returning example ``i``: the reader's own ``ds[i]`` where it has one."""
        return h.__getitem__

    def get(self, h, i):
        return self.getter(h)(int(i))

    def get_batch(self, h, indices):
        return _loop_batch(self, h, indices), "loop of ds[i]"

    def sequential(self, h):
        get = self.getter(h)
        return (get(i) for i in range(self.length(h))), "ds[i] in order"

    def shuffled(self, h, seed):
        get = self.getter(h)
        order = _permutation(self.length(h), seed).tolist()
        return (get(i) for i in order), "uniform permutation, ds[i]"

    def close(self, h) -> None:
        close = getattr(h, "close", None)
        if close is not None:
            close()


# -- atlas_fast ---------------------------------------------------------------------------------


class AtlasReader(_Base):
    """atlas_fast's AtlasDataset over one backend module."""

    kind = "atlas"
    corpora = ("documents", "tokens", "blobs", "rows")

    def __init__(self, name: str, module: str) -> None:
        self.name = name
        self.module_name = module

    def load(self) -> str:
        import atlas_fast

        self.module = importlib.import_module(self.module_name)
        if self.name == "atlas_fast" and atlas_fast.BACKEND == "python":
            from atlas_fast import _backend

            why = _backend.extension_error or "ATLAS_FAST_NO_EXTENSIONS is set"
            raise Skip(
                "the default backend is the pure-Python one, measured as atlas_fast[python]; "
                f"compiled reader unavailable: {why}"
            )
        backend = "python" if self.module_name == "atlas_fast._python" else atlas_fast.BACKEND
        self.label = f"atlas_fast[{backend}]"
        return atlas_fast.__version__

    def open(self, target):
        # A block cache of a fraction of the corpus (``cache_bytes`` of the target): random
        # reads then decode blocks, as on a dataset larger than its cache, instead of timing
        # hits of a corpus the default 32 MiB holds whole.
        return self.module.AtlasDataset(target["path"], cache_bytes=target.get("cache_bytes"))

    def get_batch(self, h, indices):
        return _getitems_or_loop(self, h, indices)

    def shuffled(self, h, seed):
        import atlas_fast

        sampler_class = getattr(atlas_fast, "BlockShuffleSampler", None)
        if sampler_class is not None:
            sampler = _make_sampler(sampler_class, h, seed)
            if sampler is not None:
                # Default settings, as a new user writes it: BlockShuffleSampler(ds) over
                # AtlasDataset(path), no window or cache chosen by hand.
                return _read_in_order(h, sampler), (
                    "atlas_fast.BlockShuffleSampler(ds), default settings"
                )
        order = block_permutation(h, seed)
        return _read_in_order(h, order), (
            "block permutation computed by the benchmark (no atlas_fast.BlockShuffleSampler)"
        )


def _read_in_order(ds, order):
    for i in order:
        yield ds[i]


def _make_sampler(sampler_class, dataset, seed):
    for kwargs in ({"seed": seed}, {}):
        try:
            sampler = sampler_class(dataset, **kwargs)
        except TypeError:
            continue
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(0)
        return sampler
    return None


def block_permutation(ds, seed: int) -> list:
    """Blocks in random order, examples shuffled within each block: every block decoded once."""
    import numpy as np

    rng = np.random.default_rng(seed)
    blocks = []
    start = 0
    for shard in ds.shards:
        size = len(shard)
        bs = shard.metadata.block_size
        blocks.extend((start + b, min(start + b + bs, start + size)) for b in range(0, size, bs))
        start += size
    order = []
    for k in rng.permutation(len(blocks)):
        lo, hi = blocks[k]
        order.extend((lo + rng.permutation(hi - lo)).tolist())
    return order


# -- the reference ------------------------------------------------------------------------------


class ReferenceReader(_Base):
    """The real ``torch_atlas_ds`` package (when importable): the column every "xref" divides by."""

    kind = "reference"
    corpora = ("documents", "tokens", "blobs", "rows")
    name = "torch_atlas_ds"

    def load(self) -> str:
        from . import reference

        module, why = reference.load()
        if module is None:
            raise Skip(why)
        self.module = module
        info = reference.describe(module)
        self.label = info["label"]
        self._file = info["file"]
        return info["version"]

    def notes(self) -> dict:
        return {"imported from": self._file}

    def open(self, target):
        return self.module.AtlasDataset(target["path"])

    def get_batch(self, h, indices):
        return _loop_batch(self, h, indices), "loop of ds[i] (no __getitems__)"

    def shuffled(self, h, seed):
        get = self.getter(h)
        order = _permutation(self.length(h), seed).tolist()
        return (get(i) for i in order), "uniform permutation, ds[i] (as DataLoader(shuffle=True))"

    def close(self, h) -> None:
        pass  # it has no close(): its files close when the object is collected


# -- floors: no format at all -------------------------------------------------------------------


class PickleFloor(_Base):
    """``pickle.loads`` of one example's bytes, sliced from an mmap of all of them."""

    kind = "floor"
    corpora = ("documents", "tokens", "blobs", "rows")
    name = "pickle-floor"
    label = "baseline: pickle.loads per example"

    def load(self) -> str:
        return f"pickle protocol {pickle.HIGHEST_PROTOCOL}"

    def open(self, target):
        import numpy as np

        offsets = np.load(target["floor_offsets"]).tolist()
        with open(target["floor"], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        return (mm, memoryview(mm), offsets)

    def length(self, h) -> int:
        return len(h[2]) - 1

    def getter(self, h):
        _, view, offsets = h
        loads = pickle.loads

        def get(i):
            return loads(view[offsets[i] : offsets[i + 1]])

        return get

    def close(self, h) -> None:
        mm, view, _ = h
        view.release()
        if isinstance(mm, mmap.mmap):
            mm.close()


class ZstdFloor(_Base):
    """python-zstandard decompression of an Atlas dataset's blocks, with no unpickling."""

    kind = "floor"
    corpora = ("documents", "tokens", "blobs", "rows")
    name = "zstd-floor"
    label = "baseline: zstd decompress only"
    patterns = ("sequential", "random")

    def load(self) -> str:
        import zstandard

        self.zstd = zstandard
        return zstandard.__version__

    def open(self, target):
        import numpy as np

        root = Path(target["path"])
        meta = json.loads((root / "meta.json").read_text())
        if meta["compression_strategy"] == 0:
            raise Skip("the dataset is stored uncompressed (strategy 0)")
        shared = root / DICT_FILE
        blocks = []  # (mmap view, start, end, examples in block)
        keep = []
        for shard in sorted(p for p in root.iterdir() if p.is_dir()):
            smeta = json.loads((shard / "meta.json").read_text())
            n = smeta["stored_examples"]
            if not n:
                continue
            zdict = None
            if smeta["compression_strategy"] == 3:
                zdict = (shard / DICT_FILE).read_bytes()
            elif smeta["compression_strategy"] == 2:
                zdict = shared.read_bytes()
            if zdict is None:
                dctx = self.zstd.ZstdDecompressor()
            else:
                dctx = self.zstd.ZstdDecompressor(dict_data=self.zstd.ZstdCompressionDict(zdict))
            offsets = np.load(shard / "index.npy").astype(np.int64).tolist()
            with open(shard / "data.bin", "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            keep.append(mm)
            bs = smeta["block_size"]
            for b in range(len(offsets) - 1):
                count = min(bs, n - b * bs)
                blocks.append((dctx, mm, offsets[b], offsets[b + 1], count))
        return {"blocks": blocks, "mmaps": keep}

    def length(self, h) -> int:
        return sum(b[4] for b in h["blocks"])

    def decode_block(self, block) -> int:
        dctx, mm, start, end, _ = block
        return len(dctx.decompress(mm[start:end]))

    def close(self, h) -> None:
        for mm in h["mmaps"]:
            mm.close()


# -- peers --------------------------------------------------------------------------------------


def _floor_examples(target):
    """The corpus's examples, exactly as the Atlas datasets hold them (from the floor file)."""
    import numpy as np

    offsets = np.load(target["floor_offsets"]).tolist()
    with open(target["floor"], "rb") as f:
        data = f.read()
    view = memoryview(data)
    for a, b in itertools.pairwise(offsets):
        yield pickle.loads(view[a:b])


def _build_once(directory: Path, build) -> dict:
    """Run ``build(tmp_dir)`` unless ``directory`` is complete; rename into place at the end."""
    marker = directory / ".complete"
    if marker.exists():
        return json.loads(marker.read_text())
    shutil.rmtree(directory, ignore_errors=True)
    tmp = directory.with_name("." + directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    info = build(tmp) or {}
    info["disk_bytes"] = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    tmp.rename(directory)
    (directory / ".complete").write_text(json.dumps(info))
    return info


def _install_torchvision_placeholder() -> str | None:
    """``import streaming`` imports torchvision, whose PyPI build can fail to load beside a
    local CPU torch ("operator torchvision::nms does not exist"). The text path never uses
    it: in this worker process only, a failing torchvision is replaced by an inert module."""
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401

            return None
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            for name in list(sys.modules):
                if name == "torchvision" or name.startswith("torchvision."):
                    del sys.modules[name]
    else:
        reason = "not installed"

    class VisionDataset:  # what streaming.vision subclasses; never instantiated here
        def __init__(self, *args, **kwargs):
            raise RuntimeError("torchvision placeholder (atlas_fast bench): not usable")

    def unusable(*args, **kwargs):
        raise RuntimeError("torchvision placeholder (atlas_fast bench): not usable")

    from importlib.machinery import ModuleSpec

    mods = {}
    for name in (
        "torchvision",
        "torchvision.datasets",
        "torchvision.transforms",
        "torchvision.transforms.functional",
    ):
        mods[name] = types.ModuleType(name)
        mods[name].__spec__ = ModuleSpec(name, None, is_package=True)
        mods[name].__version__ = "0+atlas_fast.bench.placeholder"
    mods["torchvision"].datasets = mods["torchvision.datasets"]
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]
    mods["torchvision.datasets"].VisionDataset = VisionDataset
    mods["torchvision.datasets"].CIFAR10 = VisionDataset
    mods["torchvision.transforms.functional"].to_tensor = unusable
    sys.modules.update(mods)
    return reason


def _streaming_lock_files() -> set:
    import glob
    import tempfile

    tmp = tempfile.gettempdir()
    return {
        p
        for pattern in ("*_barrier_filelock", "*_cache_filelock")
        for p in glob.glob(os.path.join(tmp, pattern))
    }


def _clean_streaming_leftovers(keep=frozenset()) -> None:
    """MDS StreamingDataset leaves shared-memory segments and lock files in the temporary
    directory: remove the segments, and the lock files that were not there before us."""
    try:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:
        pass
    for path in _streaming_lock_files() - set(keep):
        try:
            os.unlink(path)
        except OSError:
            pass


MDS_COLUMNS = {"id": "str", "text": "str", "source": "str", "added": "str", "metadata": "json"}


class MDSReader(_Base):
    """MosaicML Streaming: MDS shards read locally (LocalDataset; StreamingDataset to shuffle)."""

    name = "mds"

    def load(self) -> str:
        _require("streaming", "mosaicml-streaming")
        self.placeholder = _install_torchvision_placeholder()
        self.streaming = streaming = _import("streaming", "mosaicml-streaming")
        self._locks_before = _streaming_lock_files()
        import atexit

        atexit.register(_clean_streaming_leftovers, self._locks_before)
        version = getattr(streaming, "__version__", "?")
        self.label = f"MDS (mosaicml-streaming {version})"
        return version

    def notes(self) -> dict:
        if self.placeholder:
            return {"torchvision": f"placeholder module in the worker ({self.placeholder})"}
        return {}

    def prepare(self, target) -> dict:
        def build(tmp: Path):
            with self.streaming.MDSWriter(
                out=str(tmp), columns=MDS_COLUMNS, compression=None, size_limit=1 << 26
            ) as writer:
                for doc in _floor_examples(target):
                    writer.write(doc)
            return {"compression": None}

        return _build_once(self._dir(target), build)

    def open(self, target):
        self.local = str(self._dir(target))
        return self.streaming.LocalDataset(local=self.local)

    def get_batch(self, h, indices):
        return _loop_batch(self, h, indices), "loop of ds[i] (LocalDataset has no __getitems__)"

    def shuffled(self, h, seed):
        _clean_streaming_leftovers(self._locks_before)
        ds = self.streaming.StreamingDataset(
            local=self.local, shuffle=True, shuffle_seed=seed, batch_size=256
        )
        self._streaming_ds = ds
        return iter(ds), "StreamingDataset(shuffle=True, py1e default), its iterator"

    def close(self, h) -> None:
        ds = getattr(self, "_streaming_ds", None)
        if ds is not None:
            self._streaming_ds = None
            del ds
            _clean_streaming_leftovers(self._locks_before)


def _litdata_item(floor, offsets_path, i):
    import numpy as np

    offsets = _litdata_item.cache.get(offsets_path)
    if offsets is None:
        offsets = _litdata_item.cache[offsets_path] = np.load(offsets_path).tolist()
    with open(floor, "rb") as f:
        f.seek(offsets[i])
        return pickle.loads(f.read(offsets[i + 1] - offsets[i]))


_litdata_item.cache = {}


class LitDataReader(_Base):
    """LitData: ``optimize`` (one worker, order kept) then ``StreamingDataset`` from disk."""

    def __init__(self, compression: str | None) -> None:
        self.compression = compression
        self.name = "litdata" if compression is None else f"litdata-{compression}"

    def load(self) -> str:
        litdata = _import("litdata")
        self.litdata = litdata
        version = getattr(litdata, "__version__", "?")
        self.label = f"LitData {version} " + ("raw" if self.compression is None else "zstd")
        return version

    def prepare(self, target) -> dict:
        def build(tmp: Path):
            n = target["examples"]
            fn = functools.partial(_litdata_item, target["floor"], target["floor_offsets"])
            self.litdata.optimize(
                fn=fn,
                inputs=list(range(n)),
                output_dir=str(tmp),
                chunk_bytes="64MB",
                compression=self.compression,
                num_workers=1,
                keep_data_ordered=True,
                reorder_files=False,
                verbose=False,
                start_method="fork",
            )
            return {"compression": self.compression}

        return _build_once(self._dir(target), build)

    def open(self, target):
        self._path = str(self._dir(target))
        return self.litdata.StreamingDataset(self._path)

    def get_batch(self, h, indices):
        return _getitems_or_loop(self, h, list(indices))

    def shuffled(self, h, seed):
        ds = self.litdata.StreamingDataset(self._path, shuffle=True, seed=seed)
        return iter(ds), "StreamingDataset(shuffle=True), its iterator"


class HFReader(_Base):
    """Hugging Face datasets: Arrow files on disk (save_to_disk / load_from_disk)."""

    name = "hf"

    def load(self) -> str:
        datasets = _import("datasets")
        datasets.disable_progress_bars()
        self.datasets = datasets
        self.label = f"HF datasets {datasets.__version__} (Arrow)"
        return datasets.__version__

    def prepare(self, target) -> dict:
        def build(tmp: Path):
            ds = self.datasets.Dataset.from_list(list(_floor_examples(target)))
            ds.save_to_disk(str(tmp))
            return {}

        return _build_once(self._dir(target), build)

    def open(self, target):
        return self.datasets.load_from_disk(str(self._dir(target)))

    def close(self, h) -> None:
        pass

    def get_batch(self, h, indices):
        return h.__getitems__(list(indices)), "__getitems__"

    def sequential(self, h):
        return iter(h), "its iterator"

    def shuffled(self, h, seed):
        return iter(h.shuffle(seed=seed)), "ds.shuffle(seed) (indices mapping), its iterator"


class ZarrFlatTokens(_Base):
    """The flat-tokens layout in zarr: encoded_tokens (uint32) and seq_starts (uint64)."""

    name = "zarr"
    store = "flat-tokens.zarr"
    corpora = ("tokens",)
    CHUNK = 1 << 16  # tokens per zarr chunk: 32 examples, 256 KB uncompressed

    def load(self) -> str:
        zarr = _import("zarr")
        self.zarr = zarr
        self.label = f"flat-tokens (zarr {zarr.__version__})"
        return zarr.__version__

    def prepare(self, target) -> dict:
        import numpy as np

        def build(tmp: Path):
            seqs = list(_floor_examples(target))
            lengths = np.array([len(s) for s in seqs], dtype=np.uint64)
            starts = np.zeros(len(seqs) + 1, dtype=np.uint64)
            np.cumsum(lengths, out=starts[1:])
            flat = np.concatenate(seqs).astype(np.uint32) * 2 if seqs else np.zeros(0, np.uint32)
            flat[starts[:-1][lengths > 0].astype(np.int64)] += 1
            group = self.zarr.open_group(str(tmp), mode="w")
            tokens = group.create_array(
                "encoded_tokens",
                shape=flat.shape,
                dtype=np.uint32,
                chunks=(min(self.CHUNK, max(len(flat), 1)),),
            )
            tokens[:] = flat
            index = group.create_array("seq_starts", shape=starts.shape, dtype=np.uint64)
            index[:] = starts
            group.attrs["max_token_id"] = int(flat.max() >> 1) if len(flat) else 0
            return {"chunk_tokens": self.CHUNK}

        return _build_once(self._dir(target), build)

    def open(self, target):
        group = self.zarr.open_group(str(self._dir(target)), mode="r")
        starts = group["seq_starts"][:].astype("int64").tolist()
        return (group["encoded_tokens"], starts)

    def length(self, h) -> int:
        return len(h[1]) - 1

    def getter(self, h):
        import numpy as np

        tokens, starts = h
        uint16 = np.uint16

        def get(i):
            return (tokens[starts[i] : starts[i + 1]] >> 1).astype(uint16)

        return get

    def close(self, h) -> None:
        pass


READERS = {
    "torch_atlas_ds": ReferenceReader,
    "atlas_fast": lambda: AtlasReader("atlas_fast", "atlas_fast.atlas"),
    "atlas_fast-python": lambda: AtlasReader("atlas_fast-python", "atlas_fast._python"),
    "pickle-floor": PickleFloor,
    "zstd-floor": ZstdFloor,
    "mds": MDSReader,
    "litdata": lambda: LitDataReader(None),
    "litdata-zstd": lambda: LitDataReader("zstd"),
    "hf": HFReader,
    "zarr": ZarrFlatTokens,
}
# Which corpora each reader reads (known without importing anything).
_ALL = ("documents", "tokens", "blobs", "rows")
READER_CORPORA = {
    "torch_atlas_ds": _ALL,
    "atlas_fast": _ALL,
    "atlas_fast-python": _ALL,
    "pickle-floor": _ALL,
    "zstd-floor": _ALL,
    "mds": ("documents",),
    "litdata": ("documents",),
    "litdata-zstd": ("documents",),
    "hf": ("documents",),
    "zarr": ("tokens",),
}
READER_KIND = {
    "torch_atlas_ds": "reference",
    "atlas_fast": "atlas",
    "atlas_fast-python": "atlas",
    "pickle-floor": "floor",
    "zstd-floor": "floor",
    "mds": "peer",
    "litdata": "peer",
    "litdata-zstd": "peer",
    "hf": "peer",
    "zarr": "peer",
}
# Readers that read one Atlas dataset per configuration (the others read the corpus once).
PER_CONFIG = ("torch_atlas_ds", "atlas_fast", "atlas_fast-python", "zstd-floor")
# The reader every "xref" ratio divides by: the real reference package, never our own code.
REFERENCE = "torch_atlas_ds"


def make_reader(name: str):
    return READERS[name]()
