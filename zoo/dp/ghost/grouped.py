"""Ghost clipping in a clipping style with several groups (layer-wise, block-wise:
:mod:`zoo.dp.groups`), in one forward and one backward.

A group that is one op in one layer (every group under ``"layer-wise"``, but the token table
with the head tied to it) needs only that op's norms for its clip factor. Its tap knows them
in the backward pass, so it forms the op's clipped sum right there (a *local* tap,
:func:`zoo.dp.ghost.taps.local_sum`) from the threshold and keep flags its slot brings in, and
hands out a parameter-sized sum: no per-example piece leaves the layer's step of the backward,
nothing is kept besides what the remat policy keeps, and no second pass runs.

The other groups (several ops, or a leaf two ops read) need norms from several layers of the
backward before any of their factors is known: their taps keep the book-keeping pieces
(:func:`zoo.dp.ghost.stages.tap_pass`), and after the pass each is summed with its own group's
factors (:func:`group_sums`). A second ordinary backward cannot serve them: one weighted loss
scales all of an example's parameters by one factor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from zoo.dp.ghost.rules import SHARED
from zoo.dp.ghost.stages import (
    GhostPlan,
    Kept,
    _rule,
    _run,
    add_grad,
    assemble,
    shared_sites,
    stacked_grad,
    tap_plan,
)
from zoo.dp.groups import Groups, group_weights
from zoo.losses import per_example_loss

__all__ = ["grouped_clip", "site_groups"]


def site_groups(gp: GhostPlan, groups: Groups, found: dict) -> dict:
    """``{site key: {leaf: group}}``: an int for a top-level site, an int array over the
    stack's scanned layers (``L - prefix``; -1: no gradient) for a stacked one."""
    layers = gp.cfg.num_layers - gp.prefix
    out = {}
    for site in gp.active:
        mine = {}
        for leaf in site.leaves:
            path = f"{site.path}.{leaf}"
            if not site.stacked:
                mine[leaf] = int(groups.index[path])
                continue
            per_layer = np.full(gp.cfg.num_layers, -1)
            for row, g in zip(found[path], np.asarray(groups.index[path]), strict=True):
                if row >= 0:
                    per_layer[row] = g
            mine[leaf] = per_layer[gp.prefix :]
            assert mine[leaf].shape == (layers,)
        out[site.key] = mine
    return out


def local_sites(gp: GhostPlan, groups: Groups, by_site: dict) -> frozenset:
    """The sites that are, in each of their layers, one group of their own: all their leaves in
    one group that holds nothing else (a leaf two ops read never is)."""
    shared = {s.key for pair in shared_sites(gp) for s in pair}
    sizes = np.zeros(groups.count, int)
    for arr in groups.index.values():
        idx = np.atleast_1d(np.asarray(arr))
        np.add.at(sizes, idx[idx >= 0], 1)
    local = set()
    for site in gp.active:
        if site.key in shared:
            continue
        rows = np.stack([np.atleast_1d(by_site[site.key][leaf]) for leaf in site.leaves])  # [leaves, rows]
        same = np.all(rows == rows[0], axis=0)
        alone = np.array([g < 0 or sizes[g] == len(site.leaves) for g in rows[0]])
        if np.all(same & alone):
            local.add(site.key)
    return frozenset(local)


def _ctl(gp: GhostPlan, groups: Groups, group_of, keep, clip_norm, stacked: bool) -> dict:
    """A local tap's slot value: its threshold ``C_g`` (per layer in the stack) and keep flags."""
    shares = np.asarray((*groups.shares, 0.0), np.float32)  # -1 (no gradient): threshold 0
    limit = jnp.asarray(clip_norm, jnp.float32) * shares[np.asarray(group_of)]
    flags = keep.astype(jnp.float32)
    if stacked:
        flags = jnp.broadcast_to(flags, (limit.shape[0], *flags.shape))
    return {"limit": limit, "keep": flags}


