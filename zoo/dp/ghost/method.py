"""Which of the two ways to the clipped sum a ghost step takes under ``method = "auto"``: the
remat policy's rule (:func:`zoo.dp.ghost.stages.choose_method`), and, where that rule says a
second backward, the size of what book-keeping would keep.

The policy's rule: book-keeping (one forward and one backward) unless the policy keeps nothing
of a block on the device (``full``, ``nested``, ...), where each op's kept pieces would be many
times what the policy keeps. That holds for a model whose weights all train: GPT-2 124M's
per-example gradients are about 14 MB an example a layer in bf16, its layer's input 1.5 MB at
T 1024. It does not hold for LoRA: ``llama-1b``'s adapters of rank 16 on q, v and the MLP are
1.2 MB an example a layer, its layer's input 4 MB, and a second forward and backward of the
1B base cost DP-LoRA 1.97x the non-private step on a TPU v5e (2026-12-08,
``benchmarks/device/RESULTS.md``). So under such a policy :func:`resolve_method` still takes
book-keeping when its pieces (:func:`kept_bytes`: every tap's output as the step's book-keeping
tap pass makes it) are at most what the policy keeps anyway (:func:`carried_bytes`: each
layer's input), so that book-keeping at most doubles the policy's own memory. Both are read
from abstract shapes: nothing here runs a device.
"""

from __future__ import annotations

import jax

from zoo.dp.ghost.stages import GhostPlan, choose_method, prepare, site_avals, tap_plan
from zoo.models import canonical


def kept_bytes(gp: GhostPlan, full, x, dense: str | None = None) -> int:
    """The bytes a book-keeping tap pass on ``x`` keeps for the clipped sum: every active
    site's tap outputs (its norms and the pieces its clipped sum needs, in the forms the step
    picks) and the inputs its forward captures (a token table's ids), times the layers of a
    stacked site."""
    plan, avals = tap_plan(gp, full, x, dense, sums=True), site_avals(gp, full, x)
    total = 0
    for key, slot in plan.slots.items():
        kept = [slot, avals[key][0]] if plan.taps[key].capture else [slot]
        total += _nbytes(kept) * (plan.stacked[key] or 1)
    return total


def _nbytes(tree) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def carried_bytes(gp: GhostPlan, x) -> int:
    """What a policy that keeps nothing of a block keeps anyway: each trained layer's input,
    ``[B, T, d_model]`` in the compute dtype; 0 for a model without a ``d_model``-wide stream
    over a sequence (the policy's rule then stands)."""
    width = getattr(gp.cfg, "d_model", 0)
    if not width or x.ndim < 2:
        return 0
    layers = gp.cfg.num_layers - gp.prefix
    return x.shape[0] * x.shape[1] * width * gp.precision.compute_dtype.itemsize * layers


def resolve_method(gp: GhostPlan, full, x, method: str = "auto", dense: str | None = None) -> str:
    """``"bookkeeping"`` or ``"backward"`` for a step of plan ``gp`` on ``x`` (``full``: the
    params, arrays or shapes): :func:`choose_method`, except that ``"auto"`` under a policy
    that keeps nothing of a block takes book-keeping when :func:`kept_bytes` is at most
    :func:`carried_bytes`. A forced method stands."""
    chosen = choose_method(gp.policy, method)
    if method != "auto" or chosen == "bookkeeping":
        return chosen
    carried = carried_bytes(gp, x)
    return "bookkeeping" if carried and kept_bytes(gp, full, x, dense) <= carried else chosen


def method_for(cfg, x, freeze=None, remat="none", precision=None, method: str = "auto") -> str:
    """:func:`resolve_method` from a model config alone (its params' shapes), as a step of
    ``cfg`` on inputs like ``x`` would resolve it: what a benchmark row says it ran."""
    gp = prepare(cfg, x, freeze, remat, precision)
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    return resolve_method(gp, shapes, x, method)
