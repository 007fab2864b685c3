"""Extensions of a model's dense layers that are defined above ``zoo.models`` (LoRA's
adapters, :mod:`zoo.lora.adapter`), seen from here only through this table.

``zoo.models`` never imports ``zoo.lora``. A model config's ``lora`` field holds a spec that
is opaque here: an object with the methods of :class:`Spec`, which the canonical tree calls to
lay a config out (``attach``) and to draw the extra leaves (``init_leaf``). What the ops, the
logical axes and the checkpoint metadata need is registered once, by the package that defines
the extension (at its import), with :func:`register`:

* ``dense``: what the extension adds to a dense op's output, ``fn(layer, x) -> array``, or
  None for a layer without it (:func:`zoo.models.ops.dense` adds it);
* ``keys``: the path segments its leaves live under (``lora_a``, ``lora_b``), each with a
  function from the adapted layer's logical axes to the leaf's (:func:`leaf_axes`);
* ``decode``: the spec from its ``dataclasses.asdict`` form (checkpoint metadata).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import jax

# Extension leaves draw their initial values from a stream of their own, so adding them to a
# config leaves every base leaf's initial value as it was (canonical.init_params).
INIT_STREAM = 0x4C6F5241


class Spec(Protocol):
    """What ``zoo.models.canonical`` asks of the spec a config's extension field holds."""

    def attach(self, module, backend: str):
        """``module`` (freshly built, ``backend`` "nnx" or "eqx") with the extension added."""

    def init_leaf(self, path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array) -> jax.Array:
        """Initial value of one of the extension's leaves."""


@dataclass(frozen=True)
class _Extension:
    dense: Callable
    keys: dict[str, Callable[[tuple], tuple]]
    decode: Callable[[dict], Spec]


_REGISTERED: dict[str, _Extension] = {}  # ModelConfig field -> its extension


def register(field: str, *, dense: Callable, keys: dict[str, Callable], decode: Callable) -> None:
    """Register the extension a ModelConfig ``field`` holds (see the module docstring)."""
    _REGISTERED[field] = _Extension(dense, dict(keys), decode)


def dense_hooks() -> tuple[Callable, ...]:
    return tuple(e.dense for e in _REGISTERED.values())


def _segment(path) -> tuple[int, Callable] | None:
    for i, part in enumerate(path):
        for e in _REGISTERED.values():
            if part in e.keys:
                return i, e.keys[part]
    return None


def is_extension_path(path) -> bool:
    """True for a canonical path (tuple or dotted) inside a registered extension."""
    return _segment(path.split(".") if isinstance(path, str) else path) is not None


def leaf_axes(path: tuple[str, ...], base_axes: Callable[[tuple[str, ...]], tuple]) -> tuple | None:
    """Logical axes of an extension leaf, from ``base_axes`` of the weight ``w`` of the layer it
    extends; None for a path outside every extension."""
    found = _segment(path)
    if found is None:
        return None
    index, axes = found
    return axes(base_axes((*path[:index], "w")))


def decode(field: str, value: dict) -> Spec:
    """The extension spec of ModelConfig ``field`` from its checkpoint form (a dict)."""
    if field not in _REGISTERED:
        raise ValueError(f"model config field {field!r} holds an extension that is not registered")
    return _REGISTERED[field].decode(value)
