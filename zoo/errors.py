"""Errors that name the bad value, list the valid choices and suggest close matches."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ZooError(ValueError):
    """A user-facing error: bad preset, flag, recipe field or argument."""


def choice_error(what: str, value: object, valid: Iterable[str]) -> ZooError:
    valid = sorted(valid)
    close = difflib.get_close_matches(str(value), valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ZooError(f"unknown {what} {value!r}.{hint} Valid: {', '.join(valid)}.")
