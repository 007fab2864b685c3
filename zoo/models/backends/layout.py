"""What a backend adapter hands :mod:`zoo.models.canonical`: how one built module's leaves sit
on canonical paths. A leaf module of the backends package (it imports no backend)."""

from __future__ import annotations

from dataclasses import dataclass

from zoo.models.paths import Path


@dataclass(frozen=True)
class Layout:
    """How one backend's module leaves map onto canonical paths, in the module's leaf order.

    ``stored`` is the adapter's own note per leaf (how the stored array differs from the
    canonical one); ``graphdef`` is whatever else the adapter needs to rebuild the module.
    """

    paths: tuple[Path, ...]
    shapes: tuple[tuple[int, ...], ...]  # canonical (not stored) shapes
    stored: tuple[object, ...]
    treedef: object
    graphdef: object = None
