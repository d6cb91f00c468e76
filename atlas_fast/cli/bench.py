"""``atlas-fast bench``: atlas_fast side by side with the peers, on the same data, in one run.

With no arguments it builds (once, into a cache directory) a corpus from the standard
library's own sources, writes it as Atlas datasets with every compression strategy and block
sizes 16 and 100, and times atlas_fast's two backends (atlas_fast[cython], atlas_fast[python]),
the reference package torch_atlas_ds when it is importable (every "xref" ratio is to it) and
the peers that are installed (``pip install 'atlas-fast[bench]'``: MosaicML Streaming, LitData,
Hugging Face datasets, zarr) over the same access patterns. Peers not installed are reported
as skipped, with the reason.

Only light imports at module level: the command line imports this module to build its parser.
"""

from __future__ import annotations

import sys

__all__ = ["add_arguments", "run"]

READER_GROUPS = {
    "atlas": ("torch_atlas_ds", "atlas_fast", "atlas_fast-python"),
    "peers": ("mds", "litdata", "litdata-zstd", "hf", "zarr"),
    "floors": ("pickle-floor", "zstd-floor"),
}


def add_arguments(parser) -> None:
    from ..bench.corpus import ALL_CONFIGS, CORPORA
    from ..bench.measure import PATTERNS
    from ..bench.readers import READER_KIND

    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller corpus, 2 configurations, 3 repetitions, short budgets (under a minute)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every figure, with the machine, here")
    parser.add_argument("--plot", metavar="PATH", help="draw a PNG bar chart (needs matplotlib)")
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where the corpus is built (default: $ATLAS_FAST_CACHE, or atlas_fast in "
        "${XDG_CACHE_HOME:-~/.cache}; then bench-VERSION)",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the corpus in the cache")
    parser.add_argument("--reps", type=int, help="repetitions (default 5; --quick 3)")
    parser.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="time bound of each measurement (default 0.15; --quick 0.03)",
    )
    parser.add_argument(
        "--configs",
        metavar="LIST",
        help=f"Atlas configurations, e.g. s0b16,s2b100, or 'all' ({','.join(ALL_CONFIGS)}); "
        "default all (--quick: s0b16,s2b100)",
    )
    parser.add_argument(
        "--corpus",
        action="append",
        choices=CORPORA,
        dest="corpora",
        help="a corpus to run (repeatable; default documents, tokens and blobs)",
    )
    parser.add_argument(
        "--readers",
        metavar="LIST",
        help="readers or groups to run, comma-separated: "
        + ", ".join(list(READER_GROUPS) + list(READER_KIND))
        + " (default all)",
    )
    parser.add_argument(
        "--patterns", metavar="LIST", help=f"access patterns (default {','.join(PATTERNS)})"
    )
    parser.add_argument(
        "--reference-config",
        default="s2b100",
        metavar="sNbM",
        help="the Atlas configuration peers are compared with (default s2b100)",
    )
    parser.add_argument("--documents", type=int, metavar="N", help="cap the documents corpus")
    parser.add_argument("--token-examples", type=int, metavar="N", help="cap the tokens corpus")
    parser.add_argument("--blobs", type=int, metavar="N", help="number of blobs")
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def _split(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def options_from_args(args):
    """Translate parsed arguments into runner ``Options`` (raises ValueError on bad input)."""
    import shlex

    from ..bench import corpus
    from ..bench.measure import PATTERNS
    from ..bench.readers import READER_KIND
    from ..bench.runner import Options

    quick = args.quick
    if args.documents is not None or args.token_examples is not None or args.blobs is not None:
        base = corpus.Scale.quick() if quick else corpus.Scale.full()
        limits = dict(base.limits)
        for key, value in (
            ("documents", args.documents),
            ("tokens", args.token_examples),
            ("blobs", args.blobs),
        ):
            if value is not None:
                if value < 1:
                    raise ValueError(f"--{key}: must be at least 1")
                limits[key] = value
        scale = corpus.Scale("custom", **limits)
    else:
        scale = corpus.Scale.quick() if quick else corpus.Scale.full()
    configs_text = args.configs or ("s0b16,s2b100" if quick else "all")
    configs = corpus.parse_configs(configs_text)
    ref = corpus.parse_configs(args.reference_config)
    if len(ref) != 1:
        raise ValueError("--reference-config: one configuration, e.g. s2b100")
    readers = None
    if args.readers:
        readers = []
        for item in _split(args.readers):
            names = READER_GROUPS.get(item, (item,))
            for name in names:
                if name not in READER_KIND:
                    raise ValueError(f"--readers: unknown reader {item!r}")
                if name not in readers:
                    readers.append(name)
    patterns = None
    if args.patterns:
        patterns = _split(args.patterns)
        for p in patterns:
            if p not in PATTERNS:
                raise ValueError(f"--patterns: unknown pattern {p!r} (one of {PATTERNS})")
    reps = args.reps if args.reps is not None else (3 if quick else 5)
    budget = args.budget if args.budget is not None else (0.03 if quick else 0.15)
    if reps < 1 or budget <= 0:
        raise ValueError("--reps must be at least 1 and --budget positive")
    return Options(
        cache_dir=args.cache_dir,
        scale=scale,
        configs=configs,
        corpora=args.corpora,
        readers=readers,
        patterns=patterns,
        reps=reps,
        budget=budget,
        reference_config=f"s{ref[0][0]}b{ref[0][1]}",
        progress=not args.no_progress,
        rebuild=args.rebuild,
        command=shlex.join(["atlas-fast", "bench", *getattr(args, "_argv", sys.argv[2:])]),
        quick=quick,
    )


def run(args) -> int:
    from ..bench import report as report_mod
    from ..bench.runner import run_benchmark

    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"atlas-fast bench: {exc}", file=sys.stderr)
        return 2
    if args.plot:  # fail before the run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "atlas-fast bench: --plot needs matplotlib: pip install matplotlib "
                "(or pip install 'atlas-fast[bench]')",
                file=sys.stderr,
            )
            return 2
    report = run_benchmark(opts)
    print(report_mod.format_table(report))
    if args.json:
        report_mod.write_json(report, args.json)
        print(f"JSON written to {args.json}")
    if args.plot:
        try:
            report_mod.plot(report, args.plot)
        except report_mod.PlotUnavailable as exc:
            print(f"atlas-fast bench: {exc}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}")
    return 0
