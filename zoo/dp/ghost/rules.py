"""Per-op norm rules: per-example squared gradient norms of one op's parameters, and the
clipped sum of its per-example gradients, from the op's input and output gradient.

One rule per op kind (``dense``, ``norm``, ``gather``, ``rows``), not per model. A rule works
on one (unstacked) layer; its arrays carry the example axis first, and it reads every axis
between that one and the feature axis as positions. Rules are pytrees (arrays as children, the
method and leaf names static), so stacked sites ``vmap`` them over layers.

An example may be a *unit* of several records (a user's slots, :mod:`zoo.dp.ghost.units`):
:func:`build` groups the op's rows ``[U * k, ...]`` as ``[U, k, ...]`` first
(:meth:`Rule.group`), so the unit's records become positions of one example.

A rule is built inside the backward pass, where the op's input and output gradient meet (a
norm tap, :mod:`zoo.dp.ghost.sites`): its norms are taken there, and what its clipped sum
needs (:meth:`Rule.kept`) leaves the pass in the step's compute dtype, never widened: a dense
op's ``(a, delta)`` for the Gram form, its per-example gradients for the materialised form.
After the clip factors are known, :meth:`Rule.rebuild` makes the rule again from those arrays
and :meth:`Rule.grad` sums, accumulating in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.dp.ghost import forms
from zoo.dp.ghost.forms import MATERIALISE_MIN_POSITIONS  # noqa: F401  (re-exported)
from zoo.dp.ghost.products import by_unit, compute_dtype, keep, materialised, weighted_product
from zoo.dp.ghost.products import dot as _dot
from zoo.dp.ghost.products import sq as _sq
from zoo.dp.ghost.products import wide as _wide


def dense_method(seq: int, d_in: int, d_out: int, sums: bool = False) -> str:
    """``"gram"`` or ``"materialise"`` for a dense op on a length-``seq`` sequence, by formula
    (:func:`zoo.dp.ghost.forms.formula`).

    Gram costs ~``seq^2 (d_in + d_out)`` per example and ``2 seq^2`` floats; materialising
    ``a^T delta`` costs ~``seq d_in d_out`` and ``d_in d_out`` floats, and its result also
    serves the clipped sum (no second weight-gradient matmul). For the norms alone
    (``sums=False``: the second-backward method) we materialise when that is at most the
    per-example size of the op's own activations, ``seq (d_in + d_out)`` -- which is exactly
    when it also takes fewer flops than the Gram form; with the clipped sum from the same
    pieces (``sums=True``: book-keeping) the materialised form has fewer flops at every shape.
    Either way only from :data:`MATERIALISE_MIN_POSITIONS` positions. Below that the Gram
    matrices are a few KiB an example, while the materialised contraction over so few
    positions writes a whole ``d_in x d_out`` block for every ``seq`` multiply-adds: on CPU,
    where the flops favoured it, it took 1.45 to 3.0 times the Gram form's time at 4 to 16
    positions (0.94 in one case; ``benchmarks/dp/ghost_forms.py``). A user of ``k``
    single-row records is ``k`` positions (:mod:`zoo.dp.ghost.units`).
    """
    return forms.formula(seq, d_in, d_out, sums)


def gather_method(seq: int, rows: int, width: int) -> str:
    """Token table: ``"gram"`` (token-equality-masked Gram, ~T^2 D per example) or
    ``"materialise"`` (scatter delta into a [V, D] table per example) when V D <= T^2."""
    return "materialise" if rows * width <= seq * seq else "gram"


def _as_sequence(x):
    """[B, ..., D] -> [B, T, D] (T = 1 without a position axis)."""
    return x.reshape(x.shape[0], -1, x.shape[-1])


class Rule:
    """``sq()`` -> {leaf: [B]}; ``grad(weights, use)`` -> {leaf: summed gradient}, ``weights``
    [B] the clip factors (0 where ``use`` is False). ``kept()`` -> the floating arrays
    ``grad`` reads, as they leave the backward pass; :meth:`rebuild` makes the rule from them
    (and from :meth:`input_arrays`, what the op's input gives that is no floating array)."""

    static: object = ()
    arrays: dict
    needs_inputs = False  # whether :meth:`input_arrays` gives anything

    def kept(self) -> dict:
        return {k: v for k, v in self.arrays.items() if jnp.issubdtype(v.dtype, jnp.inexact)}

    @classmethod
    def input_arrays(cls, inputs, records: int) -> dict:
        """The arrays :meth:`kept` leaves out, from the op's input (captured in the forward)."""
        del inputs, records
        return {}

    @classmethod
    def rebuild(cls, static, arrays: dict):
        """The rule whose :meth:`grad` reads ``arrays`` (:meth:`kept` and :meth:`input_arrays`)."""
        rule = object.__new__(cls)
        rule.static, rule.arrays = static, dict(arrays)
        return rule

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, cls._flatten, cls._unflatten)

    @classmethod
    def group(cls, inputs, d, records: int):
        """``(inputs, d)`` of units of ``records`` rows: the records' axis placed after the
        unit's, read by the rule as positions. A unit's gradient is the sum of its records'
        (their output gradients carry the slot weights), and each per-record gradient is a sum
        over its positions, so the unit's is the same sum over all of its records' positions."""
        return by_unit(inputs, records), by_unit(d, records)

    def _flatten(self):
        keys = tuple(sorted(self.arrays))
        return tuple(self.arrays[k] for k in keys), (keys, self.static)

    @classmethod
    def _unflatten(cls, aux, children):
        rule = object.__new__(cls)
        keys, rule.static = aux
        rule.arrays = dict(zip(keys, children, strict=True))
        return rule


