"""Unpickling blocks of untrusted datasets: plain data only.

``pickle`` runs code: a block can name any importable callable (``os.system``, ...) and have
it called while loading. ``trusted=False`` readers unpickle with ``SafeUnpickler`` instead,
whose ``find_class`` (the one door through which CPython's unpickler reaches a global: the
GLOBAL, STACK_GLOBAL, INST, OBJ, NEWOBJ and EXT opcodes all pass through it) admits only:

- builtin scalars and containers: ``int float bool complex str bytes bytearray list tuple dict
  set frozenset``, ``range``, ``slice``, ``Ellipsis``;
- the standard library's plain value types: ``collections.OrderedDict``, ``deque``,
  ``Counter`` and ``defaultdict`` (its factory must itself be admitted), ``decimal.Decimal``,
  ``fractions.Fraction`` (from integers, or the "n/d" text it pickles as: no exponents, so
  ``"1e999999999"`` cannot ask for a huge integer), ``uuid.UUID``, the ``ipaddress``
  addresses, networks and interfaces, the ``pathlib`` paths (``PurePosixPath``,
  ``PureWindowsPath``, ``PosixPath``, ``WindowsPath``: values, nothing is opened),
  ``array.array`` and ``types.SimpleNamespace``;
- the ``datetime`` types (``date time datetime timedelta timezone``);
- numpy arrays, dtypes and scalars: the exact globals numpy 1.x and 2.x pickles reference;
- the globals the caller lists in ``allowed_globals`` ("module.qualname" strings, or the
  objects themselves).

Anything else raises ``UnsafePickleError`` naming the global, before it is imported (a
method or attribute of an admitted class, ``pathlib.PosixPath.touch`` say, is another name and
refused too). Persistent IDs are refused too. The callables admitted for their constructors
cannot allocate without limit from a small pickle (``bytes(10**12)`` is refused) nor reach
other code: their arguments are themselves pickled plain data. Where a type pickles through a
helper (``array._array_reconstructor``; ``copyreg._reconstructor`` for a ``uuid.UUID`` in
protocols 0 and 1) the helper is admitted only for that type.
"""

from __future__ import annotations

import _compat_pickle
import array
import builtins
import collections
import datetime
import decimal
import fractions
import importlib
import io
import ipaddress
import pathlib
import pickle
import re
import types
import uuid

from ._errors import UnsafePickleError

__all__ = ["SafeUnpickler", "make_loads", "DEFAULT_ALLOWED"]


def _bytes(*args):
    """``bytes`` for pickles: never ``bytes(n)``, which allocates ``n`` bytes."""
    if args and isinstance(args[0], int):
        raise UnsafePickleError("refusing bytes(<int>) in an untrusted pickle")
    return bytes(*args)


def _bytearray(*args):
    """``bytearray`` for pickles: never ``bytearray(n)``, which allocates ``n`` bytes."""
    if args and isinstance(args[0], int):
        raise UnsafePickleError("refusing bytearray(<int>) in an untrusted pickle")
    return bytearray(*args)


