"""The peer rows of bench_remote.py: MosaicML streaming's StreamingDataset and LitData's
StreamingDataset reading a conversion of the same examples from the same nginx, through the
same latency proxy, with a cold local cache (a fresh cache folder per run).

mosaicml-streaming cannot live in the main environment (it caps numpy below 2.2, and
``import streaming`` imports torchvision, whose PyPI build fails beside the local CPU torch),
so the peers run in the MDS venv that tools/test.sh makes (``$ATLAS_FAST_MDS_VENV``, default
``${XDG_CACHE_HOME:-~/.cache}/atlas-fast/mds-venv``; LitData installed into it by hand, see
docs/remote.md), each run a fresh process of that venv's python running
benchmarks/_peer_<name>.py, with tools/mds-test-env (a placeholder torchvision) first on its
PYTHONPATH. A peer the venv lacks is skipped, with the reason and the command that makes it;
the rest of the benchmark runs as before.

Each conversion is written once into the benchmark cache folder and served beside the Atlas
dataset as ``s3://peer/<format>`` (path-style GETs map onto nginx's root): MDS with zstd and
64 MiB shards (MDSWriter's default size limit); LitData's ``optimize`` defaults (64 MB chunks,
uncompressed: _peer_litdata.py says why). Their S3 clients find the proxy through
S3_ENDPOINT_URL and sign requests with the test credentials, which nginx ignores.

Rows (each run's dataset iterated through a DataLoader with batch_size=64): ``epoch``
(shuffle=True, the peer's default algorithm, 0 workers) and, asked for, ``epoch, 2 workers``
(not measured yet: docs/remote.md, "Not yet"; StreamingDataset's workers are spawned, as
forked ones share its parent's S3 connection); each is
compared with atlas_fast's sampler epoch and pass in order with the same workers, same link,
run right after it. A run that fails or gives no answer in READ_TIMEOUT is recorded in its
row and the others go on.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PLACEHOLDER = ROOT / "tools" / "mds-test-env"
BUCKET = "peer"
# name -> its module (imported to probe), the format served as s3://peer/<format>, its label
PEERS = {
    "streaming": {
        "module": "streaming",
        "format": "mds",
        "conversion": "mds-zstd-64mib",
        "label": "MosaicML streaming {} StreamingDataset",
    },
    "litdata": {
        "module": "litdata",
        "format": "litdata",
        "conversion": "litdata-raw-64mb",
        "label": "LitData {} StreamingDataset",
    },
}
# pattern -> (workers, the atlas_fast patterns it is compared with)
PATTERNS = {
    "epoch": (0, ("sampler", "in order")),
    "epoch, 2 workers": (2, ("sampler, 2 workers", "in order, 2 workers")),
}
TARGET = 3.0  # atlas_fast's epoch at least 3x StreamingDataset's first epoch (issue's target)
MAKE_VENV = (
    "tools/test.sh makes it (or by hand: python -m venv VENV && VENV/bin/python -m pip install "
    "-c tools/ci-constraints.txt torch -e '.[mds,test-core]'); ATLAS_FAST_MDS_VENV names "
    "another one"
)
LITDATA_INSTALL = (
    "LitData goes into it with: VENV/bin/python -m pip install --no-deps litdata==0.2.76 "
    "lightning-utilities tifffile obstore"
)
TIMEOUT = 1800  # a conversion
READ_TIMEOUT = 600  # one epoch: past it the run is recorded as failed, the others go on


def add_arguments(parser) -> None:
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="peer rows, separated by ',': 'streaming' (MosaicML StreamingDataset) and "
        "'litdata' (LitData), from the MDS venv, or 'none' (default: streaming,litdata)",
    )
    parser.add_argument(
        "--peer-patterns",
        default="epoch",
        help=f"the peer rows' patterns, separated by ';' ({'; '.join(PATTERNS)}; default: "
        "epoch: the 2-worker rows are not measured yet, see docs/remote.md)",
    )
    parser.add_argument(
        "--peer-cache",
        help="where the conversions are written once (default: the bench cache folder)",
    )


def parse_peers(text: str) -> list:
    """``"streaming,litdata"`` -> ``["streaming", "litdata"]``; ``"none"`` or ``""`` ->
    ``[]``; others refused."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names in ([], ["none"]):
        return []
    unknown = [name for name in names if name not in PEERS]
    if unknown:
        raise ValueError(f"--peers: unknown peer {unknown[0]!r} (known: {', '.join(PEERS)}, none)")
    return names


def parse_patterns(text: str) -> list:
    names = [name.strip() for name in text.split(";") if name.strip()]
    unknown = [name for name in names if name not in PATTERNS]
    if unknown:
        raise ValueError(
            f"--peer-patterns: unknown pattern {unknown[0]!r} (known: {'; '.join(PATTERNS)})"
        )
    return names


