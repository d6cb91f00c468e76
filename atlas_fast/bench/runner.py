"""Runs the benchmark: one worker process per reader, jobs alternated across repetitions.

A *job* is one reader on one dataset (an Atlas configuration, or a peer's copy of a corpus).
Every repetition runs every job once, all access patterns in a row, in an order rotated from
one repetition to the next, so slow drifts of the machine (other processes, thermal) spread
over all readers instead of landing on one. Figures are medians over the repetitions, and
every ratio is computed from figures of this same run.
"""

from __future__ import annotations

import json
import os
import select
import site
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

from . import corpus as corpus_mod
from .measure import PATTERNS
from .readers import PER_CONFIG, READER_CORPORA, READER_KIND, REFERENCE

__all__ = ["Options", "run_benchmark", "compute_ratios"]

ALL_READERS = tuple(READER_KIND)
# Readers sharing a process: siblings of one package (one import instead of two).
PROCESS_GROUPS = {
    "torch_atlas_ds": ("torch_atlas_ds",),
    "atlas_fast": ("atlas_fast",),
    "atlas_fast-python": ("atlas_fast-python",),
    "floors": ("pickle-floor", "zstd-floor"),
    "mds": ("mds",),
    "litdata": ("litdata", "litdata-zstd"),
    "hf": ("hf",),
    "zarr": ("zarr",),
}
ZSTD_FLOOR_PATTERNS = ("sequential", "random")


class Options:
    """What to run; the command line fills it in (defaults: the full run)."""

    def __init__(self, **kw) -> None:
        cache_dir = kw.pop("cache_dir", None) or corpus_mod.default_cache_dir()
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.scale = kw.pop("scale", None) or corpus_mod.Scale.full()
        self.configs = kw.pop("configs", None) or corpus_mod.parse_configs("all")
        self.corpora = tuple(kw.pop("corpora", None) or corpus_mod.DEFAULT_CORPORA)
        self.readers = tuple(kw.pop("readers", None) or ALL_READERS)
        self.patterns = tuple(kw.pop("patterns", None) or PATTERNS)
        self.reps = kw.pop("reps", 5)
        self.budget = kw.pop("budget", 0.15)
        self.reference_config = kw.pop("reference_config", "s2b100")
        self.progress = kw.pop("progress", True)
        self.rebuild = kw.pop("rebuild", False)
        self.command = kw.pop("command", None)
        self.quick = kw.pop("quick", False)
        if kw:
            raise TypeError(f"unknown options: {sorted(kw)}")


# -- workers ------------------------------------------------------------------------------------


_PACKAGE_DIR = os.path.realpath(Path(__file__).resolve().parents[1])


class WorkerError(RuntimeError):
    pass


# Floor and peer workers never use atlas_fast's readers: they load atlas_fast.bench without
# running atlas_fast/__init__.py, which would import torch (the readers subclass its Dataset),
# seconds per process on a busy machine.
_LAUNCHER = """
import sys, types
pkg = types.ModuleType("atlas_fast")
pkg.__path__ = [sys.argv[1]]
sys.modules["atlas_fast"] = pkg
from atlas_fast.bench._worker import main
sys.exit(main(sys.argv[2:]))
"""


