"""The processes of a conversion: the calling one (worker 0) and ``n - 1`` others.

A task is ``(function, job)``: ``function(job, worker)`` runs in worker k's process, given a
``Worker`` that says what it may use there (how to report progress, the claim table the
processes share, how to tell that another one died). Everything a worker needs comes with its
task, its ``Worker`` or its process's name (see ``_compat.NO_TORCH_PROCESS_PREFIX``): nothing
is set in module globals or in ``os.environ``.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from .._compat import NO_TORCH_PROCESS_PREFIX
from ._claims import Claims
from ._source import SourceError
from ._stream import GATE_SLOTS, Gate
from ._verify import VerifyError

__all__ = ["Serial", "Worker", "Workers", "start_method", "start_processes"]


@dataclass(frozen=True)
class Worker:
    """What a task function gets beside its job, in the process that runs it."""

    number: int  # 0: the calling process
    emit: Callable[[int, int], None]  # progress: (examples, nbytes) increments
    table: object = None  # the claim table the processes share (see Claims), or None
    # What to say of another process that has ended unexpectedly, or None while all run.
    watch: Callable[[], str | None] | None = None
    # A conversion to a URL: tells the converting process what the task did (see
    # ``_stream``), and the staging bytes' gate its runs wait at (a ``_stream.Gate``).
    event: Callable[[tuple], None] | None = None
    gate: object = None


def _portable(exc: BaseException, k: int) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its traceback."""
    if isinstance(exc, (SourceError, VerifyError)):
        return exc
    try:
        pickle.loads(pickle.dumps(exc))
        if isinstance(exc, (OSError, ValueError, AssertionError)):
            return exc
    except Exception:
        pass
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RuntimeError(f"worker process {k} failed: {type(exc).__name__}: {exc}\n{text}")