class Dense(Rule):
    """``z = a @ w (+ b)``: a [B, d_in] or [B, T, d_in], delta [B, (T,) d_out]."""

    def __init__(self, a, d, leaves, rows=None, force=None):
        del rows
        if a.ndim == 2:
            method = "flat"
            a, d = a.astype(jnp.float32), d.astype(jnp.float32)
        else:
            dtype = compute_dtype(a, d)
            a, d = _as_sequence(a).astype(dtype), _as_sequence(d)
            choice = forms.as_choice(force)
            method = choice.pick(self.kind, a.shape[0], a.shape[1], a.shape[-1], d.shape[-1], dtype)
        self.static = (method, tuple(leaves))
        if "b" in leaves:  # before d is read in the compute dtype: the bias sums the gradient itself
            gb = d if d.ndim == 2 else d.sum(axis=1, dtype=jnp.float32)
        d = d.astype(a.dtype)
        if method == "materialise" and "w" in leaves:
            g, sq = materialised(a, d)
            self.arrays = {"g": g, "sq": sq}
        elif "w" in leaves:
            self.arrays = {"a": a, "d": d}
        else:
            self.arrays = {}
        if "b" in leaves:
            self.arrays["gb"] = gb

    kind = "dense"

    def sq(self):
        method, leaves = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "flat":
                out["w"] = _sq(arr["a"], 1) * _sq(arr["d"], 1)
            elif method == "materialise":
                out["w"] = arr["sq"]
            else:
                aa = _dot("bti,bsi->bts", arr["a"], arr["a"])
                dd = _dot("bto,bso->bts", arr["d"], arr["d"])
                out["w"] = jnp.sum(aa * dd, axis=(1, 2))
        if "b" in leaves:
            out["b"] = _sq(arr["gb"], 1)
        return out

    def grad(self, weights, use):
        method, leaves = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "materialise":  # a weighted sum over examples: one fused reduction
                out["w"] = jnp.sum(keep(_wide(arr["g"]), use) * weights[:, None, None], axis=0)
            else:
                out["w"] = weighted_product(arr["a"], arr["d"], weights, use)
        if "b" in leaves:
            out["b"] = weights @ keep(arr["gb"], use)
        return out


class Norm(Rule):
    """``y = xhat * scale (+ b)`` (LayerNorm, RMSNorm): per-example grads are
    ``sum_t delta * xhat`` and ``sum_t delta``."""

    def __init__(self, xhat, d, leaves, rows=None, force=None):
        del rows, force
        d = _as_sequence(d.astype(jnp.float32))
        xhat = _as_sequence(xhat.astype(jnp.float32))
        self.static = tuple(leaves)
        parts = {"scale": lambda: (d * xhat).sum(axis=1), "b": lambda: d.sum(axis=1)}
        self.arrays = {leaf: parts[leaf]() for leaf in leaves}

    def sq(self):
        return {leaf: _sq(self.arrays[leaf], 1) for leaf in self.static}

    def grad(self, weights, use):
        return {leaf: weights @ keep(self.arrays[leaf], use) for leaf in self.static}


class Gather(Rule):
    """Token table [V, D]: example i's gradient scatters its delta rows to its token ids, so
    repeated tokens add up in one row before the norm is taken."""

    needs_inputs = True

    @classmethod
    def input_arrays(cls, inputs, records):
        """The token ids ``[B, T]`` (a unit's records' ids side by side), as ``__init__`` reads them."""
        tokens = inputs if records == 1 else by_unit(inputs, records)
        return {"tok": tokens.reshape(tokens.shape[0], -1)}

    def __init__(self, tokens, d, leaves, rows, force=None):
        del leaves
        tokens = tokens.reshape(tokens.shape[0], -1)
        d = _as_sequence(d.astype(jnp.float32))
        method = forms.as_choice(force).force or gather_method(d.shape[1], rows, d.shape[2])
        self.static = (method, rows)
        self.arrays = {"tok": tokens, "d": d}
        if method == "materialise":
            self.arrays = {"g": jax.vmap(lambda dt, tok: jax.ops.segment_sum(dt, tok, rows))(d, tokens)}

    def sq(self):
        method, _ = self.static
        if method == "materialise":
            return {"w": _sq(self.arrays["g"], (1, 2))}
        tok, d = self.arrays["tok"], self.arrays["d"]
        same = tok[:, :, None] == tok[:, None, :]
        dd = jnp.einsum("btd,bsd->bts", d, d)
        return {"w": jnp.sum(jnp.where(same, dd, 0.0), axis=(1, 2))}

    def grad(self, weights, use):
        method, rows = self.static
        if method == "materialise":
            return {"w": jnp.einsum("b,bvd->vd", weights, keep(self.arrays["g"], use))}
        tok, d = self.arrays["tok"], self.arrays["d"]
        width = d.shape[-1]
        scaled = keep(d, use) * weights[:, None, None]
        table = jnp.zeros((rows, width), jnp.float32)
        return {"w": table.at[tok.reshape(-1)].add(scaled.reshape(-1, width))}


