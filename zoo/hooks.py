"""Hooks: how a transform sees every parametrised op of a model, without the model knowing.

Models write their math over the ops in :mod:`zoo.models.ops` (``dense``, ``layer_norm``,
``rms_norm``, ``embed``, ``positions``). Each op hands its output to the active hooks, which
may return it changed -- a probe added, a norm tap wrapped around it -- and may keep the op's
input. The scanned stack (:func:`zoo.scan.scan_layers`) threads per-layer hook arrays
through the scan and returns what each layer kept. With no hooks active, the default, ops and
scans do exactly what they would without this module.

An op names its *site* by the parameter arrays it reads: the hooks were built from the
canonical tree the model was built from, so they know which leaf each array object is.
Ghost clipping (:mod:`zoo.dp.ghost`) is the user: one norm rule per op kind, no per-model
code.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_ACTIVE: contextvars.ContextVar[Hooks | None] = contextvars.ContextVar("zoo_hooks", default=None)


class Hooks:
    """What happens at each parametrised op and each scanned stack; this base does nothing.

    Subclasses override :meth:`op` and :meth:`stack`.
    """

    def op(self, kind: str, z: jax.Array, params: dict[str, jax.Array], inputs) -> jax.Array:
        """Called by every parametrised op with its output ``z``, its parameters by canonical
        leaf name (``{"w": ..., "b": ...}``) and what its norm rule needs (``inputs``: the
        dense input, the normalised input of a norm, the token ids, or None). Returns the
        array the model goes on with."""
        del kind, params, inputs
        return z

    def stack(self, stacked: dict, frozen_prefix: int) -> StackHooks | None:
        """Hooks for a scanned stack of layers ``[frozen_prefix:]`` (``stacked``: the full
        stacked parameter pytree, as the model passes it to the scan), or None to run it
        without hooks."""
        del stacked, frozen_prefix
        return None


class StackHooks:
    """Per-layer hooks of one scanned stack; :func:`zoo.scan.scan_layers` drives it.

    ``xs`` is scanned along with the layer parameters (leading axis: the hooked layers);
    :meth:`layer` makes the hooks of one layer from its slices; the pytree a layer's hooks
    return from :meth:`Hooks.outputs` becomes the scan's stacked output, handed to
    :meth:`finish`.
    """

    xs: object = None

    def layer(self, xs, layer_params) -> LayerHooks:
        raise NotImplementedError

    def finish(self, ys) -> None:
        del ys


class LayerHooks(Hooks):
    """Hooks inside one layer of a scanned stack."""

    def outputs(self):
        """What this layer hands out of the scan (a pytree of arrays, or None)."""
        return None


def current() -> Hooks | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def active(hooks: Hooks | None) -> Iterator[None]:
    """Run the enclosed model code with ``hooks`` (``None``: without any)."""
    token = _ACTIVE.set(hooks)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def report(kind: str, z: jax.Array, params: dict[str, jax.Array], inputs=None) -> jax.Array:
    """What an op calls with its output: the active hooks' :meth:`Hooks.op`, or ``z``."""
    hooks = _ACTIVE.get()
    return z if hooks is None else hooks.op(kind, z, params, inputs)
