"""Argument checks shared by the writer's options, the sampler and the readers' cache limits.

One wording for one rule (``"block_size must be a positive integer, not 0"``), one type for
one kind of problem: ``InvalidArgumentError`` for a value out of range,
``InvalidArgumentTypeError`` (a ``TypeError`` too) for a value of the wrong type. Both are
``ValueError`` and ``AssertionError`` (see ``_errors``).
"""

from __future__ import annotations

import numbers
import operator
import reprlib
from collections.abc import Mapping

from ._errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["check_fraction", "check_int", "check_state", "shown"]

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def shown(value) -> str:
    """``value`` as an error message quotes it: its repr, shortened."""
    return _repr.repr(value)


def _int_rule(minimum, maximum, none: bool) -> str:
    if minimum == 1 and maximum is None:
        rule = "a positive integer"
    elif minimum == 0 and maximum is None:
        rule = "a non-negative integer"
    elif minimum is None and maximum is None:
        rule = "an integer"
    elif maximum is None:
        rule = f"an integer of at least {minimum}"
    elif minimum is None:
        rule = f"an integer of at most {maximum}"
    else:
        rule = f"an integer from {minimum} to {maximum}"
    return rule + " or None" if none else rule


def check_int(name: str, value, *, minimum=None, maximum=None, none: bool = False):
    """``value`` as an ``int`` (any integer type: numpy's too; never a bool), within
    ``[minimum, maximum]`` (either may be None: no bound); None passes when ``none``."""
    if value is None and none:
        return None
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    if number is None:
        raise InvalidArgumentTypeError(
            f"{name} must be {_int_rule(minimum, maximum, none)}, not {shown(value)}"
        )
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise InvalidArgumentError(
            f"{name} must be {_int_rule(minimum, maximum, none)}, not {shown(value)}"
        )
    return number


def check_fraction(name: str, value) -> float:
    """``value``, a real number (not a bool) within ``[0, 1]``."""
    rule = f"{name} must be a number within [0, 1], not {shown(value)}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentTypeError(rule)
    if not 0 <= value <= 1:  # NaN too
        raise InvalidArgumentError(rule)
    return value if type(value) in (int, float) else float(value)


def check_state(who: str, state, required: tuple) -> Mapping:
    """``state``, given to ``who.load_state_dict``: a mapping holding the ``required`` keys
    (what ``state_dict()`` returns), or an error naming what is wrong."""
    if not isinstance(state, Mapping):
        raise InvalidArgumentTypeError(
            f"{who}.load_state_dict: state must be a dict (from state_dict()), not {shown(state)}"
        )
    missing = [key for key in required if key not in state]
    if missing:
        raise InvalidArgumentError(
            f"{who}.load_state_dict: state lacks {', '.join(map(repr, missing))} (give what "
            f"state_dict() returned), not {shown(dict(state))}"
        )
    return state