class Rows(Rule):
    """Positional table [max_len, D] read as rows 0..T-1, each once per example: row t gets
    delta_t, so the per-example norm is ``||delta||``."""

    @classmethod
    def group(cls, inputs, d, records):
        """Every record of a unit reads the same rows 0..T-1: their gradients add row by row."""
        return inputs, by_unit(d, records).sum(axis=1)

    def __init__(self, inputs, d, leaves, rows, force=None):
        del inputs, leaves, force
        self.static = rows
        self.arrays = {"d": _as_sequence(d.astype(jnp.float32))}

    def sq(self):
        return {"w": _sq(self.arrays["d"], (1, 2))}

    def grad(self, weights, use):
        summed = jnp.einsum("b,btd->td", weights, keep(self.arrays["d"], use))
        return {"w": jnp.pad(summed, ((0, self.static - summed.shape[0]), (0, 0)))}


class Unembed(Dense):
    """A head tied to the token table, ``z = h @ W^T`` (W [V, D]): the dense rule on
    ``(h, delta)``, whose weight gradient [D, V] is the table's transposed."""

    kind = "unembed"

    def grad(self, weights, use):
        return {"w": super().grad(weights, use)["w"].T}


class Tied:
    """The cross term of a table W [V, D] read by a gather (``tokens`` [B, T], output gradient
    ``d_embed`` [B, T, D]) and by a head tied to it (``z = h @ W^T``: ``h`` [B, S, D], output
    gradient ``d_head`` [B, S, V]):
    ``<G_embed, G_head> = sum_t sum_s d_head[s, tok_t] (d_embed_t . h_s) = sum_t d_embed_t . u_t``
    with ``u_t = sum_s d_head[s, tok_t] h_s``. With the two rules' own norms it gives
    ``|G_embed + G_head|^2 = |G_embed|^2 + |G_head|^2 + 2 <G_embed, G_head>``.

    It is taken in halves, each in its op's backward rule where that op's output gradient is:
    :meth:`second` at the head (``u`` [B, T, D], from the single output gradient of the logits,
    which is then not kept), :meth:`first` at the gather (``d_embed``), and :meth:`join` after
    the backward pass. Arrays arrive grouped by unit (:func:`grouped`)."""

    @staticmethod
    def first(tokens, d_embed):
        del tokens
        return _as_sequence(d_embed.astype(jnp.float32))

    @staticmethod
    def second(h, d_head, tokens):
        tokens = tokens.reshape(tokens.shape[0], -1)
        h, d_head = _as_sequence(h.astype(jnp.float32)), _as_sequence(d_head.astype(jnp.float32))
        picked = jnp.take_along_axis(d_head, tokens[:, None, :], axis=2)  # [B, S, T]: d_head[s, tok_t]
        return jnp.einsum("bst,bsd->btd", picked, h)

    @staticmethod
    def join(first, second):
        return jnp.einsum("btd,btd->b", first, second)


def tied_cross(tokens, d_embed, h, d_head):
    """``<G_embed, G_head>`` per example [B] (:class:`Tied`), in one call."""
    return Tied.join(Tied.first(tokens, d_embed), Tied.second(h, d_head, tokens))


RULES: dict[str, type[Rule]] = {
    "dense": Dense,
    "norm": Norm,
    "gather": Gather,
    "rows": Rows,
    "unembed": Unembed,
}


def grouped(kind: str, inputs, d, records: int = 1):
    """``(inputs, d)`` of one op as its rule reads them for units of ``records`` rows
    (unchanged for ``records = 1``: each row its own example)."""
    return (inputs, d) if records == 1 else RULES[kind].group(inputs, d, records)


def build(kind: str, inputs, d, leaves, rows=None, force=None, records: int = 1) -> Rule:
    """The rule of an op of ``kind`` on its input and output gradient, per example or per
    unit of ``records`` consecutive rows; the one place the taps make rules."""
    return RULES[kind](*grouped(kind, inputs, d, records), leaves, rows, force)


# Op kinds that may read the same leaf: (first, second) -> the cross term of their gradients
SHARED = {("gather", "unembed"): Tied}
