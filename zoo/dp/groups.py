"""Clipping styles: which parameters share one clip factor (``dp.clipping_style``).

Each example's gradient is cut into groups of parameters; group ``g``'s part is scaled by
``min(1, C_g / ||g_i,g||)`` with its own threshold ``C_g``. One example then moves the clipped
sum by at most ``sqrt(sum_g C_g^2)`` in L2 norm. zoo keeps ``dp.clip_norm`` (``C``) that
sensitivity for every style: the thresholds are shares of it, ``C_g = C * s_g`` with
``sum_g s_g^2 = 1``, so the noise std is ``noise_multiplier * C`` and the accountant (which
sees only the noise multiplier, the sampling rate and the steps) gives the same epsilon for
every style.

* ``"all-layer"`` (default): one group, every trainable parameter, ``C_1 = C``: flat clipping,
  the code path of zoo before styles, unchanged.
* ``"layer-wise"``: one group per *op* in each layer: the leaves of one op (a dense layer's
  ``w`` and ``b``, a norm's ``scale`` and ``b``, a table) in one layer of the stack, as fastDP
  groups a module's weight and bias (``clipping_style='layer-wise'``: "each layer is a block,
  including both weight and bias parameters"; Opacus's ``per_layer`` clips each parameter
  tensor alone, fastDP's ``param-wise``). A leaf read by two ops (a head tied to the token
  table) is one parameter, so one group. ``C_g = C / sqrt(G)``, as fastDP divides it.
* ``"block-wise"``: named groups of ``dp.clip_groups``, each ``"name = pattern|pattern"`` over
  canonical paths in the freeze patterns' syntax (``embed|pos|head``, ``blocks[0:6]``,
  ``*.b``: :mod:`zoo.freeze`); they must cover every trainable leaf (and stacked row) exactly
  once. ``dp.clip_group_weights`` (one per group, default all 1) are relative thresholds:
  ``s_g = w_g / sqrt(sum w^2)``.

The groups are a function of the model's structure and the settings only (never of data).
:meth:`ClipStyle.resolve` makes them against the trainable tree (:func:`members`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from zoo.checks import is_number
from zoo.dp.factors import clip_factor
from zoo.errors import ZooError, choice_error
from zoo.freeze.patterns import parse_pattern
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import STACK
from zoo.precision import float32_scope

__all__ = [
    "ALL_LAYER",
    "STYLES",
    "ClipStyle",
    "Groups",
    "group_weights",
    "grouped_sum",
    "members",
    "style_summary",
]

STYLES = ("all-layer", "layer-wise", "block-wise")


@dataclass(frozen=True)
class ClipStyle:
    """A clipping style and its settings (``dp.clipping_style``, ``dp.clip_groups``,
    ``dp.clip_group_weights``), checked when made; part of the mechanism (what is released)."""

    style: str = "all-layer"
    groups: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self):
        if self.style not in STYLES:
            raise choice_error("dp.clipping_style", self.style, STYLES)
        if self.style != "block-wise" and (self.groups or self.weights):
            raise ZooError(
                f"dp.clip_groups and dp.clip_group_weights are block-wise settings; "
                f"dp.clipping_style is {self.style!r} (set it to 'block-wise', or unset the groups)"
            )
        if self.style == "block-wise":
            self.blocks()  # names and patterns parse
            if not self.groups:
                raise ZooError(
                    "dp.clipping_style = 'block-wise' needs dp.clip_groups, e.g. 'embed = embed|pos'"
                )
            if self.weights and len(self.weights) != len(self.groups):
                raise ZooError(
                    f"dp.clip_group_weights has {len(self.weights)} values for {len(self.groups)} "
                    "dp.clip_groups: give one per group, or none (equal thresholds)"
                )
            bad = [w for w in self.weights if not (is_number(w) and math.isfinite(w) and w > 0)]
            if bad:
                raise ZooError(f"dp.clip_group_weights must be finite numbers > 0; got {bad[0]!r}")

    @classmethod
    def of(cls, dp) -> ClipStyle:
        """The style of a ``[dp]`` section."""
        return cls(dp.clipping_style, tuple(dp.clip_groups), tuple(float(w) for w in dp.clip_group_weights))

    @property
    def flat(self) -> bool:
        """One group (all-layer): the clipping methods take their flat path, unchanged."""
        return self.style == "all-layer"

    def blocks(self) -> tuple[tuple[str, tuple], ...]:
        """``((name, parsed patterns), ...)`` of a block-wise style."""
        out, names = [], set()
        for text in self.groups:
            name, sep, patterns = str(text).partition("=")
            name = name.strip()
            if not sep or not name or not patterns.strip():
                raise ZooError(
                    f"dp.clip_groups entry {text!r} is not 'name = pattern|pattern' "
                    "(e.g. 'lower = blocks[0:6]', 'rest = embed|pos|blocks[6:]|final_norm|head')"
                )
            if name in names:
                raise ZooError(f"dp.clip_groups names the group {name!r} twice")
            names.add(name)
            out.append((name, tuple(parse_pattern(p.strip()) for p in patterns.split("|"))))
        return tuple(out)

    def resolve(self, found: dict) -> Groups:
        """The groups over ``found`` (:func:`members`: ``{path: None or the layer of each row}``)."""
        if self.style == "all-layer":
            return Groups(("all",), (1.0,), {p: _fill(rows, 0) for p, rows in found.items()})
        if self.style == "layer-wise":
            return _layer_wise(found)
        return _block_wise(self, found)


ALL_LAYER = ClipStyle()


@dataclass(frozen=True)
class Groups:
    """Resolved groups: ``names``, ``shares`` (``s_g``, ``sum s_g^2 = 1``) and ``index``:
    ``{path: group of the leaf (int), or of each row of a stacked leaf (int array; -1: a row
    that gets no gradient)}`` over the trainable tree's paths."""

    names: tuple[str, ...]
    shares: tuple[float, ...]
    index: dict

    @property
    def count(self) -> int:
        return len(self.names)

    def thresholds(self, clip_norm: float) -> dict[str, float]:
        """``{name: C_g}`` for a static clip norm (the summary's, the audit's)."""
        return {n: float(clip_norm) * s for n, s in zip(self.names, self.shares, strict=True)}

    def onehot(self, path: str) -> np.ndarray:
        """``[rows, G]`` (``[G]`` for a leaf without rows): 1 where a row is in a group."""
        idx = np.asarray(self.index[path])
        return (idx[..., None] == np.arange(self.count)).astype(np.float32)