class Worker:
    """A reader's process, spoken to in JSON lines."""

    def __init__(self, name: str, readers, log_path: Path, env: dict) -> None:
        self.name = name
        self.readers = list(readers)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        if any(READER_KIND[r] == "atlas" for r in self.readers):
            argv = ["-m", "atlas_fast.bench._worker", *self.readers]
        else:
            argv = ["-c", _LAUNCHER, str(Path(__file__).resolve().parents[1]), *self.readers]
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            # Not the caller's directory: "-m"/"-c" put the working directory first on
            # sys.path, where a source tree would shadow the atlas_fast the caller imported.
            cwd=log_path.parent,
        )
        self._buf = b""

    def send(self, obj) -> None:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"{self.name}: worker gone ({exc}); {self.log_tail()}") from exc

    def receive(self, timeout: float):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{self.name}: no answer within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerError(f"{self.name}: worker exited; {self.log_tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, obj, timeout: float):
        self.send(obj)
        return self.receive(timeout)

    def log_tail(self, lines: int = 5) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "log: " + " | ".join(text[-lines:]) if text else "log empty"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (WorkerError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _worker_env() -> dict:
    env = dict(os.environ)
    # Workers must import this same atlas_fast, also when it runs from a source tree.
    pkg_parent = str(Path(__file__).resolve().parents[2])
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    site_dirs = {str(Path(p).resolve()) for p in site_dirs}
    if pkg_parent not in site_dirs:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + old if old else "")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


# -- the run ------------------------------------------------------------------------------------


class Job:
    def __init__(self, reader, corpus, config, target, patterns) -> None:
        self.reader = reader
        self.corpus = corpus
        self.config = config
        self.target = target
        self.patterns = patterns
        self.reps: list = []
        self.info: dict = {}
        self.error = None

    @property
    def key(self):
        return (self.reader, self.corpus, self.config)


def _checks(entry, corpus: str, n: int) -> list:
    """A few (index, fingerprint) pairs every reader must return, read from the floor file."""
    import pickle

    import numpy as np

    if n == 0:
        return []
    picks = sorted({0, n // 3, n // 2, n - 1})
    offsets = np.load(entry["floor_offsets"]).tolist()
    out = []
    with open(entry["floor"], "rb") as f:
        for i in picks:
            f.seek(offsets[i])
            example = pickle.loads(f.read(offsets[i + 1] - offsets[i]))
            out.append([i, corpus_mod.fingerprint(corpus, example)])
    return out


# atlas_fast's readers get a block cache of this fraction of a corpus's pickled size (at
# most the default): a corpus that the default 32 MiB would hold whole would otherwise time
# cache hits under "random" (a reader always keeps its last block, as the reference does).
ATLAS_CACHE_FRACTION = 8


def atlas_cache_bytes(payload_bytes: int) -> int:
    """The ``cache_bytes`` atlas_fast's readers are opened with on a corpus of that size."""
    from .._contract import DEFAULT_CACHE_BYTES

    return max(1, min(DEFAULT_CACHE_BYTES, payload_bytes // ATLAS_CACHE_FRACTION))


def _plan(opts: Options, manifest: dict, peer_root: Path) -> list:
    jobs = []
    for corpus in opts.corpora:
        entry = manifest["corpora"][corpus]
        base = {
            "corpus": corpus,
            "examples": entry["examples"],
            "floor": entry["floor"],
            "floor_offsets": entry["floor_offsets"],
            "peer_dir": str(peer_root / corpus),
            "first_shard": corpus_mod.shard_size(entry["examples"]),
            "cache_bytes": atlas_cache_bytes(entry["payload_bytes"]),
        }
        for reader in opts.readers:
            if corpus not in READER_CORPORA[reader]:
                continue
            if reader in PER_CONFIG:
                for strategy, block in opts.configs:
                    config = f"s{strategy}b{block}"
                    ds = entry["datasets"][config]
                    patterns = opts.patterns
                    if reader == "zstd-floor":
                        if ds["stored_strategy"] == 0:
                            continue
                        patterns = tuple(p for p in patterns if p in ZSTD_FLOOR_PATTERNS)
                    if patterns:
                        jobs.append(
                            Job(reader, corpus, config, dict(base, path=ds["path"]), patterns)
                        )
            else:
                jobs.append(Job(reader, corpus, None, dict(base), opts.patterns))
    return jobs


class _Status:
    """One status line on stderr: redrawn in place on a terminal, else a line now and then."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._last = 0.0

    def __call__(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            sys.stderr.write(f"\r{text[:110]:<110}")
        elif force or now - self._last >= 10:
            sys.stderr.write(text + "\n")
        else:
            return
        self._last = now
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + " " * 110 + "\r")
            sys.stderr.flush()


def run_benchmark(opts: Options) -> dict:
    """Build (or reuse) the corpus, run every job ``opts.reps`` times; returns the report."""
    from . import system

    started = time.time()
    status = _Status(opts.progress)
    phases = {}
    t_phase = time.perf_counter()
    load_before = system.load_average()
    manifest = corpus_mod.build(
        opts.cache_dir,
        opts.scale,
        opts.configs,
        opts.corpora,
        progress=opts.progress,
        rebuild=opts.rebuild,
    )
    phases["corpus"] = time.perf_counter() - t_phase
    t_phase = time.perf_counter()
    root = Path(opts.cache_dir) / opts.scale.key()
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    jobs = _plan(opts, manifest, root / "peers")
    readers = {
        name: {
            "kind": READER_KIND[name],
            "status": "skipped",
            "reason": "not selected (--readers)",
            "corpora": list(READER_CORPORA[name]),
        }
        for name in ALL_READERS
    }
    needed = sorted({j.reader for j in jobs}, key=ALL_READERS.index)
    for name in ALL_READERS:
        if name in opts.readers and name not in needed:
            readers[name]["reason"] = "reads none of the selected corpora"

    env = _worker_env()
    processes = {}
    workers = {}  # reader name -> its Worker
    try:
        status(f"starting the reader processes for {', '.join(needed)} ...", force=True)
        for group, members in PROCESS_GROUPS.items():
            members = [m for m in members if m in needed]
            if members:
                processes[group] = Worker(group, members, logs / f"{group}.log", env)
        for w in processes.values():
            try:
                hello = w.receive(900)["readers"]
            except WorkerError as exc:
                hello = {name: {"skip": f"failed to start: {exc}"} for name in w.readers}
            for name in w.readers:
                h = hello.get(name) or {"skip": "no answer from its worker"}
                if "skip" not in h and h.get("package_dir") != _PACKAGE_DIR:
                    h = {
                        "skip": f"its worker imported atlas_fast from {h.get('package_dir')}, "
                        f"not {_PACKAGE_DIR}"
                    }
                if "skip" in h:
                    readers[name].update(status="skipped", reason=h["skip"])
                    continue
                workers[name] = w
                readers[name].update(
                    status="ok",
                    reason=None,
                    version=h["version"],
                    label=h["label"],
                    import_seconds=h["import_seconds"],
                    notes=h.get("notes") or {},
                )
        jobs = [j for j in jobs if j.reader in workers]
        phases["start_readers"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        # Prepare: build peers' copies, check examples, warm up.
        for k, job in enumerate(jobs):
            status(f"preparing {k + 1}/{len(jobs)}: {_job_name(job)}", force=k == 0)
            entry = manifest["corpora"][job.corpus]
            checks = (
                [] if job.reader == "zstd-floor" else _checks(entry, job.corpus, entry["examples"])
            )
            try:
                resp = workers[job.reader].request(
                    {
                        "op": "prepare",
                        "reader": job.reader,
                        "target": job.target,
                        "corpus": job.corpus,
                        "checks": checks,
                        "patterns": list(job.patterns),
                    },
                    timeout=1800,
                )
            except WorkerError as exc:
                resp = {"error": str(exc)}
            if resp.get("ok"):
                job.info = resp.get("info") or {}
                job.info["build_seconds"] = resp.get("build_seconds")
            else:
                job.error = resp.get("error") or resp.get("skip")
        phases["prepare"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()
        failed = [j for j in jobs if j.error]
        jobs = [j for j in jobs if not j.error]

        # Measure: every repetition runs every job, in a rotated order.
        total = opts.reps * len(jobs)
        t_start = time.perf_counter()
        for rep in range(opts.reps):
            shift = (rep * max(1, len(jobs) // max(opts.reps, 1))) % max(len(jobs), 1)
            order = jobs[shift:] + jobs[:shift]
            if rep % 2:
                order.reverse()
            for k, job in enumerate(order):
                done = rep * len(jobs) + k
                elapsed = time.perf_counter() - t_start
                eta = elapsed / done * (total - done) if done else 0
                status(
                    f"rep {rep + 1}/{opts.reps} [{done}/{total}] {_job_name(job)}  eta {eta:.0f}s",
                )
                if job.error:
                    continue
                try:
                    resp = workers[job.reader].request(
                        {
                            "op": "measure",
                            "reader": job.reader,
                            "target": job.target,
                            "patterns": list(job.patterns),
                            "budget": opts.budget,
                            "seed": 1000 + rep,
                        },
                        timeout=120 + 60 * opts.budget * len(job.patterns),
                    )
                except WorkerError as exc:
                    resp = {"error": str(exc)}
                if resp.get("ok"):
                    job.reps.append(resp["results"])
                else:
                    job.error = resp.get("error") or resp.get("skip")
        status.done()
        phases["measure"] = time.perf_counter() - t_phase
    finally:
        for w in processes.values():
            w.stop()

    report = {
        "schema": "atlas_fast.bench/1",
        "command": opts.command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_seconds": round(time.time() - started, 1),
        "phase_seconds": {k: round(v, 2) for k, v in phases.items()},
        "machine": system.describe(),
        "load_average": {"before": load_before, "after": system.load_average()},
        "packages": system.packages(readers),
        "atlas_fast": system.atlas_fast_info(),
        "settings": {
            "quick": opts.quick,
            "scale": opts.scale.key(),
            "reps": opts.reps,
            "budget_seconds": opts.budget,
            "configs": [f"s{s}b{b}" for s, b in opts.configs],
            "patterns": list(opts.patterns),
            "batch_size": 256,
            "reference": {"reader": REFERENCE, "config_for_peers": opts.reference_config},
            "cache_dir": str(root),
            "atlas_cache_fraction": 1 / ATLAS_CACHE_FRACTION,
        },
        "corpora": _corpora_report(manifest, opts),
        "readers": readers,
        "results": [],
        "errors": [
            {"reader": j.reader, "corpus": j.corpus, "config": j.config, "error": j.error}
            for j in failed + [j for j in jobs if j.error]
        ],
    }
    for job in jobs:
        if job.error:
            continue
        report["results"].extend(_job_rows(job, readers))
    compute_ratios(report)
    return report


def _job_name(job) -> str:
    return f"{job.reader} {job.corpus}" + (f" {job.config}" if job.config else "")


def _corpora_report(manifest: dict, opts: Options) -> dict:
    out = {}
    for corpus in opts.corpora:
        entry = manifest["corpora"][corpus]
        out[corpus] = {
            "examples": entry["examples"],
            "payload_bytes": entry["payload_bytes"],
            "atlas_cache_bytes": atlas_cache_bytes(entry["payload_bytes"]),
            "sha256": entry["sha256"],
            "datasets": {
                f"s{s}b{b}": {
                    k: entry["datasets"][f"s{s}b{b}"][k]
                    for k in ("strategy", "stored_strategy", "block_size", "shards", "disk_bytes")
                }
                for s, b in opts.configs
            },
            "description": corpus_mod.DESCRIPTIONS[corpus],
        }
    return out


def _job_rows(job, readers) -> list:
    rows = []
    for pattern in job.patterns:
        reps = [r[pattern] for r in job.reps if pattern in r]
        if not reps:
            continue
        rates = [r["examples"] / r["seconds"] for r in reps if r["seconds"] > 0]
        mbs = [r["bytes"] / r["seconds"] / 1e6 for r in reps if r["seconds"] > 0]
        if not rates:
            continue
        row = {
            "corpus": job.corpus,
            "reader": job.reader,
            "label": readers[job.reader].get("label") or job.reader,
            "kind": READER_KIND[job.reader],
            "config": job.config,
            "pattern": pattern,
            "how": reps[-1].get("how", ""),
            "examples_per_s": median(rates),
            "mb_per_s": median(mbs),
            "seconds_per_example": 1.0 / median(rates),
            "reps": [
                {k: r[k] for k in ("examples", "seconds", "bytes", "setup_seconds") if k in r}
                for r in reps
            ],
        }
        if "setup_seconds" in reps[-1]:
            row["setup_seconds"] = median(r["setup_seconds"] for r in reps)
        if "note" in reps[-1]:
            row["note"] = reps[-1]["note"]
        if job.info:
            row["dataset_info"] = job.info
        rows.append(row)
    return rows


def compute_ratios(report: dict) -> None:
    """Fill ``ratio_to_reference`` and ``ratio_to_best_peer`` of every row, in place.

    The reference is the real ``torch_atlas_ds`` package on the same Atlas configuration;
    rows without one (peers, the pickle floor) compare with it on the configuration
    ``settings.reference.config_for_peers``. When the reference did not run (not installed),
    every ``ratio_to_reference`` is None: nothing else stands in for it. The best peer is the
    fastest peer on the same corpus and pattern. Ratios above 1 mean faster.
    """
    ref_config = report["settings"]["reference"]["config_for_peers"]
    rows = report["results"]
    by_key = {(r["corpus"], r["reader"], r["config"], r["pattern"]): r for r in rows}
    best = {}
    for r in rows:
        if r["kind"] == "peer":
            k = (r["corpus"], r["pattern"])
            if k not in best or r["examples_per_s"] > best[k]["examples_per_s"]:
                best[k] = r
    for r in rows:
        ref = by_key.get((r["corpus"], REFERENCE, r["config"] or ref_config, r["pattern"]))
        if ref is not None:
            r["reference"] = {"reader": REFERENCE, "config": ref["config"]}
            r["ratio_to_reference"] = r["examples_per_s"] / ref["examples_per_s"]
        else:
            r["reference"] = None
            r["ratio_to_reference"] = None
        peer = best.get((r["corpus"], r["pattern"]))
        if peer is not None:
            r["best_peer"] = peer["reader"]
            r["ratio_to_best_peer"] = r["examples_per_s"] / peer["examples_per_s"]
        else:
            r["best_peer"] = None
            r["ratio_to_best_peer"] = None
