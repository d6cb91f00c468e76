"""Optional integration with PyTorch, which atlas_fast never requires.

``import atlas_fast`` does not import torch (seconds of start-up that the command line, the
writers and the converters have no use for). The classes that subclass torch's (the readers
subclass ``torch.utils.data.Dataset``, the samplers ``Sampler``) are made on their first
lookup, ``atlas_fast.AtlasDataset`` or ``from atlas_fast import AtlasDataset``, through a
module ``__getattr__`` (``lazy_classes``): that lookup imports torch when it is installed, so
``isinstance(ds, torch.utils.data.Dataset)`` holds as it did with the reference, and a
subclass of ``atlas_fast.AtlasDataset`` is a torch ``Dataset`` too.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import threading

__all__ = [
    "NO_TORCH_PROCESS_PREFIX",
    "freeze_in_worker",
    "lazy_classes",
    "torch_data_bases",
    "torch_installed",
    "torch_subclass",
    "without_torch",
]

# Set by ``without_torch()``: this process makes its classes without torch's bases.
_WITHOUT_TORCH = False

# A multiprocessing process whose name starts with this imports atlas_fast without torch:
# the worker processes that only write or compare examples (``atlas-fast convert
# --workers``) are named so, to start without torch's seconds of import time. A spawned
# process gets its name before it imports anything (multiprocessing's ``spawn.prepare`` sets
# it before re-running the parent's main script), so nothing has to be set in the
# environment, which every other thread of the parent would see.
NO_TORCH_PROCESS_PREFIX = "atlas-fast-no-torch:"


def torch_installed() -> bool:
    """Whether torch can be imported (without importing it), and is wanted: not when
    ``ATLAS_FAST_NO_TORCH=1``, nor in a process named with ``NO_TORCH_PROCESS_PREFIX``, nor
    after ``without_torch()``."""
    if _WITHOUT_TORCH or os.environ.get("ATLAS_FAST_NO_TORCH") == "1" or _named_without_torch():
        return False
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # sys.modules["torch"] = None blocks it on purpose
        return False


def without_torch() -> None:
    """This process has no use for torch (the ``atlas-fast`` command): the classes it has
    not looked up yet are made without torch's bases, and torch is never imported for them.
    Only the process itself: its children (``atlas-fast bench``'s workers) decide for
    themselves."""
    global _WITHOUT_TORCH
    _WITHOUT_TORCH = True


def _named_without_torch() -> bool:
    process = sys.modules.get("multiprocessing.process")  # not imported: not a worker
    if process is None:
        return False
    return process.current_process().name.startswith(NO_TORCH_PROCESS_PREFIX)


def torch_data_bases(name: str) -> tuple:
    """``(torch.utils.data.<name>,)`` when torch is installed, else ``()``.

    Readers subclass ``Dataset`` so ``isinstance(ds, torch.utils.data.Dataset)`` holds, as it
    did with the reference; the samplers subclass ``Sampler``. torch is imported only when it
    is installed (``torch_installed``).
    """
    if not torch_installed():
        return ()
    try:
        base = getattr(importlib.import_module("torch.utils.data"), name)
    except Exception:  # a broken torch install must not break reading
        return ()
    return (base,)


def torch_subclass(body: type, torch_base: str, module: str, name: str) -> type:
    """The public class ``module.name``: ``body`` (which holds every method and the
    docstring) over ``torch.utils.data.<torch_base>`` when torch is installed and wanted."""
    namespace = {"__module__": module, "__qualname__": name, "__doc__": body.__doc__}
    return type(name, (body, *torch_data_bases(torch_base)), namespace)


# One lock for every module's lazy classes: making one may look another up (a reader's
# module imports the sampler's), so it is reentrant.
_LAZY_LOCK = threading.RLock()


def lazy_classes(namespace: dict, makers: dict) -> tuple:
    """``(__getattr__, __dir__)`` for a module whose names in ``makers`` are made on first
    lookup: ``makers[name]()`` returns a dict of the names it made (several at once), which
    become ordinary globals of the module (so later lookups, pickling by name and patching
    work as for any class), once, whichever thread looks first."""
    module = namespace["__name__"]

    def __getattr__(name: str):
        make = makers.get(name)
        if make is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        with _LAZY_LOCK:
            if name not in namespace:
                namespace.update(make())
        return namespace[name]

    def __dir__() -> list:
        return sorted({*namespace, *makers})

    return __getattr__, __dir__


def freeze_in_worker() -> bool:
    """In a torch DataLoader worker, ``gc.freeze()``: called by each core at the first block it
    decodes in a process (and again in a forked child). Returns whether it froze.

    A forked worker inherits its parent's whole heap (torch's modules alone hold hundreds of
    thousands of objects). CPython's full collections, which decoding examples triggers, visit
    every one of those objects: each costs as much as decoding a hundred blocks, and writes to
    the objects' headers copy the parent's pages into the worker (its PSS grows). Frozen, the
    inherited objects are left alone; what the worker allocates afterwards is collected as
    usual. A spawned worker freezes what it imported. ``ATLAS_FAST_WORKER_GC_FREEZE=0`` turns
    this off; an application that manages its workers' collector itself can set it.
    """
    if os.environ.get("ATLAS_FAST_WORKER_GC_FREEZE", "1") == "0":
        return False
    data = sys.modules.get("torch.utils.data")
    if data is None:  # torch not imported: not a DataLoader worker
        return False
    try:
        in_worker = data.get_worker_info() is not None
    except Exception:  # a torch without it, or broken: not ours to judge
        return False
    if in_worker:
        gc.freeze()
    return in_worker