def group_weights(groups: Groups, parts: dict, keep, clip_norm):
    """``({path: weights}, norms [U])`` from each leaf's per-example squared norms ``parts``
    (``{path: [U]}``, or ``[U, rows]`` for a stacked leaf). A group's weight is
    ``min(1, C_g / ||g_ig||)`` (:func:`zoo.dp.factors.clip_factor`), 0 where the example is
    masked or that group's norm is not finite; a leaf (row) gets its group's. ``norms``: the
    pre-clip global norms (0 where masked)."""
    with float32_scope("f32_clip_factors"):
        sq = jnp.zeros((keep.shape[0], groups.count), jnp.float32)
        for path, part in parts.items():
            sq = sq + part.astype(jnp.float32).reshape(part.shape[0], -1) @ groups.onehot(path).reshape(
                -1, groups.count
            )
        norms = jnp.sqrt(sq)
        limits = jnp.asarray(clip_norm, jnp.float32) * jnp.asarray(groups.shares, jnp.float32)
        use = keep[:, None] & jnp.isfinite(norms)
        factors = jnp.where(use, clip_factor(norms, limits), 0.0)
        weights = {
            path: (factors @ groups.onehot(path).reshape(-1, groups.count).T).reshape(part.shape)
            for path, part in parts.items()
        }
        total = jnp.sqrt(jnp.sum(sq, axis=1))
    return weights, jnp.where(keep, total, 0.0)


def grouped_sum(grads, groups: Groups, clip, keep):
    """``(sum_i sum_g f_ig g_ig, pre-clip global norms [k])`` of per-example ``grads`` (a
    canonical tree, each leaf ``[k, ...]``), group ``g`` scaled by ``min(1, C_g / ||g_ig||)``
    and dropped where that norm is not finite (:func:`zoo.dp.groups.group_weights`)."""
    flat = flat_by_path(grads)
    with float32_scope("f32_per_example_norms"):
        parts = {}
        for path, g in flat.items():
            axes = tuple(range(1 if np.ndim(groups.index[path]) == 0 else 2, g.ndim))
            parts[path] = jnp.sum(jnp.square(g.astype(jnp.float32)), axis=axes)  # [k] or [k, rows]
    weights, norms = group_weights(groups, parts, keep, clip)
    with float32_scope("f32_clipped_sum"):
        out = {}
        for path, g in flat.items():
            w = weights[path]  # [k] or [k, rows], 0 where the group's part is dropped
            w = w.reshape(w.shape + (1,) * (g.ndim - w.ndim))
            acc = jnp.promote_types(g.dtype, jnp.float32)  # a bf16 sum in float32
            out[path] = jnp.sum(jnp.where(w > 0, g.astype(acc) * w.astype(acc), jnp.zeros((), acc)), axis=0)
    return nest_by_path(out), norms


