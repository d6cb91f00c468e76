"""The access patterns, each timed for at most a budget of seconds (run inside a worker).

Every pattern returns ``{"examples", "seconds", "bytes"}`` (plus ``"how"``, and for the
shuffled epoch ``"setup_seconds"``): ``examples / seconds`` is the rate, ``bytes`` the pickled
size of the examples read (the same figure whichever reader read them, so MB/s compare). The
random indices depend only on the seed, so every reader gets the same ones in a repetition.
"""

from __future__ import annotations

from itertools import islice
from time import perf_counter

__all__ = ["PATTERNS", "BATCH", "CACHED_RUN", "run_patterns", "check_examples"]

PATTERNS = ("open", "sequential", "random", "batch", "shuffled", "cached")
BATCH = 256
CACHED_RUN = 16  # the cached pattern reads these many consecutive examples over and over
_RANDOM_DRAWS = 1 << 16
_BATCHES = 256
_MAX_OPENS = 30


def _run_indices(fetch, indices, budget: float, chunk: int):
    """Call ``fetch(i)`` over ``indices`` until done or past the budget; -> (count, seconds)."""
    pos = 0
    total = len(indices)
    t0 = perf_counter()
    deadline = t0 + budget
    while pos < total:
        for i in indices[pos : pos + chunk]:
            fetch(i)
        pos = min(pos + chunk, total)
        if perf_counter() >= deadline:
            break
    return pos, perf_counter() - t0


