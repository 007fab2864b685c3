"""Ghost clipping: per-example gradient norms without per-example gradients, for any model
written over the op set of :mod:`zoo.models.ops`.

DP-SGD needs ``||g_i||`` for every example ``i`` and then ``sum_i f_i g_i`` with
``f_i = min(1, C / ||g_i||)``.  :func:`zoo.dp.clipped_grad_sum` gets both by materialising
``g_i`` with ``vmap(grad)``, which costs B copies of the gradient.  Every parameter of a zoo
model sits in an op whose gradient is a cheap function of that op's input ``a`` and of the
gradient ``delta`` of its output, so we get all the ``delta`` in one ordinary backward pass and
work per op kind (:mod:`zoo.dp.ghost.rules`):

* ``dense`` ``z = a @ w + b``: ``g_w = sum_t a_t^T delta_t``.  Without a sequence axis
  ``||g_w||^2 = ||a||^2 ||delta||^2``; with one, either the Gram form
  ``sum_{t,s} (a_t . a_s)(delta_t . delta_s)`` or the per-example ``a^T delta`` itself,
  whichever is cheaper for the shape (:func:`dense_method`; under book-keeping counting the
  Gram form's second matmul for the clipped sum; a form measured on the device for the shape
  overrides it: :mod:`zoo.dp.ghost.forms`, :mod:`zoo.dp.ghost.measure`).  ``g_b = sum_t delta_t``.
* ``norm`` (LayerNorm, RMSNorm) ``y = xhat * scale + b``: ``g_scale = sum_t delta_t * xhat_t``,
  ``g_b = sum_t delta_t``.
* ``gather`` (token table) ``e_t = W[tok_t]``: ``g_W`` scatters ``delta_t`` to row ``tok_t``;
  repeated tokens share a row, so ``||g_W||^2 = sum_{t,s} [tok_t == tok_s] (delta_t . delta_s)``.
* ``rows`` (positional table) ``p_t = P[t]``: distinct rows, ``||g_P||^2 = ||delta||^2``.
* ``conv`` (2-D conv) ``z_p = a_p @ w + b`` over the input windows ``a_p`` of the output
  positions ``p``: a dense op on a sequence of positions, with the cheaper of the Gram form and
  the per-example gradient per layer (:mod:`zoo.dp.ghost.conv`, mixed ghost clipping).

Nothing here is written per model. The model's own forward runs under hooks
(:mod:`zoo.dp.ghost.sites`, :mod:`zoo.hooks`): tracing it once finds the sites (each op, named
by the canonical path of its parameters), their kinds and output shapes. Every trainable
canonical leaf must be claimed by exactly one site (or by a token table and the head tied to
it: ``rules.SHARED``, whose cross term makes the norm exact); otherwise (a parameter used outside
the op set, or read twice) the call falls back to vmap clipping with a warning naming the leaves --
a wrong norm would silently break the privacy guarantee, a slow one only costs time.

Each op's norms are taken inside the backward pass, where its input and output gradient meet:
*taps* (:mod:`zoo.dp.ghost.taps`), identities on each op's output whose custom backward rule
builds the op's rule from its input (a residual, saved or recomputed as the remat policy says)
and the output gradient passing through, and hands its per-example squared norms out of the
pass as the gradient of a small zero *slot*. Inside the scanned stack the slots are scanned
with the layers, so a layer's norms are formed and reduced in that layer's step of the scan's
backward; no array of every layer's per-example pieces is made for the norms. The backward runs
with the parameters constant. Two ways to the clipped sum (``method``):

* ``"bookkeeping"``: the taps also hand out what each op's clipped sum needs, in the step's
  compute dtype (a dense op's ``(a, delta)`` in the Gram form, its per-example gradients in the
  materialised form, whichever :mod:`zoo.dp.ghost.forms` picks for the shape); once the clip
  factors are known the rules are made again from them and summed, layer by layer, in float32
  (:func:`kept_sum`). One forward and one backward; those pieces are held besides what the remat
  policy keeps.
* ``"backward"``: the taps hand out the norms alone; a second, ordinary forward and backward of
  ``sum_i f_i L_i`` then gives the clipped sum. Nothing per layer is kept beyond what the policy
  keeps.

``"auto"`` (default, :func:`resolve_method`) takes book-keeping unless the remat policy keeps
nothing of a block on the device (``full``, ``nested``, ...), where the pieces would be many
times the policy's memory; even there it takes book-keeping when the pieces are no larger than
the layers' inputs the policy keeps (a LoRA fine-tune's adapters: :mod:`zoo.dp.ghost.method`).
A head tied to the token table is exact by both: its tap and the table's each hand out their
half of the cross term (:class:`zoo.dp.ghost.rules.Tied`).
Measurements are in ``docs/ghost.md``.

Users (``dp.unit = "user"``): with ``slots`` [U, k], each user's mean gradient over its
filled slots is clipped as one, by both methods, still without per-user gradients: the
backward starts from the slot weights, and each op's rows are grouped by user before its rule,
so the user's records become positions of one example (:mod:`zoo.dp.ghost.units`).
"""

from zoo.dp.ghost.api import ghost_clipped_grad_sum, ghost_forward, supports, unsupported_reason
from zoo.dp.ghost.conv import Conv, conv_method, layer_methods  # registers the conv rule
from zoo.dp.ghost.method import method_for, resolve_method
from zoo.dp.ghost.rules import dense_method, gather_method
from zoo.dp.ghost.sites import Site, discover
from zoo.dp.ghost.stages import (
    METHODS,
    GhostPlan,
    Kept,
    choose_method,
    clip_factors,
    kept_sum,
    prepare,
    probe_pass,
    squared_norms,
    tap_pass,
    weighted_backward,
)
from zoo.dp.ghost.units import Units

__all__ = [
    "METHODS",
    "Conv",
    "GhostPlan",
    "Kept",
    "Site",
    "Units",
    "choose_method",
    "clip_factors",
    "conv_method",
    "dense_method",
    "discover",
    "gather_method",
    "ghost_clipped_grad_sum",
    "ghost_forward",
    "kept_sum",
    "layer_methods",
    "method_for",
    "prepare",
    "probe_pass",
    "resolve_method",
    "squared_norms",
    "supports",
    "tap_pass",
    "unsupported_reason",
    "weighted_backward",
]