def members(trainable, freeze=None, prefix: int = 0) -> dict:
    """``{path: None}`` for each trainable leaf, ``{path: (layer of row 0, layer of row 1,
    ...)}`` for a stacked one (the rows the trainable tree holds: the freeze plan's trainable
    rows, else all), a layer below the stack's frozen ``prefix`` as ``-1`` (no gradient)."""
    found = {}
    for path, leaf in flat_by_path(trainable).items():
        if not path.startswith(STACK + "."):
            found[path] = None
            continue
        rows = None
        if freeze is not None and path in freeze.shapes:
            rows = freeze.trainable_rows(path)
        rows = tuple(range(np.shape(leaf)[0])) if rows is None else tuple(rows)
        found[path] = tuple(r if r >= prefix else -1 for r in rows)
    return found


def _fill(rows, g):
    return g if rows is None else np.where(np.asarray(rows) >= 0, g, -1)


def _equal(names) -> tuple[float, ...]:
    return (1.0 / math.sqrt(len(names)),) * len(names)


def _op(path: str) -> str:
    return path.rsplit(".", 1)[0]


def _layer_wise(found: dict) -> Groups:
    """One group per op (a leaf's parent path) and, in the stack, per layer."""
    keys: dict[str, int] = {}
    index = {}
    for path, rows in found.items():
        if rows is None:
            index[path] = keys.setdefault(_op(path), len(keys))
        else:
            index[path] = np.asarray(
                [
                    -1 if r < 0 else keys.setdefault(f"{STACK}[{r}]{_op(path)[len(STACK) :]}", len(keys))
                    for r in rows
                ]
            )
    names = tuple(keys)
    return Groups(names, _equal(names), index)


def _block_wise(style: ClipStyle, found: dict) -> Groups:
    """The named groups of ``dp.clip_groups``: each trainable leaf (row) in exactly one."""
    blocks = style.blocks()
    names = tuple(name for name, _ in blocks)
    depth = 1 + max((max(r) for r in found.values() if r), default=-1)
    index, used = {}, set()
    for path, rows in found.items():
        slots = [None] if rows is None else list(rows)
        picked = []
        for slot in slots:
            hits = [
                (name, p.text)
                for name, patterns in blocks
                for p in patterns
                if p.selects(path) and (slot is None or p.layers is None or slot in p.rows(depth))
            ]
            groups = sorted({name for name, _ in hits})
            where = path if slot is None else f"{path} (layer {slot})"
            if slot is not None and slot < 0:
                picked.append(-1)
                continue
            if not groups:
                raise ZooError(
                    f"dp.clip_groups leave the trainable parameter {where} in no group; "
                    f"the groups: {', '.join(style.groups)}"
                )
            if len(groups) > 1:
                raise ZooError(
                    f"dp.clip_groups overlap: {where} is in {' and '.join(repr(g) for g in groups)} "
                    f"(patterns {', '.join(repr(t) for _, t in hits)})"
                )
            used.add(groups[0])
            picked.append(names.index(groups[0]))
        index[path] = picked[0] if rows is None else np.asarray(picked)
    empty = [n for n in names if n not in used]
    if empty:
        raise ZooError(f"dp.clip_groups: the group {empty[0]!r} holds no trainable parameter")
    weights = np.asarray(style.weights or (1.0,) * len(names), np.float64)
    shares = tuple(float(w) for w in weights / np.sqrt(np.sum(weights**2)))
    return Groups(names, shares, index)


def style_summary(style: ClipStyle, freeze, clip_norm: float) -> dict:
    """What a run's summary and ``zoo audit`` say of its clipping: ``{"style", "groups",
    "thresholds": {name: C_g}}`` over the trainable leaves of ``freeze`` (a
    :class:`zoo.freeze.FreezePlan`); ``sensitivity``: ``sqrt(sum C_g^2)``, ``clip_norm``."""
    found = {}
    for path in freeze.shapes:
        rows = freeze.trainable_rows(path)
        if rows is None and path not in freeze.frozen_leaves:
            found[path] = None
        elif rows:
            found[path] = tuple(rows)
    groups = style.resolve(found)
    return {
        "style": style.style,
        "groups": groups.count,
        "thresholds": {n: round(c, 6) for n, c in groups.thresholds(clip_norm).items()},
        "sensitivity": float(clip_norm),
    }
