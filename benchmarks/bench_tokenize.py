"""``atlas-fast tokenize`` throughput: ``workers=1`` and ``2`` beside the tokenizer called by
hand, side by side.

The corpus is the standard library's ``.py`` sources cut into Dolma-style documents (the
``documents`` corpus of ``atlas_fast.bench.corpus``: ~13,600 documents, ~31 MB of text in
one JSON lines file here), and the tokenizer a byte-level BPE of 32,000 ids trained on it
(uint16 ids; ``<|endoftext|>`` id 0, appended to every document). Both are built once into
the cache directory.

Each repetition runs every side once, in a fresh process, in turn:

- ``tokenize, workers=1`` / ``workers=2``: ``atlas_fast.convert.tokenize`` of the file into a
  dataset (default writer options: shard 10,000, block 100, strategy 2), EOS appended;
- ``by hand: encode_batch``: the JSON lines read and ``Tokenizer.encode_batch`` called on
  batches of 1,024 texts in one process (the library's own thread pool on every core),
  nothing written;
- ``by hand: encode_batch_fast``: the same with ``encode_batch_fast`` (no offsets), the call
  ``tokenize``'s processes make;
- ``by hand: encode_batch_fast, 1 thread``: the same with ``TOKENIZERS_PARALLELISM=false``,
  what one core does with no reading of its own to overlap.

and reports medians of wall time as tokens/s, the ratio to ``workers=1``, and the CPU time
per million tokens (the process and its tokenizing processes). On a machine shared with
other jobs the wall-clock figures count the neighbours too, so the last columns estimate
each side on idle cores from its CPU times: a side takes at least its longest serial piece
(``tokenize``: the calling process, or one tokenizing process's share of the batches; by
hand: the calling thread, which reads and loops in Python while the library encodes, plus
the encoding spread over the cores) and at least its CPU time over the cores. The two
``tokenize`` outputs are compared byte for byte at the end. After each repetition, what two
processes gain on a plain CPU loop at that moment (``bench_convert.parallel_ceiling``: 2.0
on idle cores) says how much room the neighbours left.

    python benchmarks/bench_tokenize.py                     # 3 repetitions
    python benchmarks/bench_tokenize.py --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# _cpu: CPU seconds of this process, of its ended children, of the calling thread;
# parallel_ceiling: what two processes gain on a fixed CPU loop now (2.0 on idle cores).
from bench_convert import _cpu, parallel_ceiling

VOCAB = 32_000
EOS = "<|endoftext|>"
BATCH = 1024
SIDES = (
    "tokenize, workers=1",
    "tokenize, workers=2",
    "by hand: encode_batch",
    "by hand: encode_batch_fast",
    "by hand: encode_batch_fast, 1 thread",
)


def build(cache: Path) -> tuple:
    """The corpus file and the tokenizer, built once into ``cache``."""
    from atlas_fast.bench.corpus import stdlib_documents

    cache.mkdir(parents=True, exist_ok=True)
    corpus = cache / "documents.jsonl"
    if not corpus.is_file():
        part = corpus.with_suffix(".part")
        with open(part, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in stdlib_documents())
        part.rename(corpus)
    tokenizer = cache / f"bpe-{VOCAB}.json"
    if not tokenizer.is_file():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_texts(corpus), trainer)
        tok.save(str(tokenizer))
    return corpus, tokenizer


def _texts(corpus: Path) -> list:
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _timed(call) -> tuple:
    before, started = _cpu(), time.perf_counter()
    result = call()
    wall = time.perf_counter() - started
    own, children, thread = (a - b for a, b in zip(_cpu(), before))
    return result, {"wall": wall, "cpu": own + children, "own": own, "thread": thread}


def run_side(side: str, corpus: Path, tokenizer: Path, out: Path) -> dict:
    """One side, in this (fresh) process: its wall and CPU seconds and the tokens made."""
    if side.startswith("tokenize"):
        from atlas_fast.convert import tokenize

        workers = int(side.rsplit("=", 1)[1])
        summary, times = _timed(
            lambda: tokenize(corpus, out, tokenizer, fmt="jsonl", eos_token=EOS, workers=workers)
        )
        # On idle cores: the calling process (reading, writing) and the tokenizing processes
        # (sharing the batches) run at once, each on a core of its own.
        serial = max(times["own"], (times["cpu"] - times["own"]) / workers)
        idle = max(serial, times["cpu"] / os.cpu_count())
        return {**times, "idle": idle, "tokens": summary.tokens, "documents": summary.documents}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id(EOS)
    encode = tok.encode_batch if side == "by hand: encode_batch" else tok.encode_batch_fast

    def by_hand():
        texts = _texts(corpus)
        tokens = 0
        for start in range(0, len(texts), BATCH):
            for e in encode(texts[start : start + BATCH], add_special_tokens=False):
                tokens += len(e.ids) + (eos is not None)
        return len(texts), tokens

    (documents, tokens), times = _timed(by_hand)
    # The calling thread (reading, the Python loop) does not overlap the encoding, which
    # the library spreads over the cores (one thread with TOKENIZERS_PARALLELISM=false).
    threads = 1 if side.endswith("1 thread") else os.cpu_count()
    idle = times["thread"] + (times["cpu"] - times["thread"]) / threads
    return {**times, "idle": idle, "tokens": tokens, "documents": documents}


def _fresh(side: str, corpus: Path, tokenizer: Path, out: Path) -> dict:
    env = dict(os.environ, ATLAS_FAST_NO_TORCH="1")
    if side.endswith("1 thread"):
        env["TOKENIZERS_PARALLELISM"] = "false"
    done = subprocess.run(
        [sys.executable, __file__, "--side", side, str(corpus), str(tokenizer), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{side}: exit {done.returncode}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("ATLAS_FAST_CACHE", Path.home() / ".cache" / "atlas_fast"))
        / "bench-tokenize",
        help="where the corpus and the tokenizer are built once",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        corpus, tokenizer, out = map(Path, args.paths)
        print(json.dumps(run_side(args.side, corpus, tokenizer, out)))
        return 0

    from atlas_fast.bench.system import describe, load_average

    corpus, tokenizer = build(args.cache)
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    runs: dict = {side: [] for side in SIDES}
    ceilings = []
    try:
        for _ in range(args.repeats):
            for side in SIDES:
                out = work / side.replace(" ", "").replace(",", "-").replace(":", "")
                shutil.rmtree(out, ignore_errors=True)
                runs[side].append(_fresh(side, corpus, tokenizer, out))
            ceilings.append(parallel_ceiling(1))
        one, two = (work / f"tokenize-workers={n}" for n in (1, 2))
        identical = sorted(p.relative_to(one) for p in one.rglob("*")) == sorted(
            p.relative_to(two) for p in two.rglob("*")
        ) and all(
            filecmp.cmp(p, two / p.relative_to(one), shallow=False)
            for p in one.rglob("*")
            if p.is_file()
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tokens = runs[SIDES[0]][0]["tokens"]
    documents = runs[SIDES[0]][0]["documents"]
    base = statistics.median(r["wall"] for r in runs[SIDES[0]])
    rows = []
    print(
        f"{documents:,} documents, {tokens:,} tokens (EOS included), "
        f"{corpus.stat().st_size / 1e6:.1f} MB of JSON lines; {args.repeats} repetitions"
    )
    base_idle = statistics.median(r["idle"] for r in runs[SIDES[0]])
    print(
        f"{'side':38} {'tokens/s':>9} {'vs w=1':>7} {'CPU s/Mtok':>10} "
        f"{'idle est.':>9} {'vs w=1':>7}"
    )
    for side in SIDES:
        if any(r["tokens"] != tokens for r in runs[side]):
            raise RuntimeError(f"{side}: {runs[side][0]['tokens']} tokens, not {tokens}")
        wall = statistics.median(r["wall"] for r in runs[side])
        cpu = statistics.median(r["cpu"] for r in runs[side])
        idle = statistics.median(r["idle"] for r in runs[side])
        row = {
            "side": side,
            "tokens_per_s": tokens / wall,
            "ratio_to_workers_1": base / wall,
            "cpu_s_per_mtoken": cpu / tokens * 1e6,
            "idle_tokens_per_s": tokens / idle,
            "idle_ratio_to_workers_1": base_idle / idle,
            "runs": runs[side],
        }
        rows.append(row)
        print(
            f"{side:38} {row['tokens_per_s']:>9,.0f} {row['ratio_to_workers_1']:>6.2f}x "
            f"{row['cpu_s_per_mtoken']:>10.2f} {row['idle_tokens_per_s']:>9,.0f} "
            f"{row['idle_ratio_to_workers_1']:>6.2f}x"
        )
    ceiling = statistics.median(ceilings)
    print(f"two processes on a CPU loop, after each repetition: {ceiling:.2f}x one (median)")
    print(f"workers=1 and workers=2 wrote the same bytes: {identical}")
    load_after = load_average()
    print(f"load average before {load_before}, after {load_after}")
    if args.json:
        import tokenizers

        report = {
            "command": "python benchmarks/bench_tokenize.py"
            + (f" --repeats {args.repeats}" if args.repeats != 3 else ""),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": describe(),
            "load_average": {"before": load_before, "after": load_after},
            "tokenizers": tokenizers.__version__,
            "corpus": {
                "documents": documents,
                "tokens": tokens,
                "jsonl_bytes": corpus.stat().st_size,
                "vocab": VOCAB,
            },
            "repeats": args.repeats,
            "identical": identical,
            "parallel_ceiling": ceiling,
            "rows": rows,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