def grouped_clip(
    gp: GhostPlan, full, x, y, *, groups: Groups, found: dict, keep, clip_norm, dense=None, row_weights=None
):
    """``(clipped sum, pre-clip norms [U], losses [B])`` with each group clipped to its own
    threshold, in one forward and one backward (``found``: :func:`zoo.dp.groups.members` of the
    trainable tree the groups were resolved over; ``keep`` [U] the keep flags)."""
    by_site = site_groups(gp, groups, found)
    local = local_sites(gp, groups, by_site)
    plan = tap_plan(gp, full, x, dense, sums=True, local=local)
    slots = plan.zeros()
    for site in gp.active:
        if site.key in local:
            group_of = by_site[site.key][site.leaves[0]]
            slots[site.key]["ctl"] = _ctl(gp, groups, group_of, keep, clip_norm, site.stacked)

    def losses_of(values):
        logits, top = _run(gp, full, x, "tap", values, plan.taps)
        return per_example_loss(logits, y), top.captures

    losses, vjp, captures = jax.vjp(losses_of, slots, has_aux=True)
    (out,) = vjp(jnp.ones_like(losses) if row_weights is None else row_weights)
    kept = Kept(plan, out, captures)
    weights, norms = group_weights(_Sites(gp, groups, by_site), _parts(gp, out), keep, clip_norm)
    sums = {}
    for site in gp.active:
        if site.key in local:
            for leaf, g in out[site.key]["sum"].items():
                path = f"{site.path}.{leaf}"
                sums[path] = stacked_grad(gp, g) if site.stacked else g
        else:
            for path, g in group_sums(gp, kept, site, weights).items():
                add_grad(sums, path, g)
    return assemble(gp, full, sums), norms, losses


def _parts(gp: GhostPlan, out: dict) -> dict:
    """Each site leaf's per-example squared norms (``[U]``, or ``[U, layers]`` in the stack),
    keyed ``(site key, leaf)``, and each shared leaf's cross term ``2 <g_first, g_second>``."""
    parts = {}
    for site in gp.active:
        sq = out[site.key]["sq"]
        for j, leaf in enumerate(site.leaves):
            parts[(site.key, leaf)] = sq[..., j].T if site.stacked else sq[:, j]
    for first, second in shared_sites(gp):
        cross = SHARED[(first.kind, second.kind)].join(out[first.key]["cross"], out[second.key]["cross"])
        parts[(first.key, "cross")] = 2 * cross
    return parts


class _Sites:
    """The groups as :func:`zoo.dp.groups.group_weights` reads them, keyed by ``(site key,
    leaf)`` (a shared leaf's cross term: ``(first site key, "cross")``, the leaf's group)."""

    def __init__(self, gp: GhostPlan, groups: Groups, by_site: dict):
        self.count, self.shares, self._by_site = groups.count, groups.shares, by_site
        self._cross = {first.key: by_site[first.key][first.leaves[0]] for first, _ in shared_sites(gp)}

    def onehot(self, key) -> np.ndarray:
        site, leaf = key
        idx = np.asarray(self._cross[site] if leaf == "cross" else self._by_site[site][leaf])
        return (idx[..., None] == np.arange(self.count)).astype(np.float32)


def group_sums(gp: GhostPlan, kept: Kept, site, weights: dict) -> dict:
    """``{path: sum_i w_i g_i}`` of a site that kept its pieces, each leaf with its own group's
    weights (``weights[(site key, leaf)]``: ``[U]``, or ``[U, layers]`` in the stack); a leaf
    whose weights are another leaf's shares that leaf's sum."""
    rule = _rule(gp, kept, site)
    out = {}
    for leaf in site.leaves:
        w = weights[(site.key, leaf)]
        if site.stacked:
            g = jax.lax.map(lambda rw, leaf=leaf: rw[0].grad(rw[1], rw[1] > 0)[leaf], (rule, w.T))
            out[f"{site.path}.{leaf}"] = stacked_grad(gp, g)
        else:
            out[f"{site.path}.{leaf}"] = rule.grad(w, w > 0)[leaf]
    return out