def _run_cycle(fetch, indices, budget: float):
    """Call ``fetch`` over ``indices`` again and again until past the budget."""
    rounds = 0
    per_check = max(1, 64 // len(indices))
    t0 = perf_counter()
    deadline = t0 + budget
    while True:
        for _ in range(per_check):
            for i in indices:
                fetch(i)
        rounds += per_check
        if perf_counter() >= deadline:
            break
    return rounds * len(indices), perf_counter() - t0


def _run_iter(it, budget: float, chunk: int, t0=None):
    n = 0
    if t0 is None:
        t0 = perf_counter()
    deadline = t0 + budget
    while True:
        k = 0
        for _ in islice(it, chunk):
            k += 1
        n += k
        if k < chunk or perf_counter() >= deadline:
            break
    return n, perf_counter() - t0


def _close_iter(it) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


def check_examples(reader, target, checks, corpus: str) -> None:
    """Raise if the reader returns other examples than the corpus holds at these indices."""
    from .corpus import fingerprint

    h = reader.open(target)
    try:
        n = reader.length(h)
        if n != target["examples"]:
            raise AssertionError(
                f"{reader.name} reads {n} examples, the corpus has {target['examples']}"
            )
        indices = [i for i, _ in checks]
        for i, expected in checks:
            got = fingerprint(corpus, reader.get(h, i))
            if got != expected:
                raise AssertionError(
                    f"{reader.name} returned another example at index {i}: "
                    f"expected {expected!r}, got {got!r}"
                )
        batch, _ = reader.get_batch(h, indices)
        got = [fingerprint(corpus, x) for x in batch]
        if got != [fp for _, fp in checks]:
            raise AssertionError(f"{reader.name}: a batch returned other examples: {got}")
    finally:
        reader.close(h)


def run_patterns(reader, target, patterns, budget: float, seed: int) -> dict:
    """Time each of ``patterns`` once, for at most ``budget`` seconds each."""
    import numpy as np

    offsets = np.load(target["floor_offsets"]).astype(np.int64)
    sizes = np.diff(offsets)
    n = len(sizes)
    mean_size = float(sizes.mean()) if n else 0.0
    rng = np.random.default_rng(seed)
    results = {}
    if n == 0:
        return results
    if getattr(reader, "patterns", None):
        patterns = [p for p in patterns if p in reader.patterns]
    if reader.name == "zstd-floor":
        return _zstd_floor(reader, target, patterns, budget, rng, sizes)

    if "open" in patterns:
        times = []
        t_end = perf_counter() + budget
        while len(times) < _MAX_OPENS:
            t0 = perf_counter()
            h = reader.open(target)
            reader.get(h, 0)
            t1 = perf_counter()
            reader.close(h)
            times.append(t1 - t0)
            if t1 >= t_end:
                break
        results["open"] = {
            "examples": len(times),
            "seconds": sum(times),
            "bytes": int(sizes[0]) * len(times),
            "how": "constructor + first example",
        }

    h = reader.open(target)
    try:
        fetch = reader.getter(h)
        if "sequential" in patterns:
            it, how = reader.sequential(h)
            if how == "ds[i] in order":
                count, secs = _run_indices(fetch, range(n), budget, 64)
            else:
                count, secs = _run_iter(it, budget, 64)
            _close_iter(it)
            results["sequential"] = {
                "examples": count,
                "seconds": secs,
                "bytes": int(sizes[:count].sum()),
                "how": how,
            }
        if "random" in patterns:
            draws = rng.integers(0, n, size=_RANDOM_DRAWS)
            count, secs = _run_indices(fetch, draws.tolist(), budget, 16)
            results["random"] = {
                "examples": count,
                "seconds": secs,
                "bytes": int(sizes[draws[:count]].sum()),
                "how": "ds[i], uniform random i",
            }
        if "batch" in patterns:
            batches = rng.integers(0, n, size=(_BATCHES, BATCH))
            lists = batches.tolist()
            get_batch = reader.get_batch
            how = ""
            done = 0
            t0 = perf_counter()
            deadline = t0 + budget
            for idx in lists:
                _, how = get_batch(h, idx)
                done += 1
                if perf_counter() >= deadline:
                    break
            secs = perf_counter() - t0
            results["batch"] = {
                "examples": done * BATCH,
                "seconds": secs,
                "bytes": int(sizes[batches[:done]].sum()),
                "how": how,
            }
        if "shuffled" in patterns:
            t0 = perf_counter()
            it, how = reader.shuffled(h, seed)
            it = iter(it)
            next(it)
            t1 = perf_counter()
            count, secs = _run_iter(it, budget, 64, t0=t1)
            _close_iter(it)
            results["shuffled"] = {
                "examples": count,
                "seconds": secs,
                "bytes": int(count * mean_size),
                "how": how,
                "setup_seconds": t1 - t0,
                "note": "bytes estimated from the mean example size",
            }
        if "cached" in patterns:
            run = min(CACHED_RUN, n)
            # Block-aligned for both block sizes benchmarked (16 and 100), inside the first
            # shard (later shards start where the previous one ended, not on a block).
            first = min(n, target.get("first_shard") or n)
            starts = list(range(0, first - run + 1, 400)) or [0]
            start = starts[int(rng.integers(0, len(starts)))]
            fetch(start)
            count, secs = _run_cycle(fetch, range(start, start + run), budget)
            total = int(sizes[start : start + run].sum()) * (count // run)
            total += int(sizes[start : start + count % run].sum())
            results["cached"] = {
                "examples": count,
                "seconds": secs,
                "bytes": total,
                "how": f"ds[i] over {run} consecutive examples, again and again",
            }
    finally:
        reader.close(h)
    return results


def _zstd_floor(reader, target, patterns, budget, rng, sizes) -> dict:
    import numpy as np

    results = {}
    h = reader.open(target)
    try:
        blocks = h["blocks"]
        starts = np.zeros(len(blocks) + 1, dtype=np.int64)
        np.cumsum([b[4] for b in blocks], out=starts[1:])
        decode = reader.decode_block
        if "sequential" in patterns:
            done = 0
            t0 = perf_counter()
            deadline = t0 + budget
            for block in blocks:
                decode(block)
                done += 1
                if perf_counter() >= deadline:
                    break
            secs = perf_counter() - t0
            count = int(starts[done])
            results["sequential"] = {
                "examples": count,
                "seconds": secs,
                "bytes": int(sizes[:count].sum()),
                "how": "decompress every block in order (no unpickling)",
            }
        if "random" in patterns:
            n = int(starts[-1])
            draws = rng.integers(0, n, size=_RANDOM_DRAWS)
            which = (np.searchsorted(starts, draws, side="right") - 1).tolist()
            count, secs = _run_indices(lambda b: decode(blocks[b]), which, budget, 16)
            results["random"] = {
                "examples": count,
                "seconds": secs,
                "bytes": int(sizes[draws[:count]].sum()),
                "how": "decompress the block of a uniform random example (no unpickling)",
            }
    finally:
        reader.close(h)
    return results
