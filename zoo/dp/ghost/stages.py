"""The stages of one ghost-clipped step, on the sites found by tracing the model.

Book-keeping: :func:`prepare` -> :func:`probe_pass` -> :func:`squared_norms` ->
:func:`clip_factors` -> :func:`book_kept_sum`.
Second backward: :func:`prepare` -> :func:`tap_pass` -> :func:`clip_factors` ->
:func:`weighted_backward`. ``benchmarks/dp/ghost.py`` times the stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from zoo.checks import require_choice
from zoo.dp import clipping
from zoo.dp.ghost import forms
from zoo.dp.ghost.rules import SHARED, build, grouped
from zoo.dp.ghost.sites import Site, coverage_problem, discover, run
from zoo.losses import per_example_loss
from zoo.models.canonical import canonical_shapes
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import STACK, ModelConfig
from zoo.precision import FLOAT32, Precision, get_precision
from zoo.remat import RematPolicy
from zoo.scan import StackPlan, as_plan

METHODS = ("auto", "bookkeeping", "backward")


def choose_method(remat="none", method: str = "auto") -> str:
    """``"auto"`` -> ``"bookkeeping"`` without remat (fastest; keeps every op's input and
    output gradient: more temp memory than the non-private step; ``docs/ghost.md``), ``"backward"`` under a remat policy
    (taps and a second forward and backward: the non-private temp memory under that same
    policy, where book-keeping would hold all layers' activations and undo the remat)."""
    require_choice("ghost clipping method", method, METHODS)
    if method != "auto":
        return method
    return "backward" if as_plan(remat).policy.checkpoint else "bookkeeping"


def _trainable_rows(plan, dotted: str, num_layers: int, prefix: int) -> np.ndarray | bool:
    """Stacked leaf: bool [L - prefix] of trainable rows; other leaves: one bool."""
    if plan is None:
        return np.ones(num_layers - prefix, bool) if dotted.startswith(STACK + ".") else True
    status = plan.trainable_rows(dotted)
    if status is None:
        return dotted not in plan.frozen_leaves
    rows = np.zeros(num_layers, bool)
    rows[list(status)] = True
    return rows[prefix:]


@dataclass(frozen=True)
class GhostPlan:
    """Static choices for one call: the sites that need a probe or tap (those with a trainable
    leaf or row), their trainable rows, the frozen prefix of the stack and the remat policy.
    ``problem`` says why ghost clipping cannot run (unclaimed or doubly read leaves);
    ``precision`` is the policy the passes run the model under (:mod:`zoo.precision`);
    ``records`` the rows of one clipping unit (1: each row is an example; ``k``: users of
    ``k`` slots, :mod:`zoo.dp.ghost.units`)."""

    cfg: ModelConfig
    active: tuple[Site, ...]
    rows: tuple  # ((site path, ((leaf, bool rows or bool), ...)), ...)
    prefix: int
    policy: RematPolicy
    freeze: object  # FreezePlan | None
    problem: str | None = None
    precision: Precision = FLOAT32
    records: int = 1

    def rows_of(self, path: str) -> dict:
        return dict(dict(self.rows)[path])

    @property
    def stack_plan(self) -> StackPlan:
        return StackPlan(self.policy, self.prefix)


def prepare(cfg: ModelConfig, x, plan=None, remat="none", precision=None, records: int = 1) -> GhostPlan:
    """Trace the model on inputs shaped like ``x``; keep the sites with a trainable leaf (stacked:
    row), and check that every trainable leaf is claimed by exactly one site. ``records``: the
    rows of ``x`` that make one clipping unit."""
    stack = as_plan(remat)
    num_layers = cfg.num_layers
    prefix = max(stack.frozen_prefix, plan.frozen_prefix if plan is not None else 0)
    prefix = min(prefix, num_layers)
    sites, unknown = discover(cfg, x, prefix)
    trainable = set()
    for path in canonical_shapes(cfg):
        if np.any(_trainable_rows(plan, path, num_layers, prefix)):
            trainable.add(path)
    problem = coverage_problem(sites, unknown, trainable)
    rows, active = [], []
    for site in sites:
        site_rows = []
        for leaf in site.leaves:
            r = _trainable_rows(plan, f"{site.path}.{leaf}", num_layers, prefix)
            if np.any(r):
                site_rows.append((leaf, r))
        if site_rows:
            leaves = tuple(k for k, _ in site_rows)
            active.append(Site(site.path, site.kind, leaves, site.stacked, site.shape, site.rows))
            rows.append((site.path, tuple(site_rows)))
    return GhostPlan(
        cfg,
        tuple(active),
        tuple(rows),
        prefix,
        stack.policy,
        plan,
        problem,
        get_precision(precision),
        records,
    )


def _run(gp: GhostPlan, params, x, *hooks):
    """``run`` of the model on ``params`` and ``x`` under the plan's precision policy: the cast
    is inside, so a gradient through it reaches the params in their own dtype."""
    return gp.precision.apply(lambda p, xc: run(gp.cfg, p, xc, gp.stack_plan, *hooks))(params, x)


def _zeros_per_site(gp: GhostPlan, shape_of, dtypes=None) -> dict:
    layers = gp.cfg.num_layers - gp.prefix
    dtypes = dtypes or {}
    return {
        s.key: jnp.zeros(((layers,) if s.stacked else ()) + shape_of(s), dtypes.get(s.key, jnp.float32))
        for s in gp.active
    }


def _output_dtypes(gp: GhostPlan, full, x) -> dict:
    """Each probed site's output dtype under the plan's precision (one abstract trace): its
    probe's, so that the output gradient the probe hands back is the backward's own (bf16 in a
    bf16 step, float32 for float32 logits), not widened to float32."""
    found = {}

    def trace(p, xs):
        _, top = _run(gp, p, xs, "probe", _zeros_per_site(gp, lambda s: s.shape))
        found.update(top.found.get("dtypes", {}))
        return 0

    jax.eval_shape(trace, full, x)
    return found


def probe_pass(gp: GhostPlan, full, x, y, row_weights=None):
    """One forward and one activation-only backward of ``sum_i L_i`` (``sum_i row_weights_i
    L_i`` when given: a unit's slot weights) with respect to the probes (the parameters are
    constants here).  Returns ``(losses [B], captures, deltas)``."""
    probes = _zeros_per_site(gp, lambda s: s.shape, _output_dtypes(gp, full, x))

    def losses_of(pr):
        logits, top = _run(gp, full, x, "probe", pr)
        return per_example_loss(logits, y), top.captures

    losses, vjp, caps = jax.vjp(losses_of, probes, has_aux=True)
    (deltas,) = vjp(jnp.ones_like(losses) if row_weights is None else row_weights)
    return losses, caps, deltas


def tap_pass(gp: GhostPlan, full, x, y, dense=None, row_weights=None):
    """Forward and one activation-only backward (parameters constant) through norm taps, from
    ``row_weights`` (default ones) as :func:`probe_pass`.

    Returns ``(losses [B], sq [U])``: ``sq`` is what the taps' backward rules collected, the
    per-example (per-unit: ``U = B / gp.records``) squared gradient norms over the trainable
    leaves and rows.  Only what the remat policy saves is kept for the backward.
    """
    units = x.shape[0] // gp.records
    choice = forms.Choice(dense, sums=False)  # the clipped sum comes from the second backward
    specs = {s.key: (s.kind, s.leaves, s.rows, choice, gp.records) for s in gp.active}
    taps = _zeros_per_site(gp, lambda s: (units, len(s.leaves)))

    def losses_of(tp):
        logits, _ = _run(gp, full, x, "tap", tp, specs)
        return per_example_loss(logits, y)

    losses, vjp = jax.vjp(losses_of, taps)
    (collected,) = vjp(jnp.ones_like(losses) if row_weights is None else row_weights)
    sq = jnp.zeros((units,), jnp.float32)
    for site in gp.active:
        got = collected[site.key]
        for j, r in enumerate(gp.rows_of(site.path).values()):
            sq = sq + (jnp.asarray(r, jnp.float32) @ got[..., j] if site.stacked else got[:, j])
    return losses, sq


def weighted_backward(gp: GhostPlan, params, frozen, x, y, weights):
    """``sum_i weights_i grad L_i`` on the trainable ``params``: a plain forward and backward."""

    def weighted_loss(trainable):
        merged = gp.freeze.merge(trainable, frozen) if gp.freeze is not None else trainable
        logits, _ = _run(gp, merged, x)
        return jnp.sum(weights * per_example_loss(logits, y))

    return jax.grad(weighted_loss)(params)


def squared_norms(gp: GhostPlan, caps, deltas, batch_size: int, dense=None):
    """``(sum over trainable leaves of ||g_i||^2 [B], rules)``; stacked sites vmap over layers.
    ``batch_size`` counts examples (units: rows / ``gp.records``)."""
    sq = jnp.zeros((batch_size,), jnp.float32)
    rules = {}
    choice = forms.Choice(dense, sums=True)  # the clipped sum comes from the same pieces
    for site in gp.active:

        def make(inputs, delta, s=site):
            rule = build(s.kind, inputs, delta, s.leaves, s.rows, choice, gp.records)
            return rule.sq(), rule

        if site.stacked:
            rule_sq, rule = jax.vmap(make)(caps.get(site.key), deltas[site.key])
            parts = [jnp.asarray(r, jnp.float32) @ rule_sq[leaf] for leaf, r in gp.rows_of(site.path).items()]
        else:
            rule_sq, rule = make(caps.get(site.key), deltas[site.key])
            parts = list(rule_sq.values())
        for part in parts:
            sq = sq + part
        rules[site.key] = rule
    for first, second in shared_sites(gp):  # a leaf read by two ops: |g1 + g2|^2's cross term
        cross = SHARED[(first.kind, second.kind)]
        pairs = [grouped(s.kind, caps[s.key], deltas[s.key], gp.records) for s in (first, second)]
        sq = sq + 2 * cross(*pairs[0], *pairs[1])
    return sq, rules


def shared_sites(gp: GhostPlan) -> list[tuple[Site, Site]]:
    """The pairs of active sites that read the same leaf (``rules.SHARED``), in trace order."""
    by_path = {}
    for site in gp.active:
        by_path.setdefault(site.path, []).append(site)
    return [tuple(sites) for sites in by_path.values() if len(sites) == 2]


def clip_factors(sq, keep, l2_clip_norm):
    """``(norms, weights, use)`` exactly as the vmap path: factor min(1, C/||g||) (1 for a
    zero norm), 0 for masked or non-finite examples; masked examples report norm 0."""
    norms = jnp.sqrt(sq)
    factor = clipping.clip_factor(norms, l2_clip_norm)
    use = keep & jnp.isfinite(norms)
    return jnp.where(keep, norms, 0.0), jnp.where(use, factor, 0.0), use


def book_kept_sum(gp: GhostPlan, full, rules, weights, use):
    """``sum_i f_i g_i`` per op from the captured inputs and output gradients, returned in the
    structure of the trainable tree. Frozen leaves get placeholders that the split drops; a
    trainable leaf without a site cannot reach here (:func:`prepare` checks coverage)."""
    out = {}
    for site in gp.active:
        rule = rules[site.key]
        if site.stacked:
            for leaf, g in jax.vmap(lambda r: r.grad(weights, use))(rule).items():
                if gp.prefix:
                    g = jnp.concatenate([jnp.zeros((gp.prefix, *g.shape[1:]), g.dtype), g])
                out[f"{site.path}.{leaf}"] = g
        else:
            for leaf, g in rule.grad(weights, use).items():
                path = f"{site.path}.{leaf}"
                out[path] = out[path] + g if path in out else g  # a shared leaf sums both ops
    for path, p in flat_by_path(full).items():
        out[path] = out[path].astype(jnp.result_type(p)) if path in out else jnp.zeros_like(p)
    grads = nest_by_path(out)
    if gp.freeze is not None:
        grads = gp.freeze.split(grads)[0]
    return grads
