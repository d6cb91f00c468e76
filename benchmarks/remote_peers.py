"""The peer rows of bench_remote.py: MosaicML streaming's StreamingDataset reading an MDS
conversion of the same examples from the same nginx, through the same latency proxy, with a
cold local cache (a fresh ``local`` folder per run).

mosaicml-streaming cannot live in the main environment (it caps numpy below 2.2, and
``import streaming`` imports torchvision, whose PyPI build fails beside the local CPU torch),
so it runs in the MDS venv that tools/test.sh makes (``$ATLAS_FAST_MDS_VENV``, default
``${XDG_CACHE_HOME:-~/.cache}/atlas-fast/mds-venv``), each run a fresh process of that venv's
python running benchmarks/_peer_streaming.py, with tools/mds-test-env (a placeholder
torchvision) first on its PYTHONPATH. Without that venv the rows are skipped, with the reason
and the command that makes it; the rest of the benchmark runs as before.

The MDS conversion (zstd, 64 MiB shards: MDSWriter's default size limit) is written once into
the benchmark cache folder and served beside the Atlas dataset as ``s3://peer/mds``
(path-style GETs map onto nginx's root). StreamingDataset's S3 client (boto3) finds the proxy
through S3_ENDPOINT_URL and signs its requests with the test credentials, which nginx ignores.

Rows (each run's StreamingDataset iterated through ``DataLoader(batch_size=64)``, fork):
``epoch`` (shuffle=True, its default algorithm, 0 workers) and ``epoch, 2 workers``; each is
compared with atlas_fast's sampler epoch and pass in order with the same workers, same link.

LitData is not measured: see docs/remote.md ("Beside MosaicML streaming") for why.
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
SCRIPT = Path(__file__).resolve().parent / "_peer_streaming.py"
PLACEHOLDER = ROOT / "tools" / "mds-test-env"
BUCKET = "peer"
PREFIX = "mds"
PEERS = ("streaming",)
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
TIMEOUT = 1800


def add_arguments(parser) -> None:
    parser.add_argument(
        "--peers",
        default="streaming",
        help="peer rows, separated by ',': 'streaming' (MosaicML StreamingDataset, from the "
        "MDS venv) or 'none' (default: streaming)",
    )
    parser.add_argument(
        "--peer-patterns",
        default=";".join(PATTERNS),
        help=f"the peer rows' patterns, separated by ';' (default: {';'.join(PATTERNS)})",
    )
    parser.add_argument(
        "--peer-cache",
        help="where the MDS conversion is written once (default: the bench cache folder)",
    )


def parse_peers(text: str) -> list:
    """``"streaming"`` -> ``["streaming"]``; ``"none"`` or ``""`` -> ``[]``; others refused."""
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


def find_streaming() -> tuple:
    """``(python, version, None)`` of the MDS venv, or ``(None, None, why it is skipped)``."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not python.exists():
        return None, None, f"no MDS venv at {venv}: {MAKE_VENV}"
    probe = "import streaming, torch; print(streaming.__version__)"
    try:
        done = subprocess.run(
            [str(python), "-c", probe], env=_env(), capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, f"{python} did not run: {exc}"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return None, None, f"{python} cannot import streaming and torch ({last}): {MAKE_VENV}"
    return python, done.stdout.strip(), None


def _call(python: Path, argv: list, env=None) -> dict:
    done = subprocess.run(
        [str(python), str(SCRIPT), *argv],
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if done.returncode:
        raise RuntimeError(f"{SCRIPT.name} {argv[0]} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_mds(python: Path, cache_dir: Path, copies: int) -> Path:
    """The MDS conversion of the bench's examples (the documents corpus, ``copies`` times
    over, in the Atlas dataset's order), written once into ``cache_dir``."""
    from atlas_fast.bench import corpus

    name = f"mds-zstd-64mib-documents-x{copies}-py{platform.python_version()}"
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
        info = _call(python, [*argv, "--out", str(tmp / "mds")])
    finally:
        docs.unlink(missing_ok=True)
    (tmp / "mds").rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    info["stored_bytes"] = sum(p.stat().st_size for p in target.iterdir() if p.is_file())
    marker.write_text(json.dumps(info))
    return target


def streaming_rows(args, www: Path, proxies: dict, reps: int, atlas=None) -> dict:
    """StreamingDataset's rows, ``{"available", "reason" | "version", "rows"}``; ``www`` is
    nginx's root, ``proxies`` the bench's ProxyProcess per link label. ``atlas(label, pattern,
    rep)`` (bench_remote's measurement: examples, seconds, first) is run right after each
    StreamingDataset run for the atlas_fast patterns it is compared with, so that each ratio
    is of two runs side by side (the machine is shared: its load drifts over a run)."""
    patterns = parse_patterns(args.peer_patterns)
    python, version, reason = find_streaming()
    if python is None:
        print(f"peer rows skipped: StreamingDataset: {reason}", flush=True)
        return {"available": False, "reason": reason}
    from servers import S3_ENV  # tests/remote, on sys.path in bench_remote.py

    from atlas_fast.bench import corpus

    cache = Path(args.peer_cache) if args.peer_cache else corpus.default_cache_dir()
    mds = build_mds(python, cache, args.copies)
    info = json.loads((mds / ".complete").read_text())
    served = Path(www) / BUCKET / PREFIX
    served.parent.mkdir(parents=True, exist_ok=True)
    if not served.exists():
        served.symlink_to(mds, target_is_directory=True)
    out = {
        "available": True,
        "version": version,
        "label": f"MosaicML streaming {version} StreamingDataset",
        "remote": f"s3://{BUCKET}/{PREFIX}",
        "mds": {
            "compression": "zstd",
            "size_limit": 1 << 26,
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
                proxy.reset_stats()
                got = _call(python, [*argv, "--seed", str(rep)], env)
                stats = proxy.stats()
                s = samples.setdefault((pattern, label), {"count": got["examples"]})
                s.setdefault("rates", []).append(got["examples"] / got["seconds"])
                s.setdefault("firsts", []).append(got["first_s"])
                s.setdefault("requests", []).append(stats["requests"])
                s.setdefault("body", []).append(stats["body_bytes"])
                for atlas_pattern in compared if atlas is not None else ():
                    count, seconds, _ = atlas(label, atlas_pattern, rep)
                    s.setdefault("paired", {}).setdefault(atlas_pattern, []).append(count / seconds)
        for label in proxies:
            s = samples[(pattern, label)]
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
            out["rows"].setdefault(pattern, {})[label] = row
            print(f"{label:6s} StreamingDataset {pattern:16s} {row}", flush=True)
    return out


def run(args, www: Path, proxies: dict, reps: int, atlas=None) -> dict:
    """Every peer asked for by ``--peers``: ``{name: its rows or why skipped}``."""
    results = {}
    for name in parse_peers(args.peers):
        if name == "streaming":
            results[name] = streaming_rows(args, www, proxies, reps, atlas)
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
