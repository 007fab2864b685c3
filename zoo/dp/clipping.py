"""Per-example gradient clipping for DP-SGD, on arbitrary parameter pytrees.

The one public function, :func:`clipped_grad_sum`, returns the *sum* over a
batch of per-example gradients, each rescaled to global L2 norm at most ``C``
(``l2_clip_norm``), together with the pre-clip per-example norms.  Adding or
removing one example changes that sum by at most ``C`` in L2 norm, which is the
sensitivity the Gaussian mechanism in :mod:`zoo.dp.noise` is calibrated to.

Per-example gradients are materialised with ``jax.vmap(jax.grad(...))``.  With
``microbatch_size=k`` the batch is taken ``k`` examples at a time by the one microbatch loop
(:func:`zoo.microbatch.accumulate`); only the running sum is carried, so the temporary memory
is about ``k`` gradient copies instead of ``B``. The engine's clipping in microbatches, for
every method of the table, is :func:`accumulated_clip`, over the same loop.

Clipping methods form a table, as remat policies do (:mod:`zoo.remat`): each registers by
name (:func:`register_clipping`) behind one call signature, :data:`ClipFn`. The engine,
the recipe validation, ``zoo bench dp`` and the docs read the table; ``dp.clipping`` in a
recipe names a row. ``vmap`` (this module) and ``ghost`` (:mod:`zoo.dp.ghost`) are built in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from zoo import microbatch
from zoo.checks import is_number
from zoo.dp.factors import clip_factor
from zoo.dp.groups import ALL_LAYER, ClipStyle, Groups, grouped_sum, members
from zoo.errors import choice_error
from zoo.precision import FLOAT32, Precision, float32_scope

PyTree = Any

__all__ = [
    "KEEP_SUM",
    "ClipModel",
    "ClipRequest",
    "ClippedSumTransform",
    "ClippingMethod",
    "accumulated_clip",
    "clip_factor",
    "clipped_grad_sum",
    "clipping_method",
    "clipping_names",
    "register_clipping",
    "unregister_clipping",
]


@dataclass(frozen=True)
class ClipModel:
    """What a clipping method may use of the model it clips: the config and backend, the
    stack plan (remat policy and frozen prefix), the freeze plan, and the loss of one example
    ``example_loss(trainable, frozen, x, y) -> scalar`` (``x``, ``y`` without a batch axis),
    which applies the run's ``precision`` itself; a method that runs the model another way
    applies ``precision`` (:meth:`zoo.precision.Precision.apply`) as the loss does.
    ``records_per_user``: ``k`` under ``dp.unit = "user"`` (the batch is then
    :func:`zoo.dp.users.group_users`'s, one example a user's ``k`` slots, and ``example_loss``
    the user's mean loss), ``None`` when the unit is a record."""

    cfg: Any
    backend: str
    stack: Any  # zoo.scan.StackPlan
    freeze: Any  # zoo.freeze.FreezePlan
    example_loss: Callable[..., jax.Array]
    precision: Precision = FLOAT32
    records_per_user: int | None = None


# clip(model, trainable, frozen, batch, request: ClipRequest)
#   -> (sum of clipped per-example grads, pre-clip norms [B], per-example losses [B])
# ``batch`` holds ``x`` and ``y``; the request holds the clip norm, the microbatch size and the
# 0/1 mask of the padding rows.
ClipFn = Callable[..., tuple[PyTree, jax.Array, jax.Array]]


@dataclass(frozen=True)
class ClippingMethod:
    """A row of the clipping table.

    The engine calls ``clip`` once per microbatch of ``train.microbatch_size`` examples and adds
    the sums (:func:`accumulated_clip`), so the setting bounds every method's memory.
    ``bench_label`` names the method's rows in ``zoo bench dp``; with
    ``bench_microbatch_label`` it also gets a row clipping in microbatches.
    """

    name: str
    description: str
    clip: ClipFn
    bench_label: str | None = None
    # Clips a user's mean gradient as one unit (dp.unit = "user": the loss of one example is
    # then the mean over a user's record slots, zoo.dp.users).
    clips_users: bool = False
    bench_microbatch_label: str | None = None

    @property
    def label(self) -> str:
        return self.bench_label or f"zoo {self.name}"


CLIPPING: dict[str, ClippingMethod] = {}


def register_clipping(method: ClippingMethod) -> ClippingMethod:
    """Add a clipping method to the table (a name already taken is an error)."""
    if method.name in CLIPPING:
        raise ValueError(f"clipping method {method.name!r} is already registered")
    CLIPPING[method.name] = method
    return method


def unregister_clipping(name: str) -> None:
    CLIPPING.pop(name)


def clipping_method(name: str) -> ClippingMethod:
    if name not in CLIPPING:
        raise choice_error("clipping", name, CLIPPING)
    return CLIPPING[name]


def clipping_names() -> list[str]:
    return list(CLIPPING)


class ClippedSumTransform(Protocol):
    """What the DP step does to the clipped sum before the noise, and what it reports on the
    release (the engine's ``clipped_sum_transform``). ``zoo audit``'s white-box canaries are
    one (:class:`zoo.audit.canaries.WhiteBoxCanaries`): they add their clipped gradients and
    report the release projected onto them. ``batch`` is the step's batch, so the transform's
    per-step arrays travel with it."""

    def add(self, grad_sum: PyTree, plan: Any, batch: dict) -> PyTree: ...

    def project(self, release: PyTree, grad_sum: PyTree, plan: Any, batch: dict) -> dict[str, jax.Array]: ...


@dataclass(frozen=True)
class _KeepSum:
    """The default transform: the clipped sum as it is, nothing reported."""

    def add(self, grad_sum, plan, batch):
        return grad_sum

    def project(self, release, grad_sum, plan, batch):
        return {}


KEEP_SUM = _KeepSum()


@dataclass(frozen=True)
class ClipRequest:
    """What a clipping call is asked for, checked once, when it is made.

    ``clip_norm`` is the bound ``C``: each per-example gradient ``g`` is scaled by
    ``min(1, C / ||g||)`` (global L2 norm over the differentiated leaves; a zero norm is left
    as it is). ``float('inf')`` disables clipping. A Python number or a traced scalar (inside
    ``jax.jit``); a static value must be > 0. ``microbatch_size``: process this many examples
    at a time (:mod:`zoo.microbatch`; it must divide the batch); ``None``: all at once. ``example_mask``
    ``[B]``: examples with mask 0 (the padding of a Poisson batch) add exactly zero to the sum,
    even with NaN or inf, and report norm and loss 0; a keep flag (``mask > 0``), not a weight.
    ``style``: the clipping style (:class:`zoo.dp.groups.ClipStyle`); with one other than
    all-layer each group of parameters is clipped to its own share of ``clip_norm``.
    """

    clip_norm: float | jax.Array
    microbatch_size: int | None = None
    example_mask: jax.Array | None = None
    style: ClipStyle = ALL_LAYER  # which parameters share a clip factor (zoo.dp.groups)

    def __post_init__(self):
        if is_number(self.clip_norm) and not self.clip_norm > 0:
            raise ValueError(
                f"clip_norm must be > 0 (use float('inf') for no clipping); got {self.clip_norm!r}."
            )
        microbatch.count(None, self.microbatch_size, "microbatch_size")

    def microbatches(self, b: int) -> int:
        """How many microbatches a batch of ``b`` examples is taken in (:func:`zoo.microbatch.count`)."""
        return microbatch.count(b, self.microbatch_size, "microbatch_size")

    def keep(self, b: int) -> jax.Array:
        """The keep flags ``[B]`` of a batch of ``b`` examples, after checking that the
        microbatches and the mask fit it."""
        self.microbatches(b)
        if self.example_mask is None:
            return jnp.ones((b,), dtype=bool)
        if jnp.shape(self.example_mask) != (b,):
            raise ValueError(
                f"example_mask must have shape ({b},) to match the batch; got {jnp.shape(self.example_mask)}."
            )
        return jnp.asarray(self.example_mask) > 0


def _batch_size(batch: tuple) -> int:
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError(
            "clipped_grad_sum needs at least one batch array with a leading "
            "example axis; got no batch arguments."
        )
    sizes = {int(jnp.shape(x)[0]) if jnp.ndim(x) > 0 else None for x in leaves}
    if None in sizes:
        raise ValueError("every batch array needs a leading example axis; got a scalar (0-d) batch array.")
    if len(sizes) != 1:
        raise ValueError(
            f"batch arrays disagree on the example axis size: {sorted(sizes)}; "
            "they must all share the same leading dimension B."
        )
    return sizes.pop()


def _acc_dtype(dtype) -> jnp.dtype:
    """Accumulate in at least float32 so bf16/fp16 sums do not lose mass."""
    return jnp.promote_types(dtype, jnp.float32)


def _chunk_sum(per_example_loss, params, frozen, n_batch: int, l2_clip_norm, groups: Groups | None = None):
    """``chunk_sum(chunk, keep) -> (clipped sum, (norms, losses))`` for one chunk of examples;
    with ``groups``, each group of leaves (rows) clipped to its own threshold."""
    clip = jnp.asarray(l2_clip_norm, dtype=jnp.float32)
    if frozen is not None:
        grad_one = jax.value_and_grad(lambda p, fz, *ex: per_example_loss(p, fz, *ex))
    else:
        grad_one = jax.value_and_grad(lambda p, fz, *ex: per_example_loss(p, *ex))
    per_example_grads = jax.vmap(grad_one, in_axes=(None, None) + (0,) * n_batch)

    def chunk_sum(chunk, keep):
        losses, grads = per_example_grads(params, frozen, *chunk)
        k = keep.shape[0]
        if groups is not None:
            summed, norms = grouped_sum(grads, groups, clip, keep)
            return summed, (norms, jnp.where(keep, losses.astype(jnp.float32), 0.0))
        with float32_scope("f32_per_example_norms"):
            sq = jnp.zeros((k,), jnp.float32)
            for g in jax.tree.leaves(grads):
                sq = sq + jnp.sum(jnp.square(g.astype(jnp.float32)), axis=tuple(range(1, g.ndim)))
            norms = jnp.sqrt(sq)
        factor = clip_factor(norms, clip)
        use = keep & jnp.isfinite(norms)

        def weighted_sum(g):
            acc = _acc_dtype(g.dtype)
            shape = (k,) + (1,) * (g.ndim - 1)
            contrib = g.astype(acc) * factor.astype(acc).reshape(shape)
            contrib = jnp.where(use.reshape(shape), contrib, jnp.zeros((), acc))
            return jnp.sum(contrib, axis=0)

        losses = jnp.where(keep, losses.astype(jnp.float32), 0.0)
        with float32_scope("f32_clipped_sum"):
            summed = jax.tree.map(weighted_sum, grads)
        return summed, (jnp.where(keep, norms, 0.0), losses)

    return chunk_sum


def clipped_grad_sum(
    per_example_loss: Callable[..., jax.Array],
    params: PyTree,
    *batch: PyTree,
    request: ClipRequest,
    frozen: PyTree | None = None,
    groups: Groups | None = None,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """Sum of per-example clipped gradients, the pre-clip per-example norms and losses.

    Args:
      per_example_loss: scalar loss of ONE example,
        ``per_example_loss(params, *example)``, or
        ``per_example_loss(params, frozen, *example)`` when ``frozen`` is given.
        ``example`` is one slice of each batch argument (no leading axis).
      params: pytree of float arrays to differentiate (any structure).
      *batch: arrays (or pytrees of arrays) sharing a leading example axis B.
      request: the clip norm, the microbatch size (microbatches of it are processed one after
        another by :func:`zoo.microbatch.accumulate`: the same result, lower peak memory) and the example
        mask (:class:`ClipRequest`).
      frozen: optional pytree passed to the loss as a non-differentiated
        argument.  It gets no gradient, is not part of the returned pytree and
        does not enter the norm.
      groups: the request's clipping style resolved over ``params`` (a canonical tree;
        :meth:`zoo.dp.groups.ClipStyle.resolve`); needed unless the style is all-layer.

    Returns:
      ``(grad_sum, norms, losses)``: ``grad_sum`` has the structure and dtypes of
      ``params`` (accumulated in at least float32); ``norms`` is float32 ``[B]``
      with the pre-clip global L2 norm of each example's gradient (0 for masked
      examples); ``losses`` ``[B]`` the per-example losses the gradients were computed
      with (saves the caller a forward pass for its metrics; masked examples report 0).

    Examples whose gradient norm is not finite are dropped from the sum (their
    contribution is zero, which keeps the sensitivity bound) but their norm is
    still reported as inf/NaN so the caller can notice.
    """
    b = _batch_size(batch)
    keep_all = request.keep(b)
    if not request.style.flat and groups is None:
        raise ValueError(
            f"clipping style {request.style.style!r} needs the groups resolved against the parameters "
            "(groups=request.style.resolve(zoo.dp.groups.members(params)))"
        )
    chunk_sum = _chunk_sum(per_example_loss, params, frozen, len(batch), request.clip_norm, groups)

    def part_sum(part):
        summed, (norms, losses) = chunk_sum(part["batch"], part["keep"])
        return summed, norms, losses

    summed, norms, losses = microbatch.accumulate(
        part_sum, {"batch": batch, "keep": keep_all}, request.microbatches(b), _CLIPPED
    )
    summed = jax.tree.map(lambda s, p: s.astype(jnp.result_type(p)), summed, params)
    return summed, norms, losses


_CLIPPED = (microbatch.SUM, microbatch.CONCAT, microbatch.CONCAT)  # (clipped sum, norms, losses)
_SPLIT = ("x", "y", "mask")  # what a clipping method reads of the batch


def accumulated_clip(clip: ClipFn, model: ClipModel, trainable, frozen, batch: dict, request: ClipRequest):
    """``clip``'s ``(clipped sum, norms [B], losses [B])`` of ``batch``, computed
    ``request.microbatch_size`` examples at a time by the one microbatch loop
    (:func:`zoo.microbatch.accumulate`).

    ``batch`` is the step's (``x``, ``y`` and ``mask``, the keep flags also in
    ``request.example_mask``; under ``dp.unit = "user"`` grouped by
    :func:`zoo.dp.users.group_users`, so an example is a user). Each microbatch is clipped
    with the request's clip norm and its own slice of the mask; the sums add in float32 (at
    least), and the result has the dtypes of ``trainable``. Without a microbatch size, or with
    one that is the whole batch, this is one call of ``clip``. The noise is the caller's, once,
    on the whole sum: a microbatch is a performance setting only.
    """
    n = microbatch.count(int(jnp.shape(batch["mask"])[0]), request.microbatch_size)
    whole = dataclasses.replace(request, microbatch_size=None)
    if n == 1:
        return clip(model, trainable, frozen, batch, whole)

    def one(part):
        request = dataclasses.replace(whole, example_mask=part["mask"])
        summed, norms, losses = clip(model, trainable, frozen, part, request)
        return summed, norms.astype(jnp.float32), losses.astype(jnp.float32)

    summed, norms, losses = microbatch.accumulate(one, {k: batch[k] for k in _SPLIT}, n, _CLIPPED)
    return jax.tree.map(lambda s, p: s.astype(p.dtype), summed, trainable), norms, losses


def _vmap_clip(model: ClipModel, trainable, frozen, batch, request: ClipRequest):
    groups = None
    if not request.style.flat:
        groups = request.style.resolve(members(trainable, model.freeze, model.stack.frozen_prefix))
    return clipped_grad_sum(
        model.example_loss, trainable, batch["x"], batch["y"], request=request, frozen=frozen, groups=groups
    )


register_clipping(
    ClippingMethod(
        "vmap",
        "per-example gradients by vmap(grad), in microbatches of train.microbatch_size if set",
        _vmap_clip,
        bench_label="zoo vmap",
        bench_microbatch_label="zoo microbatch",
        clips_users=True,
    )
)
