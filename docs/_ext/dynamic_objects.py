"""A griffe extension for the API reference: objects atlas_fast builds at run time.

The reader classes are made by ``atlas_fast.atlas._reader_classes`` over the backend's core,
the samplers by ``atlas_fast._compat.torch_subclass`` (both on first lookup, through their
module's ``__getattr__``), and the ``convert_<format>`` functions by
``atlas_fast.convert._for_format``: static analysis sees only assignments, or nothing. This
extension replaces each listed name by what the imported module holds (griffe's dynamic
analysis), and loads the compiled modules their bases come from, so that inherited methods
(``__getitem__``, ``cache_info``, ...) are documented too.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import griffe

# The source checkout this file belongs to (docs/_ext/ is two levels below it).
_CHECKOUT = Path(__file__).resolve().parents[2]
# "ShardCore.cache_info(self)": the signature Cython embeds as a docstring's first line.
_EMBEDDED_SIGNATURE = re.compile(r"^\w+(\.\w+)*\(.*\)(\s*->\s*.+)?$")


class DynamicObjects(griffe.Extension):
    """Replace the listed objects (dotted paths) by their runtime versions."""

    def __init__(self, paths: list) -> None:
        super().__init__()
        self.paths = list(paths)
        # Imported now, from this checkout, with the interpreter's own sys.path besides:
        # griffe's loader may later inspect a compiled module with only its search paths on
        # sys.path, where importing the package for the first time would fail. And the live
        # objects must be this checkout's, not those of another installed copy.
        if str(_CHECKOUT) not in sys.path:
            sys.path.insert(0, str(_CHECKOUT))
        for root in {p.split(".")[0] for p in self.paths}:
            module = importlib.import_module(root)
            where = Path(module.__file__).resolve()
            if _CHECKOUT not in where.parents:
                raise griffe.ExtensionError(
                    f"{root} was imported from {where}, not from this checkout ({_CHECKOUT}): "
                    "build the documentation in a fresh process from the checkout"
                )

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        import_paths = [*loader.finder.search_paths, *sys.path]
        for path in self.paths:
            module_path, name = path.rsplit(".", 1)
            if module_path.split(".")[0] != pkg.path:
                continue
            getattr(importlib.import_module(module_path), name)  # made now if made lazily
            live = self._inspect(module_path, loader, import_paths)
            obj = live[name]
            loader.modules_collection[module_path].set_member(name, obj)
            for base in getattr(obj, "bases", ()):
                self._load_module_of(str(base), pkg, loader, import_paths)
        for module in loader.modules_collection.members.values():
            _strip_embedded_signatures(module)

    def _inspect(self, module_path: str, loader, import_paths) -> griffe.Module:
        return griffe.inspect(
            module_path,
            import_paths=import_paths,
            docstring_parser=loader.docstring_parser,
            docstring_options=loader.docstring_options,
        )

    def _load_module_of(self, dotted: str, pkg, loader, import_paths) -> None:
        """Load (by inspection) the module ``dotted`` lives in, when the static analysis
        could not: an extension module of the package."""
        module_path = dotted.rsplit(".", 1)[0]
        if not module_path.startswith(pkg.path + ".") or module_path in loader.modules_collection:
            return
        parent_path, name = module_path.rsplit(".", 1)
        try:
            parent = loader.modules_collection[parent_path]
        except KeyError:
            return
        if name in parent.members and not parent.members[name].is_alias:
            return
        module = self._inspect(module_path, loader, import_paths)
        parent.set_member(name, module)


def _strip_embedded_signatures(obj) -> None:
    """Drop the signature line Cython puts first in its methods' docstrings (the reference
    shows the signature already)."""
    seen = set()

    def walk(node) -> None:
        if id(node) in seen or node.is_alias:
            return
        seen.add(id(node))
        doc = node.docstring
        if doc is not None:
            first, _, rest = doc.value.partition("\n")
            if _EMBEDDED_SIGNATURE.match(first.strip()):
                doc.value = rest.strip()
        for member in node.members.values():
            walk(member)

    walk(obj)
