"""``ghost_clipped_grad_sum``: the contract of ``zoo.dp.clipped_grad_sum``, by ghost norms."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp

from zoo.checks import require_choice
from zoo.dp.clipping import ClippingMethod, ClipRequest, clipped_grad_sum, register_clipping
from zoo.dp.ghost.grouped import grouped_clip
from zoo.dp.ghost.method import resolve_method
from zoo.dp.ghost.sites import run
from zoo.dp.ghost.stages import (
    METHODS,
    clip_factors,
    kept_sum,
    prepare,
    tap_pass,
    weighted_backward,
)
from zoo.dp.ghost.units import Units, from_grouped
from zoo.dp.groups import members
from zoo.errors import ZooError
from zoo.losses import per_example_loss
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import ModelConfig, is_config
from zoo.precision import float32_scope
from zoo.remat import RematPolicy
from zoo.scan import StackPlan, as_plan


def unsupported_reason(cfg: object, x=None, freeze_plan=None) -> str | None:
    """Why ghost clipping cannot handle ``cfg`` (``None`` when it can): an unregistered config,
    or trainable leaves that no op of the model claims exactly once (traced on inputs shaped
    like ``x``; default: two examples of the model's full length)."""
    if not is_config(cfg):
        return f"ghost clipping needs a registered model config, not {type(cfg).__name__}"
    x = cfg.input_spec(2) if x is None else x
    return prepare(cfg, x, freeze_plan).problem


def supports(cfg: object, x=None, freeze_plan=None) -> bool:
    """True when :func:`ghost_clipped_grad_sum` computes exact norms for ``cfg``."""
    return unsupported_reason(cfg, x, freeze_plan) is None


def ghost_forward(cfg: ModelConfig, params: dict, x: jax.Array, probes: dict | None = None, remat="none"):
    """``(logits, captures)`` of the forward ghost clipping runs: the model itself, under
    hooks that add ``probes`` (``{site path: zeros shaped like its output}``, stacked sites with
    a leading layer axis) and keep each probed op's input. The logits equal
    ``zoo.apply_fn(cfg, backend)``'s; probes of zeros do not change them."""
    plan = as_plan(remat)
    if probes is None:
        return run(cfg, params, x, plan)[0], {}
    logits, top = run(cfg, params, x, plan, "probe", probes)
    return logits, top.captures


def _resolve_freeze(params, frozen, freeze_plan):
    """``(full params, plan or None)`` from the trainable tree, the frozen tree and the plan."""
    if frozen is None:
        if freeze_plan is not None and freeze_plan.frozen_count:
            raise ZooError(
                "ghost_clipped_grad_sum: freeze_plan freezes parameters but no "
                "frozen tree was given; pass frozen=plan.split(params)[1]"
            )
        return params, None
    if freeze_plan is not None:
        return freeze_plan.merge(params, frozen), freeze_plan
    t_flat, f_flat = flat_by_path(params), flat_by_path(frozen)
    overlap = sorted(set(t_flat) & set(f_flat))
    if overlap:
        raise ZooError(
            "ghost_clipped_grad_sum: the trainable and frozen trees share leaves "
            f"{overlap} (row-wise freezing of a stack); pass freeze_plan= to merge them"
        )
    if not f_flat:
        return params, None
    from zoo.freeze import resolve_freeze

    full = nest_by_path({**t_flat, **f_flat})
    return full, resolve_freeze(full, sorted(f_flat))


def ghost_clipped_grad_sum(
    cfg: ModelConfig,
    params: dict,
    x: jax.Array,
    y: jax.Array,
    request: ClipRequest,
    *,
    frozen: dict | None = None,
    freeze_plan=None,
    remat: str | RematPolicy | StackPlan = "none",
    backend: str = "nnx",
    method: str = "auto",
    dense: str | None = None,
    precision=None,
    slots: jax.Array | None = None,
):
    """Sum of per-example clipped gradients, the pre-clip norms and the losses, by ghost norms.

    Same contract as :func:`zoo.dp.clipped_grad_sum` (the clip norm, microbatch size and
    example mask come in one :class:`~zoo.dp.clipping.ClipRequest`) applied to
    ``per_example_loss(apply(merge(params, frozen), x[i:i+1]), y[i:i+1])``: ``params`` is the
    trainable tree (the whole canonical tree when nothing is frozen); ``frozen`` and
    ``freeze_plan`` (a :class:`zoo.freeze.FreezePlan`) give the rest -- without a plan the two
    trees must be disjoint leaf by leaf.  Frozen leaves and rows neither enter the norm nor get
    a gradient.  Examples with mask 0 contribute exactly zero (even with NaNs) and
    report norm 0; unmasked examples with a non-finite norm are dropped from the sum but their
    norm is returned.

    ``remat`` is a policy name, a :class:`~zoo.remat.RematPolicy` or a
    :class:`~zoo.scan.StackPlan` (whose ``frozen_prefix`` layers get no gradient, as in the
    models).  ``method``: ``"bookkeeping"``, ``"backward"`` or ``"auto"`` (the second under a
    policy that keeps nothing of a block, unless book-keeping's pieces are no larger than the
    layers' inputs that policy keeps, as a LoRA fine-tune's are; the first otherwise:
    :func:`zoo.dp.ghost.method.resolve_method`).  Either
    way each op's norms are taken inside the backward pass, layer by layer
    (:mod:`zoo.dp.ghost.taps`).  ``dense`` forces the norm
    form of every sequence op and the token table (``"gram"`` or ``"materialise"``, for tests
    and benchmarks); ``None`` picks per shape. ``precision`` (a :class:`zoo.precision.Precision`
    or its name; default float32) is the policy the model runs under; the norms, the clip
    factors and the sum stay float32 (the rules widen the captured operands).

    A model whose trainable leaves are not each claimed by exactly one op (see
    :func:`unsupported_reason`) falls back, with a warning, to ``zoo.dp.clipped_grad_sum`` on
    ``zoo.apply_fn(cfg, backend)`` (the request's microbatch size applies there; ghost
    clipping itself needs no microbatching).

    ``slots`` ``[U, k]`` makes the examples users (``dp.unit = "user"``, :mod:`zoo.dp.users`;
    :mod:`zoo.dp.ghost.units`): row ``u * k + j`` of ``x`` and ``y`` is slot ``j`` of user
    ``u``, filled where ``slots > 0``. A user's loss is the mean over its filled slots, its
    gradient (the mean of its records') is clipped as one, the request's mask is ``[U]`` and
    ``norms`` and ``losses`` are per user; the model still runs on each record alone.

    Returns ``(grad_sum, norms, losses)``: ``grad_sum`` has the structure of ``params``;
    ``norms`` is float32 ``[B]``; ``losses`` ``[B]`` the per-example losses of the same forward
    pass (the values of masked examples are unspecified).
    """
    units = Units.of(slots, x.shape[0])
    keep = _check_args(method, dense, request, x, y, units)
    full, plan = _resolve_freeze(params, frozen, freeze_plan)
    reason = (
        f"ghost clipping needs a registered model config, not {type(cfg).__name__}"
        if not is_config(cfg)
        else None
    )
    gp = None if reason else prepare(cfg, x, plan, remat, precision, units.records)
    reason = reason or gp.problem
    if reason:
        apply = _apply_merged(cfg, backend, frozen, freeze_plan, precision)
        return _fallback(apply, params, x, y, request, remat, reason, units)

    if not request.style.flat:  # several groups, each clipped on its own (zoo.dp.groups)
        if method == "backward":
            raise ValueError(
                f"ghost method 'backward' clips all-layer only (one weighted loss scales all of an "
                f"example's parameters alike); clipping_style {request.style.style!r} runs in one "
                "backward: method 'auto' or 'bookkeeping'"
            )
        found = members(params, plan, gp.prefix)
        grads, norms, losses = grouped_clip(
            gp,
            full,
            x,
            y,
            groups=request.style.resolve(found),
            found=found,
            keep=keep,
            clip_norm=request.clip_norm,
            dense=dense,
            row_weights=units.row_weights(),
        )
        return grads, norms, units.losses(losses)
    bookkeeping = resolve_method(gp, full, x, method, dense) == "bookkeeping"
    losses, sq, kept = tap_pass(gp, full, x, y, dense, units.row_weights(), sums=bookkeeping)
    norms, weights, use = clip_factors(sq, keep, request.clip_norm)
    if bookkeeping:
        with float32_scope("f32_clipped_sum"):
            grads = kept_sum(gp, full, kept, weights, use)
    else:
        grads = _second_backward(gp, params, frozen, x, y, weights, use, units)
    return grads, norms, units.losses(losses)


def _check_args(method, dense, request: ClipRequest, x, y, units: Units) -> jax.Array:
    """The keep flags ``[B]`` (``[U]``) after checking the ghost options and the batch (the
    request checks itself: :meth:`~zoo.dp.clipping.ClipRequest.keep`)."""
    require_choice("ghost clipping method", method, METHODS)
    if dense is not None:
        require_choice("dense norm method", dense, ("gram", "materialise"))
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"x and y disagree on the batch size: {x.shape[0]} vs {y.shape[0]}")
    # Ghost clipping needs no microbatches: only the vmap fallback cuts the batch into them.
    return dataclasses.replace(request, microbatch_size=None).keep(units.count(x.shape[0]))