def child(k: int, inbox, results, table, gate) -> None:
    """Worker process ``k``: runs ``(function, job)`` tasks until it gets None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt does
    parent = os.getppid()

    def emit(examples, nbytes):
        results.put(("progress", k, (examples, nbytes)))

    def watch():
        return None if os.getppid() == parent else "the parent process died"

    def event(payload):
        results.put(("event", k, payload))

    worker = Worker(k, emit, table, watch, event, Gate(gate))
    while (task := inbox.get()) is not None:
        function, job = task
        try:
            results.put(("done", k, function(job, worker)))
        except BaseException as exc:
            results.put(("error", k, _portable(exc, k)))


def start_method() -> str:
    """ "fork" where it is safe and available: Linux, and no other thread in this process (a
    forked child inherits no thread, so a lock another thread held would stay held); it
    starts a worker in milliseconds with every module already imported, where "spawn"
    starts a new interpreter that imports atlas_fast, zstandard and the format's readers
    (a few tenths of a second of a conversion that may last one second).
    ``ATLAS_FAST_CONVERT_START`` (fork, spawn or forkserver) overrides the choice."""
    import multiprocessing

    chosen = os.environ.get("ATLAS_FAST_CONVERT_START", "").strip()
    methods = multiprocessing.get_all_start_methods()
    if chosen:
        if chosen not in methods:
            raise ValueError(
                f"ATLAS_FAST_CONVERT_START={chosen!r}: not a start method here "
                f"({', '.join(methods)})"
            )
        return chosen
    if sys.platform == "linux" and "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "spawn"


def start_processes(processes: list, method: str) -> None:
    """Start ``processes`` (made by the context of ``method``, ``start_method``'s choice)."""
    if method != "fork":
        for p in processes:
            p.start()
        return
    # Started by fork (no other Python thread runs: ``start_method``).
    # A forked child shares this process's memory until it writes to it; its garbage
    # collector would touch every object the parent holds (copying their pages), so they
    # are moved out of its reach first (gc.freeze), and given back to ours after.
    import gc

    # An application's own freeze (before its DataLoader workers, say) is left alone.
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns on any fork of a process with native threads (numpy's
            # BLAS and pyarrow's pools are started on import or first use). Those pools
            # re-create themselves in a forked child, and the workers take no lock of
            # ours that another thread could hold: start_method forks only when no
            # other Python thread runs.
            warnings.simplefilter("ignore", DeprecationWarning)
            for p in processes:
                p.start()
    finally:
        if frozen:
            gc.unfreeze()


class Workers:
    """``n - 1`` worker processes; the calling process is worker 0. ``cores``: the cores the
    conversion uses in total (``workers``), shared out among its runs (``_run``)."""

    def __init__(self, n: int, cores: int):
        import multiprocessing

        self.cores = cores
        self._spill_root = None
        method = start_method()
        ctx = multiprocessing.get_context(method)
        self.results = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n - 1)]
        self.claims = ctx.Array("q", len(Claims.layout([(0, 0)] * n)))
        self.gate = Gate(ctx.Array("q", GATE_SLOTS))
        self.on_event = None
        # Workers only write and compare examples: named so, a spawned one imports atlas_fast
        # without torch (see _compat).
        self.processes = [
            ctx.Process(
                target=child,
                args=(k, inbox, self.results, self.claims, self.gate.array),
                name=f"{NO_TORCH_PROCESS_PREFIX}convert-{k}",
                daemon=True,
            )
            for k, inbox in enumerate(self.inboxes, 1)
        ]
        start_processes(self.processes, method)

    def run(self, tasks: list, on_progress, claims=(), on_event=None) -> list:
        """Run ``tasks[k]`` (``(function, job)`` or None) on worker k; their results.
        ``claims``: the ``(start, stop)`` ranges of parts each run starts with;
        ``on_event(k, event)``: what is told of the tasks' events (see ``Worker``)."""
        self.on_event = on_event
        table = Claims.layout(claims)
        self.claims[: len(table)] = table
        results = [None] * len(tasks)
        pending = set()
        for k, task in enumerate(tasks[1:], 1):
            if task is not None:
                self.inboxes[k - 1].put(task)
                pending.add(k)

        def emit(examples, nbytes):
            on_progress(examples, nbytes)
            self._receive(results, pending, on_progress, timeout=None)

        if tasks[0] is not None:
            function, job = tasks[0]
            event = None if on_event is None else (lambda payload: on_event(0, payload))
            worker = Worker(0, emit, self.claims, self._dead_worker, event, self.gate)
            results[0] = function(job, worker)
        while pending:
            self._receive(results, pending, on_progress, timeout=0.2)
        return results

    def _dead_worker(self):
        """What to say of a worker process that has ended, or None while all run."""
        for k, p in enumerate(self.processes, 1):
            if not p.is_alive():
                return f"worker process {k} ended unexpectedly (exit code {p.exitcode})"
        return None

    def _receive(self, results, pending, on_progress, timeout) -> None:
        while pending:
            try:
                if timeout is None:
                    kind, k, payload = self.results.get_nowait()
                else:
                    kind, k, payload = self.results.get(timeout=timeout)
            except queue.Empty:
                for k in sorted(pending):
                    p = self.processes[k - 1]
                    if not p.is_alive():
                        raise RuntimeError(
                            f"worker process {k} ended unexpectedly (exit code {p.exitcode}; "
                            "a script that converts with workers > 1 needs its work under "
                            "`if __name__ == '__main__':`, as spawned processes import it)"
                        ) from None
                return
            if kind == "progress":
                on_progress(*payload)
            elif kind == "event":
                self.on_event(k, payload)
            elif kind == "done":
                results[k] = payload
                pending.discard(k)
            else:
                raise payload

    def spill_dir(self, name: str) -> str:
        """A new directory for the blocks runs spill (``_spill``), removed with the pool
        (once its processes have ended): in the temporary directory (``TMPDIR``), local
        space rather than the destination's file system, which may be a network one; spilled
        blocks live about as long as the dictionary's training."""
        if self._spill_root is None:
            self._spill_root = tempfile.mkdtemp(prefix="atlas-fast-convert-spill-")
        path = os.path.join(self._spill_root, name)
        os.mkdir(path)
        return path

    def close(self, *, kill: bool) -> None:
        try:
            self._close(kill=kill)
        finally:
            if self._spill_root is not None:
                shutil.rmtree(self._spill_root, ignore_errors=True)

    def _close(self, *, kill: bool) -> None:
        for inbox, p in zip(self.inboxes, self.processes):
            if kill:
                p.terminate()
            elif p.is_alive():
                inbox.put(None)
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.results, *self.inboxes):
            q.close()
            q.cancel_join_thread()


class Serial:
    """The calling process alone, on ``cores`` cores: its shard writers' compression threads
    (a source of one part with ``workers`` > 1)."""

    processes = ()  # no other process

    def __init__(self, cores: int):
        import multiprocessing

        self.cores = cores
        self.gate = Gate(multiprocessing.Array("q", GATE_SLOTS))

    def run(self, tasks: list, on_progress, claims=(), on_event=None) -> list:
        function, job = tasks[0]
        event = None if on_event is None else (lambda payload: on_event(0, payload))
        return [function(job, Worker(0, on_progress, event=event, gate=self.gate))]

    def close(self, *, kill: bool) -> None:
        pass
