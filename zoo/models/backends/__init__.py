"""The two backends told apart in one place: one adapter module per backend.

Each adapter (:mod:`.nnx`, :mod:`.eqx`) holds its backend's table of layer types (the op each
serves, its arrays' canonical leaves) and the few functions that differ between the backends:
reading an op's params, splitting a stacked module, laying a module out on canonical paths and
rebuilding it. The ops (:mod:`zoo.models.ops`) and the canonical tree
(:mod:`zoo.models.canonical`) ask :func:`of` or :func:`get` for the adapter and never test a
backend's module types themselves, so a new layer type is written once per backend, in its
adapter's file.
"""

from __future__ import annotations

from types import ModuleType

from zoo.models.backends import eqx as eqx_backend
from zoo.models.backends import nnx as nnx_backend
from zoo.models.backends.layout import Layout

ADAPTERS: dict[str, ModuleType] = {"nnx": nnx_backend, "eqx": eqx_backend}

__all__ = ["ADAPTERS", "Layout", "get", "of", "op_params"]


def get(backend: str) -> ModuleType:
    """The adapter of a backend name (``"nnx"`` or ``"eqx"``; checked by the caller)."""
    return ADAPTERS[backend]


def of(obj) -> ModuleType:
    """The adapter of the backend ``obj`` (a module or layer) belongs to."""
    for adapter in ADAPTERS.values():
        if adapter.owns(obj):
            return adapter
    raise TypeError(f"{type(obj).__name__} is neither an NNX nor an Equinox module")


def op_params(layer, op: str) -> tuple[dict, dict]:
    """``(canonical params, op attributes)`` of ``layer`` for op ``op`` (``dense``, ``norm``,
    ``table``, ``conv``): the arrays as the canonical tree names and lays them out (``w``,
    ``b``, ``scale``; None-valued fields dropped) and the op's settings (``eps``,
    ``strides``, ``padding``). TypeError naming the layer types that serve ``op``."""
    found = None
    for adapter in ADAPTERS.values():
        if adapter.owns(layer):
            found = adapter.op_params(layer, op)
    if found is None:
        names = [n for adapter in ADAPTERS.values() for n in adapter.layer_names(op)]
        raise TypeError(f"a {op} op needs one of {', '.join(names)}; got {type(layer).__name__}")
    return found
