"""Errors met while writing keep their type; the writers add where they happened.

An error raised while writing a shard is raised as it is: the same object, of the same type,
with its own message and attributes (an ``OSError`` keeps its errno). What the writers know
about where it happened (the shard directory, the block) is added to it as a note
(``add_note``: shown under its message in the traceback; on Python 3.10, which has no
``add_note``, the note is kept in ``__notes__`` all the same) and as an attribute saying
which directory it names, so that it is never given that context twice, whichever thread
raised it. An ``OSError`` that names no file (a failed write or flush) is made to name the
file it was writing. Whether an error names a directory is told by those attributes, never
by its message.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

__all__ = ["add_context", "describe", "name_file", "names", "note", "writing"]

# The attribute by which an error the writers gave context to says which directory it names.
_WHERE = "_atlas_fast_where"


def note(exc: BaseException, text: str) -> None:
    """Add ``text`` to what the traceback of ``exc`` shows (its ``__notes__``)."""
    try:
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(text)
        else:  # Python 3.10: PEP 678's attribute, without the method
            notes = getattr(exc, "__notes__", None)
            if not isinstance(notes, list):
                notes = []
                exc.__notes__ = notes
            notes.append(text)
    except Exception:  # an exception that refuses attributes still raises as it is
        pass


def add_context(exc: BaseException, text: str, where) -> BaseException:
    """``exc`` itself, its note saying ``text`` (which names the directory ``where``), and
    marked as naming ``where``: unless it names ``where`` already (``names``)."""
    if not names(exc, where):
        note(exc, f"atlas_fast: {text}")
        try:
            setattr(exc, _WHERE, os.fspath(where))
        except Exception:
            pass
    return exc


def names(exc: BaseException, directory) -> bool:
    """Whether ``exc`` names ``directory`` or a file in it already: as ``add_context``
    marked it, or as the file of an ``OSError``. The message text is not looked at."""
    places = [getattr(exc, _WHERE, None)]
    if isinstance(exc, OSError):
        places += [exc.filename, exc.filename2]
    top = os.path.abspath(directory)
    for place in places:
        if isinstance(place, (str, bytes, os.PathLike)):
            place = os.path.abspath(os.fsdecode(place))
            if place == top or place.startswith(top.rstrip(os.sep) + os.sep):
                return True
    return False


def name_file(exc: OSError, path) -> OSError:
    """``exc`` itself, made to name the file ``path`` when it names none and has an errno
    (as a failed write or flush has): its message then ends with the file, as open()'s do."""
    if exc.filename is None and exc.errno is not None and exc.strerror is not None:
        try:
            exc.filename = os.fspath(path)
        except Exception:
            pass
    return exc


@contextmanager
def writing(path):
    """An ``OSError`` raised within names the file ``path``: as its file (``name_file``)
    when it names none and has an errno, else in a note."""
    try:
        yield
    except OSError as exc:
        name_file(exc, path)
        add_context(exc, f"writing {path}", path)
        raise


def describe(exc: BaseException) -> str:
    """``exc`` in one line for a warning: its type, message and the writers' notes."""
    text = f"{type(exc).__name__}: {exc}"
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        ours = [n[len("atlas_fast: ") :] for n in notes if str(n).startswith("atlas_fast: ")]
        if ours:
            text += f" ({'; '.join(ours)})"
    return text
