"""Freeze patterns: parsing and checking ``embed``, ``blocks[0:4].mlp.*``, ``*.b``... (see
:mod:`zoo.freeze`)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from zoo.errors import ZooError
from zoo.models.registry import STACK  # top-level key of the scanned stack in the canonical tree

_SEGMENT = re.compile(r"[A-Za-z0-9_*?]+")
_RANGED = re.compile(r"(?P<head>[^\[\]]*)\[(?P<index>[^\[\]]*)\](?P<tail>[^\[\]]*)")
_INT = r"\s*[+-]?\d+\s*"
_INDEX = re.compile(rf"{_INT}")
_SLICE = re.compile(rf"(?P<start>{_INT})?:(?P<stop>{_INT})?(?::(?P<step>{_INT})?)?")
_GLOB_CHARS = "*?"


# ----------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class Pattern:
    """One parsed freeze pattern.

    ``path`` is the path part with any layer range removed (``blocks[0:2].mlp.*`` ->
    ``blocks.mlp.*``); ``layers`` is ``None`` (all layers), an ``int`` or a ``slice``.
    """

    text: str
    path: str
    layers: int | slice | None = None

    def selects(self, dotted_path: str) -> bool:
        """True when the path part matches ``dotted_path`` or one of its ancestors."""
        if self.layers is not None and dotted_path.split(".", 1)[0] != STACK:
            return False
        segments = dotted_path.split(".")
        return any(
            fnmatch.fnmatchcase(".".join(segments[:n]), self.path) for n in range(1, len(segments) + 1)
        )

    def rows(self, num_layers: int) -> tuple[int, ...]:
        """The layer indices this pattern selects in a stack of ``num_layers``."""
        if self.layers is None:
            return tuple(range(num_layers))
        if isinstance(self.layers, int):
            i = self.layers + num_layers if self.layers < 0 else self.layers
            if not 0 <= i < num_layers:
                raise ZooError(
                    f"freeze pattern {self.text!r}: layer {self.layers} is out of range for a "
                    f"stack of {num_layers} layers (valid: 0..{num_layers - 1} or "
                    f"-{num_layers}..-1)"
                )
            return (i,)
        rows = tuple(range(num_layers)[self.layers])
        if not rows:
            raise ZooError(
                f"freeze pattern {self.text!r}: layer range selects no layer of a stack of "
                f"{num_layers} layers (valid indices: 0..{num_layers - 1})"
            )
        return tuple(sorted(rows))


def _malformed(pattern: str, why: str) -> ZooError:
    return ZooError(
        f"malformed freeze pattern {pattern!r}: {why}. Write a dotted canonical path or glob "
        f"('embed', 'head.*', 'blocks.attn'), optionally with a layer range directly after "
        f"'{STACK}' ('{STACK}[0:4]', '{STACK}[-1].mlp.*')"
    )


def _check_path(pattern: str, path: str) -> None:
    if not path:
        raise _malformed(pattern, "empty path")
    for segment in path.split("."):
        if not segment:
            raise _malformed(pattern, "empty path segment (stray '.')")
        if not _SEGMENT.fullmatch(segment):
            raise _malformed(pattern, f"bad characters in segment {segment!r}")


def _parse_layers(pattern: str, index: str) -> int | slice:
    if _INDEX.fullmatch(index):
        return int(index)
    m = _SLICE.fullmatch(index)
    if m is None:
        raise _malformed(pattern, f"layer range [{index}] is not an index or a start:stop[:step] slice")
    start, stop, step = (
        None if v is None or not v.strip() else int(v) for v in m.group("start", "stop", "step")
    )
    if step == 0:
        raise _malformed(pattern, "layer range step must not be 0")
    return slice(start, stop, step)


def parse_pattern(pattern: str) -> Pattern:
    """Parse one freeze pattern; raise :class:`ZooError` naming it when it is malformed or
    puts a layer range anywhere but directly after ``blocks``."""
    if not isinstance(pattern, str):
        raise ZooError(f"freeze pattern must be a string, got {pattern!r}")
    text = pattern.strip()
    if not text:
        raise _malformed(pattern, "empty pattern")
    if "[" not in text and "]" not in text:
        _check_path(pattern, text)
        return Pattern(pattern, text)
    m = _RANGED.fullmatch(text)
    if m is None:
        raise _malformed(pattern, "unbalanced or repeated brackets; only one layer range is allowed")
    head, index, tail = m.group("head", "index", "tail")
    if tail and not tail.startswith("."):
        raise _malformed(pattern, "a layer range must be followed by '.' or end the pattern")
    _check_path(pattern, head + tail)  # also rejects an empty head ('[0]')
    if head != STACK:
        raise ZooError(
            f"freeze pattern {pattern!r}: a layer range is only allowed directly after "
            f"'{STACK}' (the scanned stack), not after {head!r}"
            + (
                f"; write e.g. '{STACK}[{index.strip()}].{head.split('.', 1)[1]}{tail}'"
                if head.startswith(STACK + ".")
                else ""
            )
        )
    return Pattern(pattern, head + tail, _parse_layers(pattern, index.strip()))


# ----------------------------------------------------------------------------- the plan