def _second_backward(gp, params, frozen, x, y, weights, use, units: Units):
    """``sum_i weights_i g_i`` by an ordinary forward and backward of the weighted loss."""
    # Batched backprop multiplies a zero cotangent by the example's own activations, and
    # 0 * NaN is NaN: dropped examples (masked, or with a non-finite gradient) rerun as a
    # copy of a kept one, with weight 0. Their contribution is then exactly zero.
    x2, y2 = units.keep_or_copy(x, use), units.keep_or_copy(y, use)
    weights = units.spread(weights)  # a row's weight: its unit's clip factor times its slot's
    # The cond also skips the pass when no example is kept; and XLA's CPU buffer
    # assignment reuses the first pass's memory for a branch, not for straight-line code.
    grads = jax.lax.cond(
        jnp.any(use),
        lambda: weighted_backward(gp, params, frozen, x2, y2, weights),
        lambda: jax.tree_util.tree_map(jnp.zeros_like, params),
    )
    return jax.tree_util.tree_map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)


def _apply_merged(cfg, backend, frozen, freeze_plan, precision=None):
    """``apply(trainable, x, remat)`` of the real model on the merged tree."""
    from zoo.api import apply_fn

    apply = apply_fn(cfg, backend, precision=precision)
    if frozen is None:
        return apply

    def merged(trainable, x, remat):
        if freeze_plan is not None:
            full = freeze_plan.merge(trainable, frozen)
        else:
            full = nest_by_path({**flat_by_path(trainable), **flat_by_path(frozen)})
        return apply(full, x, remat)

    return merged


