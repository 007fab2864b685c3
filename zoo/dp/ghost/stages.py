"""The stages of one ghost-clipped step, on the sites found by tracing the model.

Book-keeping: :func:`prepare` -> :func:`tap_pass` (``sums=True``: each op's norms taken in the
backward pass, and what its clipped sum needs handed out of it) -> :func:`clip_factors` ->
:func:`kept_sum`.
Second backward: :func:`prepare` -> :func:`tap_pass` (norms only) -> :func:`clip_factors` ->
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
from zoo.dp.ghost.rules import RULES, SHARED
from zoo.dp.ghost.sites import Site, coverage_problem, discover, run
from zoo.dp.ghost.taps import FIRST, SECOND, Tap, rule_of, slot_of
from zoo.losses import per_example_loss
from zoo.models.canonical import canonical_shapes
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import STACK, ModelConfig
from zoo.precision import FLOAT32, Precision, get_precision
from zoo.remat import RematPolicy
from zoo.scan import StackPlan, as_plan

METHODS = ("auto", "bookkeeping", "backward")


def choose_method(remat="none", method: str = "auto") -> str:
    """``"auto"`` -> ``"bookkeeping"`` (one forward and one backward; each op's clipped-sum
    pieces kept in the compute dtype: :func:`tap_pass`) unless the remat policy keeps nothing
    of a block on the device (``full``, ``full-lean``, ``nested``, ``recursive``, the offloading
    ones), where those pieces would be many times the policy's memory: ``"backward"`` there
    (norms in one backward, then a second forward and backward of the weighted loss)."""
    require_choice("ghost clipping method", method, METHODS)
    if method != "auto":
        return method
    return "backward" if keeps_nothing(as_plan(remat).policy) else "bookkeeping"


def keeps_nothing(policy: RematPolicy) -> bool:
    """Whether a policy keeps no activation of a block on the device for the backward pass."""
    return policy.checkpoint and not policy.save_dots and not policy.saved_on_device


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


def site_avals(gp: GhostPlan, full, x) -> dict:
    """``{site key: (input, output)}`` as ``jax.ShapeDtypeStruct`` trees, one layer's for a
    stacked site, under the plan's precision (one abstract trace of the probe pass): the output
    dtype is what each probe (and slot) is made in."""
    found = {}

    def trace(p, xs):
        _, top = _run(gp, p, xs, "probe", _zeros_per_site(gp, lambda s: s.shape))
        found.update(top.found.get("avals", {}))
        return 0

    jax.eval_shape(trace, full, x)
    return found


def probe_pass(gp: GhostPlan, full, x, y, row_weights=None):
    """Every active op's input and output gradient: one forward and one activation-only
    backward of ``sum_i L_i`` (``sum_i row_weights_i L_i`` when given) with respect to zero
    probes added to the ops' outputs. Returns ``(losses [B], captures, deltas)``, stacked sites'
    with a leading layer axis. The step does not run it (every layer's pieces at once): the
    shapes of the forms' table (:mod:`zoo.dp.ghost.measure`), tests and benchmarks read it."""
    dtypes = {k: out.dtype for k, (_, out) in site_avals(gp, full, x).items()}
    probes = _zeros_per_site(gp, lambda s: s.shape, dtypes)

    def losses_of(pr):
        logits, top = _run(gp, full, x, "probe", pr)
        return per_example_loss(logits, y), top.captures

    losses, vjp, caps = jax.vjp(losses_of, probes, has_aux=True)
    (deltas,) = vjp(jnp.ones_like(losses) if row_weights is None else row_weights)
    return losses, caps, deltas


@dataclass(frozen=True)
class TapPlan:
    """The taps of one pass (:class:`zoo.dp.ghost.taps.Tap` by site key), their slots (one
    layer's, abstract) and, under book-keeping, each site's abstract rule (what rebuilds it)."""

    taps: dict
    slots: dict
    rules: dict
    stacked: dict  # site key -> layers of a stacked site, or 0

    def zeros(self) -> dict:
        """The slots, zeros with a leading layer axis for stacked sites (never read)."""
        return {
            key: jax.tree_util.tree_map(
                lambda a, n=n: jnp.zeros(((n,) if n else ()) + a.shape, a.dtype), slot
            )
            for key, slot, n in ((k, v, self.stacked[k]) for k, v in self.slots.items())
        }


def tap_plan(gp: GhostPlan, full, x, dense=None, sums: bool = False, local=frozenset()) -> TapPlan:
    """Each active site's tap on inputs shaped like ``x``: its norm form (``dense`` forces one),
    the pieces it keeps for the clipped sum when ``sums`` (book-keeping), and its half of a
    shared leaf's cross term. The sites in ``local`` (their keys) are clipping groups of their
    own: their taps sum (:func:`zoo.dp.ghost.taps.local_sum`) and keep nothing."""
    avals = site_avals(gp, full, x)
    halves = {}
    for first, second in shared_sites(gp):
        pair = (first.kind, second.kind)
        halves[first.key], halves[second.key] = (pair, FIRST), (pair, SECOND)
    partner = {second.key: first.key for first, second in shared_sites(gp)}
    choice = forms.Choice(dense, sums)
    layers = gp.cfg.num_layers - gp.prefix
    taps, slots, rules, stacked = {}, {}, {}, {}
    for site in gp.active:
        inputs, z = avals[site.key]
        if site.key in partner:  # the second reader of a shared leaf also gets the first's input
            inputs = (inputs, avals[partner[site.key]][0])
        mine = site.key in local
        keep = sums and not mine
        capture = keep and RULES[site.kind].needs_inputs
        spec = Tap(
            site.kind, site.leaves, site.rows, choice, gp.records, keep, halves.get(site.key), capture, mine
        )
        taps[site.key], slots[site.key] = spec, slot_of(spec, inputs, z, x.shape[0] // gp.records)
        if keep:
            rules[site.key] = rule_of(spec, inputs, z)
        stacked[site.key] = layers if site.stacked else 0
    return TapPlan(taps, slots, rules, stacked)


@dataclass(frozen=True)
class Kept:
    """What a book-keeping :func:`tap_pass` handed out: the taps' outputs by site key and the
    inputs the forward captured for them."""

    plan: TapPlan
    out: dict
    captures: dict


def tap_pass(gp: GhostPlan, full, x, y, dense=None, row_weights=None, sums: bool = False):
    """One forward and one activation-only backward (the parameters constant) of ``sum_i L_i``
    (``sum_i row_weights_i L_i`` when given: a unit's slot weights) through norm taps.

    Each op's per-example squared norms are taken in its own step of the backward pass, from
    its input (a residual, saved or recomputed as the remat policy says) and its output gradient
    (:mod:`zoo.dp.ghost.taps`). With ``sums`` (book-keeping) each tap also hands out what the
    op's clipped sum needs, in the compute dtype, for :func:`kept_sum`.

    Returns ``(losses [B], sq [U], kept)``: ``sq`` the per-example (per-unit: ``U = B /
    gp.records``) squared gradient norms over the trainable leaves and rows, cross terms of a
    shared leaf included; ``kept`` a :class:`Kept`.
    """
    plan = tap_plan(gp, full, x, dense, sums)

    def losses_of(slots):
        logits, top = _run(gp, full, x, "tap", slots, plan.taps)
        return per_example_loss(logits, y), top.captures

    losses, vjp, captures = jax.vjp(losses_of, plan.zeros(), has_aux=True)
    (out,) = vjp(jnp.ones_like(losses) if row_weights is None else row_weights)
    return losses, squared_norms(gp, out, x.shape[0] // gp.records), Kept(plan, out, captures)


def squared_norms(gp: GhostPlan, out: dict, units: int):
    """``sum over trainable leaves (and rows) of ||g_i||^2`` [U] from the taps' outputs, with
    ``2 <g_first, g_second>`` for each leaf read by two ops (``rules.SHARED``)."""
    sq = jnp.zeros((units,), jnp.float32)
    for site in gp.active:
        got = out[site.key]["sq"]
        for j, r in enumerate(gp.rows_of(site.path).values()):
            sq = sq + (jnp.asarray(r, jnp.float32) @ got[..., j] if site.stacked else got[:, j])
    for first, second in shared_sites(gp):
        cross = SHARED[(first.kind, second.kind)].join(out[first.key]["cross"], out[second.key]["cross"])
        sq = sq + 2 * cross
    return sq


def weighted_backward(gp: GhostPlan, params, frozen, x, y, weights):
    """``sum_i weights_i grad L_i`` on the trainable ``params``: a plain forward and backward."""

    def weighted_loss(trainable):
        merged = gp.freeze.merge(trainable, frozen) if gp.freeze is not None else trainable
        logits, _ = _run(gp, merged, x)
        return jnp.sum(weights * per_example_loss(logits, y))

    return jax.grad(weighted_loss)(params)


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


def _rule(gp: GhostPlan, kept: Kept, site: Site):
    """A site's rule made again from what its tap kept (and its captured input)."""
    template = kept.plan.rules[site.key]
    arrays = dict(kept.out[site.key]["kept"])
    if site.key in kept.captures:
        arrays.update(type(template).input_arrays(kept.captures[site.key], gp.records))
    return type(template).rebuild(template.static, arrays)


def kept_sum(gp: GhostPlan, full, kept: Kept, weights, use):
    """``sum_i f_i g_i`` per op from what the taps kept, returned in the structure of the
    trainable tree. A stacked site sums one layer at a time (``lax.map``), so what is widened to
    float32 for the sum is one layer's. Frozen leaves get placeholders that the split drops; a
    trainable leaf without a site cannot reach here (:func:`prepare` checks coverage)."""
    out = {}
    for site in gp.active:
        rule = _rule(gp, kept, site)
        if site.stacked:
            for leaf, g in jax.lax.map(lambda r: r.grad(weights, use), rule).items():
                out[f"{site.path}.{leaf}"] = stacked_grad(gp, g)
        else:
            for leaf, g in rule.grad(weights, use).items():
                add_grad(out, f"{site.path}.{leaf}", g)
    return assemble(gp, full, out)


def stacked_grad(gp: GhostPlan, g):
    """A stacked leaf's gradient ``[L - prefix, ...]`` with zeros for the frozen prefix."""
    if not gp.prefix:
        return g
    return jnp.concatenate([jnp.zeros((gp.prefix, *g.shape[1:]), g.dtype), g])


def add_grad(out: dict, path: str, g) -> None:
    """``out[path] += g`` (a shared leaf sums both ops' parts)."""
    out[path] = out[path] + g if path in out else g


def assemble(gp: GhostPlan, full, out: dict):
    """``out`` (``{path: summed gradient}``) as the trainable tree: the dtypes of ``full``,
    placeholders for frozen leaves that the split drops."""
    for path, p in flat_by_path(full).items():
        out[path] = out[path].astype(jnp.result_type(p)) if path in out else jnp.zeros_like(p)
    grads = nest_by_path(out)
    if gp.freeze is not None:
        grads = gp.freeze.split(grads)[0]
    return grads
