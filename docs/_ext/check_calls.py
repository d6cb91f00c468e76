"""An MkDocs hook: the keyword arguments the prose names must exist.

Guides write calls inline, as `` `AtlasDataset(root, cache_bytes=N)` ``. For every such span
whose callable is a public name of atlas_fast (the package, ``atlas_fast.convert`` and
``atlas_fast.ray``), each ``name=`` in it must be a parameter of that callable: a renamed or
removed argument is a warning, which ``mkdocs build --strict`` turns into a failed build.
(Code blocks are not checked here: tests/test_docs.py runs them.) ``problems(text)`` is the
check itself, also applied to README.md by the tests.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import sys
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.atlas_fast.check_calls")

_FENCED = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
# A code span may run over a line break, not over a blank line.
_SPAN = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")
_CALL = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*)\((.*)\)$", re.S)
_KEYWORD = re.compile(r"(?:^|[,(]\s*)([A-Za-z_]\w*)\s*=(?!=)")

_MODULES = ("atlas_fast", "atlas_fast.convert", "atlas_fast.ray")
# The source checkout this file belongs to (docs/_ext/ is two levels below it): the package
# checked is this checkout's, not another installed copy.
_CHECKOUT = Path(__file__).resolve().parents[2]


def public_callables() -> dict:
    """Name -> callable, for the public names of the documented modules."""
    if "atlas_fast" not in sys.modules and str(_CHECKOUT) not in sys.path:
        sys.path.insert(0, str(_CHECKOUT))
    found: dict = {}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            try:
                obj = getattr(module, name)
            except Exception:  # an integration whose extra is not installed
                continue
            if callable(obj):
                found.setdefault(name, obj)
    return found


def _accepts(obj, keyword: str) -> bool | None:
    """Whether ``obj`` takes ``keyword``; None when its signature cannot be read."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return True
    return any(
        p.name == keyword and p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in parameters
    )


def problems(text: str, callables: dict | None = None) -> list:
    """What is wrong with the inline calls of ``text`` (Markdown): one message each."""
    callables = public_callables() if callables is None else callables
    found = []
    for span in _SPAN.findall(_FENCED.sub("", text)):
        span = " ".join(span.split())
        call = _CALL.match(span)
        if call is None or call.group(1) not in callables:
            continue
        name, arguments = call.groups()
        for keyword in _KEYWORD.findall("(" + arguments):
            if _accepts(callables[name], keyword) is False:
                found.append(f"`{span}`: {name}() has no parameter {keyword!r}")
    return found


_callables: dict = {}


def on_page_markdown(markdown, page, config, files):
    if not _callables:
        _callables.update(public_callables())
    for problem in problems(markdown, _callables):
        log.warning(f"{page.file.src_path}: {problem}")
    return markdown
