"""Finds the model kinds: every folder ``zoo/models/<kind>/`` with a ``config.py`` is a kind.

Importing a kind's ``config`` module registers it (``zoo.models.registry.register``), so a new
kind is a new folder and nothing else; ``zoo.models`` calls :func:`import_kinds` when it is
first imported. The registry orders the kinds for listings, not the file system.
"""

from __future__ import annotations

import importlib
import os
import pkgutil


def import_kinds(package: str = "zoo.models") -> tuple[str, ...]:
    """Import ``<package>.<kind>.config`` for each subpackage of ``package`` that has a
    ``config.py``; returns the kind folders found, in name order."""
    paths = importlib.import_module(package).__path__
    found = sorted(
        info.name
        for info in pkgutil.iter_modules(paths)
        if info.ispkg and os.path.isfile(os.path.join(info.module_finder.path, info.name, "config.py"))
    )
    for name in found:
        importlib.import_module(f"{package}.{name}.config")
    return tuple(found)