def _fallback(apply, params, x, y, request: ClipRequest, remat, reason: str, units: Units):
    """vmap clipping of ``apply`` (the model on the merged tree), per example or per unit, with
    a warning saying why."""
    warnings.warn(
        f"ghost clipping unavailable ({reason}); using the vmap path (zoo.dp.clipped_grad_sum)", stacklevel=3
    )

    def losses(p, xs, ys):  # the frozen tree is closed over by ``apply``
        return per_example_loss(apply(p, xs, remat), ys)

    xs, ys = units.vmap_batch(x, y)
    return clipped_grad_sum(units.vmap_loss(losses), params, xs, ys, request=request, frozen={})


def _ghost_clip(model, trainable, frozen, batch, request: ClipRequest):
    x, y, slots = batch["x"], batch["y"], None
    if model.records_per_user:  # zoo.dp.users.group_users's batch: an example is a user's k slots
        x, y, slots = from_grouped(batch)
    return ghost_clipped_grad_sum(
        model.cfg,
        trainable,
        x,
        y,
        request,
        frozen=frozen,
        freeze_plan=model.freeze,
        remat=model.stack,
        backend=model.backend,
        precision=model.precision,
        slots=slots,
    )


register_clipping(
    ClippingMethod(
        "ghost",
        "per-example norms from each op's input and output gradient, no per-example gradients",
        _ghost_clip,
        bench_label="ghost",
        clips_users=True,  # zoo.dp.ghost.units
    )
)
