"""Argument checks, written once: numbers, ints that are not bools, ranges and choices.

Each ``require_*`` returns the value (as a plain Python number) or raises ``error`` (default
``ValueError``; the config edge passes :class:`zoo.errors.ZooError`) with one line that names
the setting and the bad value: ``"<name> must be <what>; got <value>."``. The predicates
(:func:`is_number`, :func:`is_int`) are for the places that only skip a check on traced
values.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from zoo.errors import choice_error

__all__ = [
    "is_int",
    "is_number",
    "require_choice",
    "require_int",
    "require_number",
    "require_positive_int",
]


def is_number(x: object) -> bool:
    """A real Python or NumPy number, not a bool (``True`` is an ``int`` to Python)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_int(x: object) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _fail(error: type[Exception], name: str, what: str, value: object):
    raise error(f"{name} must be {what}; got {value!r}.")


def require_int(
    name: str,
    value: object,
    *,
    lo: int | None = None,
    hi: int | None = None,
    what: str | None = None,
    error: type[Exception] = ValueError,
) -> int:
    """``value`` as an ``int`` in ``[lo, hi]`` (either bound optional)."""
    if not is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        if what is None:
            what = "an int" if lo is None and hi is None else _range_text("an int", lo, hi)
        _fail(error, name, what, value)
    return int(value)


def require_positive_int(name: str, value: object, *, error: type[Exception] = ValueError) -> int:
    """``value`` as an ``int >= 1``."""
    return require_int(name, value, lo=1, what="a positive int", error=error)


def require_number(
    name: str,
    value: object,
    *,
    positive: bool = False,
    finite: bool = False,
    lo: float | None = None,
    hi: float | None = None,
    what: str | None = None,
    error: type[Exception] = ValueError,
) -> float:
    """``value`` as a ``float``: ``> 0`` if ``positive``, not inf or NaN if ``finite``, and in
    ``[lo, hi]`` where given. NaN fails every bound."""
    ok = is_number(value) and not math.isnan(value)
    ok = ok and not (positive and not value > 0)
    ok = ok and not (finite and not math.isfinite(value))
    ok = ok and not (lo is not None and value < lo) and not (hi is not None and value > hi)
    if not ok:
        if what is None:
            what = ("a positive " if positive else "a ") + ("finite number" if finite else "number")
            what = _range_text(what, lo, hi)
        _fail(error, name, what, value)
    return float(value)


def require_choice(what: str, value: object, valid: Iterable[str]):
    """``value`` if it is one of ``valid``; else a :class:`~zoo.errors.ZooError` naming it,
    listing the valid choices and suggesting close matches."""
    valid = list(valid)
    if value not in valid:
        raise choice_error(what, value, valid)
    return value


def _range_text(what: str, lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"{what} in [{lo}, {hi}]"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what
