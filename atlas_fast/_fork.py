"""One registry of what each module resets in a forked child.

A forked child (a DataLoader worker under the fork start method) has a copy of the parent's
memory but none of its threads: a lock one of them held stays held, a pool's threads are gone,
a client's event loop is dead. Each module that owns such state registers a function here;
they run in registration order (import order: lower modules first) in the child, right after
fork, through one ``os.register_at_fork`` handler. docs/design.md lists them all.

What must be settled before a fork (a request in flight whose answer the children need) is
registered with ``before_fork``: run in the forking process, in the forking thread.

``started_result``: how a thread takes what a pool's thread was doing ahead for it (a block
decoded or fetched ahead) without waiting on work that has not started.
"""

from __future__ import annotations

import os

__all__ = ["after_fork_in_child", "before_fork", "handlers", "started_result"]

_handlers: list = []
_before: list = []


def after_fork_in_child(fn):
    """Run ``fn()`` in every forked child of this process; returns ``fn``."""
    _handlers.append(fn)
    return fn


def before_fork(fn):
    """Run ``fn()`` in this process right before each fork (its errors are ignored: the
    child meets them again); returns ``fn``."""
    _before.append(fn)
    return fn


def handlers() -> tuple:
    """The registered functions, in the order they run."""
    return tuple(_handlers)


def _run_in_child() -> None:
    for fn in _handlers:
        fn()


def _run_before() -> None:
    for fn in _before:
        try:
            fn()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_run_before, after_in_child=_run_in_child)


def started_result(future):
    """What ``future`` (work submitted to a thread pool) gave, waiting for it if it has
    started; None when there is no future, when it had not started (it is cancelled: the
    caller may itself be a pool thread, and the pool's other threads may all be waiting
    likewise, so never wait on work not started) or when it failed (the caller does the work
    itself, and raises its error with context)."""
    if future is None or future.cancel():
        return None
    try:
        return future.result()
    except Exception:
        return None
