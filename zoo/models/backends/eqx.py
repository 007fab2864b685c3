"""The Equinox backend: its layer types, its canonical leaves and how its modules are split.

Equinox keeps a Linear weight as [out, in] (canonical [in, out]), a conv weight as
[out, in, kh, kw] (canonical [kh, kw, in, out]) and a conv bias as [out, 1, 1] (canonical
[out]). A new layer type is one row of :data:`LAYERS`; a layer type defined above
``zoo.models`` (LoRA's adapted Linear) adds its row with :func:`register_layer`.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from zoo.models.backends.layout import Layout

NAME = "eqx"

_LINEAR = {"weight": ("w", "swap"), "bias": ("b", None)}
_NORM = {"weight": ("scale", None), "bias": ("b", None)}

# layer type -> (the op it serves, {field: (canonical leaf, how it is stored)}, {op attribute:
# layer field}). How: None as canonical, "swap" last two axes swapped, "conv_w"/"conv_b" below.
LAYERS: dict[type, tuple[str, dict[str, tuple[str, str | None]], dict[str, str]]] = {
    eqx.nn.Linear: ("dense", _LINEAR, {}),
    eqx.nn.Embedding: ("table", {"weight": ("w", None)}, {}),
    eqx.nn.LayerNorm: ("norm", _NORM, {"eps": "eps"}),
    eqx.nn.RMSNorm: ("norm", _NORM, {"eps": "eps"}),
    eqx.nn.Conv: (
        "conv",
        {"weight": ("w", "conv_w"), "bias": ("b", "conv_b")},
        {"strides": "stride", "padding": "padding"},
    ),
}


def register_layer(cls: type, op: str, fields: dict[str, tuple[str, str | None]]) -> None:
    """Add an Equinox layer type serving ``op`` whose arrays are ``fields`` (as in LAYERS)."""
    LAYERS[cls] = (op, fields, {})


def owns(obj) -> bool:
    return isinstance(obj, eqx.Module)


def layer_names(op: str) -> list[str]:
    return [
        f"eqx.nn.{t.__name__}"
        for t, row in LAYERS.items()
        if row[0] == op and t.__module__.startswith("equinox")
    ]


def _row(cls: type):
    return next((LAYERS[t] for t in cls.__mro__ if t in LAYERS), None)


def to_canonical(x, how):
    if how == "conv_w":  # [..., O, I, H, W] -> [..., H, W, I, O]
        n = x.ndim
        return jnp.transpose(x, (*range(n - 4), n - 2, n - 1, n - 3, n - 4))
    if how == "conv_b":
        return x[..., 0, 0]
    return jnp.swapaxes(x, -1, -2) if how == "swap" else x


def to_stored(x, how):
    if how == "conv_w":  # [..., H, W, I, O] -> [..., O, I, H, W]
        n = x.ndim
        return jnp.transpose(x, (*range(n - 4), n - 1, n - 2, n - 4, n - 3))
    if how == "conv_b":
        return x[..., None, None]
    return jnp.swapaxes(x, -1, -2) if how == "swap" else x


def _canonical_shape(shape: tuple[int, ...], how) -> tuple[int, ...]:
    if how == "conv_w":
        *lead, o, i, h, w = shape
        return (*lead, h, w, i, o)
    if how == "conv_b":
        return shape[:-2]
    return (*shape[:-2], shape[-1], shape[-2]) if how == "swap" else shape


def op_params(layer, op: str) -> tuple[dict, dict] | None:
    """``(canonical params, op attributes)`` of ``layer`` serving ``op``; None when it cannot."""
    row = _row(type(layer))
    if row is None or row[0] != op:
        return None
    params = {}
    for name, (leaf, how) in row[1].items():
        value = getattr(layer, name, None)
        if value is not None:
            params[leaf] = to_canonical(value, how)
    return params, {attr: getattr(layer, name) for attr, name in row[2].items()}


def layer_stack(blocks):
    """``(layer_fn, stacked params)`` of stacked blocks built under ``eqx.filter_vmap``."""
    stacked, static = eqx.partition(blocks, eqx.is_array)
    return (lambda layer, h: eqx.combine(layer, static)(h)), stacked


def layer_modules(blocks):
    """``(merge, stacked params)``: ``merge(layer)`` is one layer's block module (decoding)."""
    stacked, static = eqx.partition(blocks, eqx.is_array)
    return (lambda layer: eqx.combine(layer, static)), stacked


def build_abstract(cls, cfg, extend):
    """Shapes only of ``extend(cls(cfg))``; the throwaway init key is made inside the trace."""
    return eqx.filter_eval_shape(lambda: extend(cls(cfg, key=jax.random.key(0))))


def layout(model) -> Layout:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model)
    paths, shapes, stored = [], [], []
    for path, x in leaves:
        fields = [k.name for k in path]
        parent = functools.reduce(getattr, fields[:-1], model)
        leaf, how = _row(type(parent))[1][fields[-1]]
        paths.append((*fields[:-1], leaf))
        shapes.append(_canonical_shape(tuple(x.shape), how))
        stored.append(how)
    return Layout(tuple(paths), tuple(shapes), tuple(stored), treedef)


def canonical_leaves(model, layout: Layout) -> list:
    """The module's arrays as canonical leaves, in ``layout``'s order."""
    leaves = jax.tree_util.tree_leaves(model)
    return [to_canonical(x, how) for x, how in zip(leaves, layout.stored, strict=True)]


def rebuild(layout: Layout, values: list):
    """The module of ``layout`` holding canonical ``values`` (in layout order)."""
    values = [to_stored(x, how) for x, how in zip(values, layout.stored, strict=True)]
    return jax.tree_util.tree_unflatten(layout.treedef, values)
