"""A worker process: ``python -m atlas_fast.bench._worker READER [READER ...]``.

Each reader runs in a process of its own (or shared with a sibling reader of the same
package, such as LitData raw and zstd), so a peer's imports (torch, its workarounds, its
threads) never touch the others, and a crash is that reader's alone. The parent speaks JSON
lines on stdin and on the worker's original stdout; whatever libraries print goes to stderr
(the parent sends it to a log file).

``ATLAS_FAST_BENCH_HIDE=name,name`` makes those top-level packages fail to import, as if not
installed (for tests of the skipped-peer path).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from time import perf_counter


class _Hide:
    """A meta-path finder that refuses to import the named top-level packages."""

    def __init__(self, names) -> None:
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"{fullname} hidden by ATLAS_FAST_BENCH_HIDE")
        return None


def _hide_packages() -> None:
    names = [n.strip() for n in os.environ.get("ATLAS_FAST_BENCH_HIDE", "").split(",")]
    names = [n for n in names if n]
    if names:
        import importlib.util

        sys.meta_path.insert(0, _Hide(names))
        real_find_spec = importlib.util.find_spec

        def find_spec(name, package=None):
            if name.split(".")[0] in names:
                return None
            return real_find_spec(name, package)

        importlib.util.find_spec = find_spec


def _load(name: str):
    """(reader, hello message) for one reader; the reader is None when it is skipped."""
    from .readers import Skip, make_reader

    reader = make_reader(name)
    t0 = perf_counter()
    try:
        version = reader.load()
    except Skip as exc:
        return None, {"skip": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        return None, {"skip": f"failed to load: {type(exc).__name__}: {exc}"}
    return reader, {
        "ready": True,
        "version": version,
        "label": reader.label,
        "import_seconds": perf_counter() - t0,
        "notes": reader.notes() if hasattr(reader, "notes") else {},
        "package_dir": os.path.realpath(sys.modules["atlas_fast"].__path__[0]),
    }


def main(argv) -> int:
    """Serve the readers named in ``argv`` (one process may host related readers)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library output on stdout would corrupt the protocol: send it to the log
    sys.stdout = sys.stderr

    def send(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    _hide_packages()
    from . import measure
    from .readers import Skip

    readers = {}
    hello = {}
    for name in argv:
        readers[name], hello[name] = _load(name)
    send({"readers": hello})

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            break
        reader = readers.get(req.get("reader"))
        try:
            if reader is None:
                send({"error": f"reader {req.get('reader')!r} is not served here"})
            elif op == "prepare":
                t = perf_counter()
                info = reader.prepare(req["target"])
                build_seconds = perf_counter() - t
                if req.get("checks"):
                    measure.check_examples(reader, req["target"], req["checks"], req["corpus"])
                # Warm up (first touch of files, lazy set-up) outside any timing.
                measure.run_patterns(reader, req["target"], req["patterns"], 0.01, 0)
                send({"ok": True, "info": info, "build_seconds": build_seconds})
            elif op == "measure":
                res = measure.run_patterns(
                    reader, req["target"], req["patterns"], req["budget"], req["seed"]
                )
                send({"ok": True, "results": res})
            else:
                send({"error": f"unknown op {op!r}"})
        except Skip as exc:
            send({"skip": str(exc)})
        except Exception as exc:
            traceback.print_exc()
            send({"error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":  # a guard LitData needs: it starts worker processes
    sys.exit(main(sys.argv[1:]))
