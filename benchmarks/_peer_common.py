"""What the peers' scripts (_peer_litdata.py, _peer_streaming.py) share: their command line, the
timing of one first epoch and the JSON line they print. Run by the MDS venv's python, which puts
benchmarks/ (the scripts' folder) first on sys.path; only the standard library is imported.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import time

BATCH = 64  # the loaders' batch size


def first_epoch(make_loader) -> dict:
    """Times ``make_loader()`` and one pass over the loader it returns: the examples seen, the
    seconds in all and the seconds to the first batch (both counted from before the call)."""
    start = time.perf_counter()
    loader = make_loader()
    count, first = 0, None
    for batch in loader:
        if not count:
            first = time.perf_counter() - start
        count += len(batch)
    seconds = time.perf_counter() - start
    del loader  # the peer's dataset goes with it, before the caller cleans up its cache
    return {"examples": count, "seconds": seconds, "first_s": first}


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that were joined."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def token_batches(make_loader, batches: int, tokens_of) -> dict:
    """Times ``batches`` batches of ``make_loader()`` (``tokens_of(batch)``: its tokens):
    ``{"tokens_per_s"`` (after the first batch, by the wall clock), ``"cpu_ns_per_token"``
    (this process and its workers, from before the call, once the workers are joined),
    ``"tokens"}`` (bench_tokens.py's rows, ours and the peers')."""
    gc.collect()
    cpu0 = cpu_seconds()
    loader = make_loader()
    it = iter(loader)
    per_batch = tokens_of(next(it))
    t0 = time.perf_counter()
    got = 0
    for batch in itertools.islice(it, batches - 1):
        got += tokens_of(batch)
    seconds = time.perf_counter() - t0
    del it, loader
    gc.collect()
    cpu = cpu_seconds() - cpu0
    return {
        "tokens_per_s": got / seconds,
        "cpu_ns_per_token": cpu * 1e9 / (got + per_batch),
        "tokens": got + per_batch,
    }


def main(doc: str, write, read, argv=None, read_options=None) -> int:
    """The peer's command line (its module docstring ``doc`` says it): ``write`` calls
    ``write(examples, copies, out)``, ``read`` calls ``read(remote, workers, shuffle, seed,
    **extra)``, where ``read_options`` maps extra ``read`` flags to add_argument's keywords and
    ``extra`` holds their values. Prints the returned dict as one JSON line."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--examples", required=True, help="a pickled list of documents")
    w.add_argument("--copies", type=int, required=True)
    w.add_argument("--out", required=True)
    r = sub.add_parser("read")
    r.add_argument("--remote", required=True)
    r.add_argument("--workers", type=int, default=0)
    r.add_argument("--no-shuffle", action="store_true")
    r.add_argument("--seed", type=int, default=0)
    extra = [
        r.add_argument(flag, **keywords).dest for flag, keywords in (read_options or {}).items()
    ]
    args = parser.parse_args(argv)
    if args.command == "write":
        out = write(args.examples, args.copies, args.out)
    else:
        options = {key: getattr(args, key) for key in extra}
        out = read(args.remote, args.workers, not args.no_shuffle, args.seed, **options)
    print(json.dumps(out))
    return 0