def _codecs_encode(obj, encoding="utf-8", errors="strict"):
    """``_codecs.encode`` as protocol 0-2 pickles of ``bytes`` use it: latin-1 text only."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(
            f"refusing _codecs.encode with {type(obj).__name__}, {encoding!r} in an untrusted "
            "pickle (only latin1 text, as pickle writes bytes)"
        )
    return obj.encode("latin1", errors)


# What ``str(Fraction)`` gives, and so what a pickled Fraction holds: an exponent or a decimal
# point ("1e999999999") would have Fraction build a huge integer from a few bytes.
_FRACTION_TEXT = re.compile(r"\s*[+-]?\d+(?:/\d+)?\s*", re.ASCII)


def _fraction(*args):
    """``fractions.Fraction`` for pickles: text only in the form it pickles as ("n" or "n/d")."""
    if args and isinstance(args[0], str) and not _FRACTION_TEXT.fullmatch(args[0]):
        raise UnsafePickleError(
            f"refusing Fraction({args[0]!r:.40}) in an untrusted pickle (only 'n' or 'n/d' text, "
            "as a Fraction pickles)"
        )
    return fractions.Fraction(*args)


def _array_reconstructor(cls, *args):
    """``array._array_reconstructor`` for pickles: of ``array.array`` itself only."""
    if cls is not array.array:
        raise UnsafePickleError(
            f"refusing array._array_reconstructor of {cls!r:.60} in an untrusted pickle"
        )
    return array._array_reconstructor(cls, *args)


# Types that protocols 0 and 1 pickle through copyreg._reconstructor (object.__reduce_ex__).
_RECONSTRUCTED = (uuid.UUID,)


def _reconstructor(cls, base, state):
    """``copyreg._reconstructor`` for pickles: a bare instance of an admitted value type, whose
    state the pickle then sets."""
    if cls not in _RECONSTRUCTED or base is not object or state is not None:
        raise UnsafePickleError(
            f"refusing copyreg._reconstructor({cls!r:.60}, {base!r:.40}, ...) in an untrusted "
            "pickle"
        )
    return object.__new__(cls)


def _builtin(name):
    return lambda: getattr(builtins, name)


def _attr(module, name):
    return lambda: getattr(importlib.import_module(module), name)


def _numpy(name, *modules):
    """A numpy global, looked up in the first of ``modules`` that has it.

    numpy 2 moved ``numpy.core`` to ``numpy._core`` and keeps a shim that warns on use: a
    pickle written under either major version names one of them, and both resolve to the
    object the installed numpy has, without touching the shim.
    """

    def resolve():
        for module in modules:
            try:
                return getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
        raise UnsafePickleError(f"numpy global {name!r} is not available in this numpy")

    return resolve


_NP_MULTIARRAY = ("numpy._core.multiarray", "numpy.core.multiarray")
_NP_NUMERIC = ("numpy._core.numeric", "numpy.core.numeric")

# "module.qualname" -> a function returning the object. Resolved lazily: numpy is imported only
# when a pickle refers to it.
DEFAULT_ALLOWED: dict = {
    **{
        f"builtins.{name}": _builtin(name)
        for name in (
            "int",
            "float",
            "bool",
            "complex",
            "str",
            "list",
            "tuple",
            "dict",
            "set",
            "frozenset",
            "slice",
            "Ellipsis",
            "range",
        )
    },
    "builtins.bytes": lambda: _bytes,
    "builtins.bytearray": lambda: _bytearray,
    "_codecs.encode": lambda: _codecs_encode,
    **{
        f"collections.{name}": lambda name=name: getattr(collections, name)
        for name in ("OrderedDict", "deque", "Counter", "defaultdict")
    },
    "decimal.Decimal": lambda: decimal.Decimal,
    "fractions.Fraction": lambda: _fraction,
    "uuid.UUID": lambda: uuid.UUID,
    "copyreg._reconstructor": lambda: _reconstructor,
    "builtins.object": lambda: object,  # _reconstructor's base
    **{
        f"ipaddress.{name}": lambda name=name: getattr(ipaddress, name)
        for name in (
            "IPv4Address",
            "IPv6Address",
            "IPv4Network",
            "IPv6Network",
            "IPv4Interface",
            "IPv6Interface",
        )
    },
    **{
        f"pathlib.{name}": lambda name=name: getattr(pathlib, name)
        for name in ("PurePosixPath", "PureWindowsPath", "PosixPath", "WindowsPath")
    },
    "array.array": lambda: array.array,
    "array._array_reconstructor": lambda: _array_reconstructor,
    "types.SimpleNamespace": lambda: types.SimpleNamespace,
    **{
        f"datetime.{name}": lambda name=name: getattr(datetime, name)
        for name in ("date", "time", "datetime", "timedelta", "timezone")
    },
    "numpy.ndarray": _numpy("ndarray", "numpy"),
    "numpy.dtype": _numpy("dtype", "numpy"),
}
for _module in _NP_MULTIARRAY:
    DEFAULT_ALLOWED[f"{_module}._reconstruct"] = _numpy("_reconstruct", *_NP_MULTIARRAY)
    DEFAULT_ALLOWED[f"{_module}.scalar"] = _numpy("scalar", *_NP_MULTIARRAY)
for _module in _NP_NUMERIC:
    DEFAULT_ALLOWED[f"{_module}._frombuffer"] = _numpy("_frombuffer", *_NP_NUMERIC)
# numpy pickles scalars' and dtypes' types as numpy.dtypes.Float64DType etc. only in new
# protocols of numpy 2; those reach numpy.dtype via the entries above.
del _module


def _qualified_name(item) -> str:
    if isinstance(item, str):
        if "." not in item:
            raise ValueError(f"allowed_globals entries must be 'module.qualname', not {item!r}")
        return item
    module = getattr(item, "__module__", None)
    qualname = getattr(item, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(
            f"allowed_globals entries must be 'module.qualname' strings or classes/functions "
            f"with __module__ and __qualname__, not {item!r}"
        )
    return f"{module}.{qualname}"


def _allowed_table(allowed_globals) -> dict:
    if isinstance(allowed_globals, str):
        allowed_globals = (allowed_globals,)
    table = dict(DEFAULT_ALLOWED)
    for item in allowed_globals:
        name = _qualified_name(item)
        table[name] = None if isinstance(item, str) else (lambda item=item: item)
    return table


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that loads plain data and the globals of ``allowed``, nothing else.

    ``allowed`` maps "module.qualname" to a function returning the object, or to None to
    import it the ordinary way (a name the user listed).
    """

    def __init__(self, file, allowed: dict) -> None:
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module, name):
        key = f"{module}.{name}"
        if key not in self._allowed:
            # Protocol 0-2 pickles name Python 2 modules (__builtin__.set, ...).
            mapped = _compat_pickle.NAME_MAPPING.get((module, name))
            if mapped is None and module in _compat_pickle.IMPORT_MAPPING:
                mapped = (_compat_pickle.IMPORT_MAPPING[module], name)
            if mapped is None or f"{mapped[0]}.{mapped[1]}" not in self._allowed:
                raise UnsafePickleError(
                    f"refusing to unpickle global {key}: not allowed in an untrusted dataset "
                    "(pass it in allowed_globals if you trust it)"
                )
            module, name = mapped
            key = f"{module}.{name}"
        resolve = self._allowed[key]
        if resolve is None:
            return super().find_class(module, name)
        return resolve()

    def persistent_load(self, pid):
        raise UnsafePickleError(
            f"refusing persistent id {pid!r:.80}: not allowed in an untrusted dataset"
        )


def make_loads(allowed_globals=()):
    """A ``loads(data)`` that unpickles plain data plus ``allowed_globals`` (see module doc)."""
    allowed = _allowed_table(allowed_globals)

    def loads(data):
        return SafeUnpickler(io.BytesIO(data), allowed).load()

    loads.allowed_globals = tuple(sorted(k for k, v in allowed.items() if v is None))
    return loads
