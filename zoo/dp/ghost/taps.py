"""Norm taps: a site's per-example work, done inside the backward pass where its pieces meet.

A tap is an identity on an op's output ``z`` (:func:`tap`) whose backward rule holds the op's
input (a residual: saved or recomputed as the remat policy says) and receives the output
gradient flowing through. There, and only there, it builds the op's norm rule
(:mod:`zoo.dp.ghost.rules`) and hands three things out of the backward pass as the gradient of
a zero *slot* (:func:`tap_outputs`):

* ``"sq"``: the op's per-example squared norms ``[U, leaves]`` (float32);
* ``"kept"`` (book-keeping): what the op's clipped sum needs, :meth:`Rule.kept` -- a dense op's
  ``(a, delta)`` in the compute dtype for the Gram form, its per-example gradients in the
  compute dtype for the materialised form;
* ``"cross"``: its half of the cross term of a leaf two ops read (a tied head,
  :class:`zoo.dp.ghost.rules.Tied`);
* ``"sum"`` (a *local* tap: the op, in this layer, is a clipping group of its own, as under
  ``dp.clipping_style = "layer-wise"``, :mod:`zoo.dp.groups`): the op's clipped sum itself. Its
  clip factor needs only its own norms, so the tap forms it here, from the threshold and the
  keep flags that its slot's value ``"ctl"`` brings in (the only slot value a tap reads), and
  hands out a parameter-sized sum instead of any per-example piece.

Inside the scanned stack the slots are scanned with the layers (:mod:`zoo.hooks`), so each
layer's tap runs in that layer's step of the scan's backward: its norms are taken while its
``a`` and ``delta`` exist, and no array of every layer's inputs or output gradients is made
beyond what the tap hands out. The slot's value is never read in the forward pass, so XLA keeps
no zeros for it: only the scan's stacked outputs of the backward exist.

The output gradient returned to the model is ``dz`` itself: the tap changes no number of the
pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.dp.clipping import clip_factor
from zoo.dp.ghost import forms
from zoo.dp.ghost.rules import SHARED, build, by_unit, grouped
from zoo.precision import float32_scope

FIRST, SECOND = "first", "second"  # the halves of a shared leaf's cross term


@dataclass(frozen=True)
class Tap:
    """What one site's tap does (static, hashable). ``keep``: hand out the rule's kept arrays;
    ``cross``: ``((first kind, second kind), FIRST or SECOND)`` for one of two ops that read
    the same leaf (the second's input is then ``(its input, the first's input)``); ``capture``:
    the forward keeps the op's input for :meth:`Rule.input_arrays` (a token table's ids)."""

    kind: str
    leaves: tuple[str, ...]
    rows: int | None
    choice: forms.Choice
    records: int = 1
    keep: bool = False
    cross: tuple | None = None
    capture: bool = False
    local: bool = False


def tap_outputs(spec: Tap, inputs, dz, ctl=None) -> dict:
    """``{"sq": [U, leaves], "kept"?: {...}, "cross"?: ..., "sum"?: {...}}`` of one op from its
    input and output gradient (units of ``spec.records`` rows:
    :func:`zoo.dp.ghost.rules.grouped`); ``ctl`` (a local tap's): ``{"limit": C_g, "keep": [U]}``."""
    with float32_scope("f32_per_example_norms"):
        first_inputs = None
        if spec.cross is not None and spec.cross[1] == SECOND:
            inputs, first_inputs = inputs
        rule = build(spec.kind, inputs, dz, spec.leaves, spec.rows, spec.choice, spec.records)
        sq = rule.sq()
        out = {"sq": jnp.stack([sq[leaf] for leaf in spec.leaves], axis=-1)}
        if spec.keep:
            out["kept"] = rule.kept()
        if spec.cross is not None:
            pair, half = spec.cross
            rule_in, rule_d = grouped(spec.kind, inputs, dz, spec.records)
            if half == FIRST:
                out["cross"] = SHARED[pair].first(rule_in, rule_d)
            else:
                tokens = first_inputs if spec.records == 1 else by_unit(first_inputs, spec.records)
                out["cross"] = SHARED[pair].second(rule_in, rule_d, tokens)
    if spec.local:
        out["sum"] = local_sum(rule, sq, ctl)
    return out


def local_sum(rule, sq: dict, ctl: dict) -> dict:
    """A local tap's clipped sum: the op's leaves clipped together to ``ctl["limit"]``, dropped
    where the example is masked or its norm here is not finite (as
    :func:`zoo.dp.groups.group_weights` does for a group)."""
    with float32_scope("f32_clip_factors"):
        norms = jnp.sqrt(sum(sq.values()))
        use = (ctl["keep"] > 0) & jnp.isfinite(norms)
        weights = jnp.where(use, clip_factor(norms, ctl["limit"]), 0.0)
    with float32_scope("f32_clipped_sum"):
        return {leaf: g.astype(jnp.float32) for leaf, g in rule.grad(weights, use).items()}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def tap(spec: Tap, z, inputs, slot):
    """Identity on ``z``; its backward rule hands :func:`tap_outputs` out as ``slot``'s gradient
    (``slot``: zeros shaped like them, never read)."""
    del spec, inputs, slot
    return z


def _tap_fwd(spec, z, inputs, slot):
    return z, (inputs, slot["ctl"]) if spec.local else inputs


def _tap_bwd(spec, res, dz):
    if not spec.local:
        return dz, None, tap_outputs(spec, res, dz)
    inputs, ctl = res
    out = tap_outputs(spec, inputs, dz, ctl)
    return dz, None, {**out, "ctl": jax.tree_util.tree_map(jnp.zeros_like, ctl)}


tap.defvjp(_tap_fwd, _tap_bwd)


def slot_of(spec: Tap, inputs, z, units: int = 0):
    """The abstract outputs of a tap (``jax.ShapeDtypeStruct`` leaves) for an op whose input and
    output look like ``inputs`` and ``z``: what its slot must look like (a local tap's with its
    ``"ctl"`` for ``units`` examples)."""
    if not spec.local:
        return jax.eval_shape(functools.partial(tap_outputs, spec), inputs, z)
    ctl = {
        "limit": jax.ShapeDtypeStruct((), jnp.float32),
        "keep": jax.ShapeDtypeStruct((units,), jnp.float32),
    }
    return {**jax.eval_shape(functools.partial(tap_outputs, spec), inputs, z, ctl), "ctl": ctl}


def rule_of(spec: Tap, inputs, z):
    """The abstract rule of a tap (its class and static choices, ``ShapeDtypeStruct`` arrays):
    what :meth:`zoo.dp.ghost.rules.Rule.rebuild` needs to make it again from the kept arrays."""

    def make(i, d):
        if spec.cross is not None and spec.cross[1] == SECOND:
            i = i[0]
        return build(spec.kind, i, d, spec.leaves, spec.rows, spec.choice, spec.records)

    return jax.eval_shape(make, inputs, z)