def venv_dir() -> Path:
    given = os.environ.get("ATLAS_FAST_MDS_VENV")
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "atlas-fast" / "mds-venv"


def _env(extra=None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PLACEHOLDER)  # the placeholder torchvision, and nothing of ours
    env.update(extra or {})
    return env


def find_peer(name: str) -> tuple:
    """``(python, version, None)`` of the MDS venv that imports the peer, or ``(None, None,
    why it is skipped)``."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    module = PEERS[name]["module"]
    make = MAKE_VENV if name == "streaming" else MAKE_VENV + "; " + LITDATA_INSTALL
    if not python.exists():
        return None, None, f"no MDS venv at {venv}: {make}"
    probe = f"import {module}, torch; print({module}.__version__)"
    try:
        done = subprocess.run(
            [str(python), "-c", probe], env=_env(), capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, f"{python} did not run: {exc}"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return None, None, f"{python} cannot import {module} and torch ({last}): {make}"
    return python, done.stdout.strip(), None


class PeerRunFailed(RuntimeError):
    pass


def _call(python: Path, name: str, argv: list, env=None, timeout=TIMEOUT) -> dict:
    script = HERE / f"_peer_{name}.py"
    try:
        done = subprocess.run(
            [str(python), str(script), *argv],
            env=_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise PeerRunFailed(f"{script.name} {argv[0]}: no answer in {timeout} s") from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        if argv[0] == "read":
            raise PeerRunFailed(f"{script.name} read failed ({done.returncode}): {last}")
        raise RuntimeError(f"{script.name} {argv[0]} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(python: Path, peer: str, cache_dir: Path, copies: int) -> Path:
    """The peer's conversion of the bench's examples (the documents corpus, ``copies`` times
    over, in the Atlas dataset's order), written once into ``cache_dir``."""
    from atlas_fast.bench import corpus

    conversion = PEERS[peer]["conversion"]
    name = f"{conversion}-documents-x{copies}-py{platform.python_version()}"
    target = Path(cache_dir) / "remote-peers" / name
    marker = target / ".complete"
    if marker.exists():
        return target
    tmp = target.with_name("." + name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.mkdir(parents=True)
    docs = tmp.parent / (name + ".pickle")
    try:
        docs.write_bytes(pickle.dumps(corpus.examples("documents"), protocol=5))
        argv = ["write", "--examples", str(docs), "--copies", str(copies)]
        info = _call(python, peer, [*argv, "--out", str(tmp / "out")])
    finally:
        docs.unlink(missing_ok=True)
    (tmp / "out").rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    info["stored_bytes"] = sum(p.stat().st_size for p in target.iterdir() if p.is_file())
    marker.write_text(json.dumps(info))
    return target


def peer_rows(name: str, args, www: Path, proxies: dict, reps: int, atlas=None) -> dict:
    """The peer's rows, ``{"available", "reason" | "version", "rows"}``; ``www`` is
    nginx's root, ``proxies`` the bench's ProxyProcess per link label. ``atlas(label, pattern,
    rep)`` (bench_remote's measurement: examples, seconds, first) is run right after each
    peer run for the atlas_fast patterns it is compared with, so that each ratio
    is of two runs side by side (the machine is shared: its load drifts over a run)."""
    patterns = parse_patterns(args.peer_patterns)
    python, version, reason = find_peer(name)
    if python is None:
        print(f"peer rows skipped: {name}: {reason}", flush=True)
        return {"available": False, "reason": reason}
    from servers import S3_ENV  # tests/remote, on sys.path in bench_remote.py

    from atlas_fast.bench import corpus

    cache = Path(args.peer_cache) if args.peer_cache else corpus.default_cache_dir()
    built = build(python, name, cache, args.copies)
    info = json.loads((built / ".complete").read_text())
    fmt = PEERS[name]["format"]
    served = Path(www) / BUCKET / fmt
    served.parent.mkdir(parents=True, exist_ok=True)
    if not served.exists():
        served.symlink_to(built, target_is_directory=True)
    out = {
        "available": True,
        "version": version,
        "label": PEERS[name]["label"].format(version),
        "remote": f"s3://{BUCKET}/{fmt}",
        "conversion": {
            "name": PEERS[name]["conversion"],
            "shards": info["shards"],
            "examples": info["examples"],
            "stored_bytes": info["stored_bytes"],
        },
        "rows": {},
    }
    samples: dict = {}
    for pattern in patterns:
        workers, compared = PATTERNS[pattern]
        for rep in range(reps):
            for label, proxy in proxies.items():
                env = dict(S3_ENV, S3_ENDPOINT_URL=proxy.url)
                argv = ["read", "--remote", out["remote"], "--workers", str(workers)]
                if workers and name == "streaming":
                    # Forked workers share the boto3 connection StreamingDataset opened in
                    # the parent for index.json: interleaved answers (a 60 s stall, a zstd
                    # "Data corruption detected"). Spawned workers open their own.
                    argv += ["--context", "spawn"]
                proxy.reset_stats()
                try:
                    got = _call(python, name, [*argv, "--seed", str(rep)], env, READ_TIMEOUT)
                except PeerRunFailed as exc:
                    print(f"{label:6s} {name} {pattern}: {exc}", flush=True)
                    failed = samples.setdefault((pattern, label), {}).setdefault("failed", [])
                    failed.append(str(exc)[-500:])
                    continue
                stats = proxy.stats()
                s = samples.setdefault((pattern, label), {})
                s["count"] = got["examples"]
                s.setdefault("rates", []).append(got["examples"] / got["seconds"])
                s.setdefault("firsts", []).append(got["first_s"])
                s.setdefault("requests", []).append(stats["requests"])
                s.setdefault("body", []).append(stats["body_bytes"])
                for atlas_pattern in compared if atlas is not None else ():
                    count, seconds, _ = atlas(label, atlas_pattern, rep)
                    s.setdefault("paired", {}).setdefault(atlas_pattern, []).append(count / seconds)
        for label in proxies:
            s = samples[(pattern, label)]
            if "rates" not in s:
                out["rows"].setdefault(pattern, {})[label] = {"failed": s["failed"]}
                continue
            row = {
                "examples": s["count"],
                "examples_per_s": statistics.median(s["rates"]),
                "rates": s["rates"],
                "first_example_s": statistics.median(s["firsts"]),
                "requests": statistics.median(s["requests"]),
                "body_bytes": statistics.median(s["body"]),
            }
            if "paired" in s:
                row["atlas_fast_paired_rates"] = s["paired"]
            if "failed" in s:
                row["failed"] = s["failed"]
            out["rows"].setdefault(pattern, {})[label] = row
            print(f"{label:6s} {name} {pattern:16s} {row}", flush=True)
    return out


def run(args, www: Path, proxies: dict, reps: int, atlas=None) -> dict:
    """Every peer asked for by ``--peers``: ``{name: its rows or why skipped}``."""
    results = {}
    for name in parse_peers(args.peers):
        results[name] = peer_rows(name, args, www, proxies, reps, atlas)
    return results


def summarize(peers: dict, runs: dict) -> dict:
    """The peers' rows beside atlas_fast's: ``peers`` plus ``"compared"``, per "atlas pattern
    / peer pattern" and link, both examples/s and atlas_fast's over the peer's with the
    issue's target (at least TARGET x). Where atlas_fast was run beside each peer run (its
    ``atlas_fast_paired_rates``), the ratio is the median of the paired ratios; otherwise it
    divides by the atlas_fast row of ``runs`` (the bench's own rows), where there is one."""
    compared: dict = {}
    for name, peer in peers.items():
        for pattern, rows in peer.get("rows", {}).items():
            for atlas_pattern in PATTERNS[pattern][1]:
                for label, row in rows.items():
                    if "examples_per_s" not in row:
                        continue  # every run failed
                    paired = row.get("atlas_fast_paired_rates", {}).get(atlas_pattern)
                    if paired:
                        ratios = [a / b for a, b in zip(paired, row["rates"])]
                        mine, ratio = statistics.median(paired), statistics.median(ratios)
                    else:
                        got = runs.get(atlas_pattern, {}).get(label)
                        if got is None or not row["examples_per_s"]:
                            continue
                        mine = got["examples_per_s"]
                        ratio = mine / row["examples_per_s"]
                    key = f"atlas_fast {atlas_pattern} / {name} {pattern}"
                    compared.setdefault(key, {})[label] = {
                        "atlas_fast": mine,
                        name: row["examples_per_s"],
                        "ratio": ratio,
                        "paired": bool(paired),
                        "target": TARGET,
                        "met": ratio >= TARGET,
                    }
    for key, rows in compared.items():
        cells = ", ".join(
            f"{label} {r['ratio']:.2f}x{'' if r['met'] else f' (< {TARGET:g}x)'}"
            for label, r in rows.items()
        )
        print(f"{key}: {cells}", flush=True)
    return {**peers, "compared": compared}


if __name__ == "__main__":  # pragma: no cover - a module of bench_remote.py
    sys.exit("run benchmarks/bench_remote.py")
