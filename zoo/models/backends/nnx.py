"""The Flax NNX backend: its layer types, its canonical leaves and how its modules are split.

NNX keeps every array as the canonical tree does (a kernel is [in, out], a conv kernel
[kh, kw, in, out]), so a leaf's canonical name depends only on its field name. A new layer type
is one row of :data:`LAYERS` (and, for a field name not yet known, one entry of :data:`LEAVES`).
"""

from __future__ import annotations

import jax
from flax import nnx

from zoo.models.backends.layout import Layout

NAME = "nnx"

# field -> canonical leaf, for every NNX layer zoo builds
LEAVES = {"kernel": "w", "embedding": "w", "bias": "b", "scale": "scale"}

# layer type -> (the op it serves, its array fields, {op attribute: layer field})
LAYERS: dict[type, tuple[str, tuple[str, ...], dict[str, str]]] = {
    nnx.Linear: ("dense", ("kernel", "bias"), {}),
    nnx.Embed: ("table", ("embedding",), {}),
    nnx.LayerNorm: ("norm", ("scale", "bias"), {"eps": "epsilon"}),
    nnx.RMSNorm: ("norm", ("scale",), {"eps": "epsilon"}),
    nnx.Conv: ("conv", ("kernel", "bias"), {"strides": "strides", "padding": "padding"}),
}


def owns(obj) -> bool:
    return isinstance(obj, nnx.Module)


def layer_names(op: str) -> list[str]:
    return [f"nnx.{t.__name__}" for t, row in LAYERS.items() if row[0] == op]


def _row(layer):
    return next((LAYERS[t] for t in type(layer).__mro__ if t in LAYERS), None)


def op_params(layer, op: str) -> tuple[dict, dict] | None:
    """``(canonical params, op attributes)`` of ``layer`` serving ``op``; None when it cannot."""
    row = _row(layer)
    if row is None or row[0] != op:
        return None
    params = {}
    for name in row[1]:
        value = getattr(layer, name, None)
        if value is not None:
            params[LEAVES[name]] = value[...] if isinstance(value, nnx.Variable) else value
    return params, {attr: getattr(layer, name) for attr, name in row[2].items()}


def layer_stack(blocks):
    """``(layer_fn, stacked params)`` of stacked blocks built under ``nnx.vmap``."""
    graphdef, stacked = nnx.split(blocks)
    return (lambda layer, h: nnx.merge(graphdef, layer)(h)), stacked


def layer_modules(blocks):
    """``(merge, stacked params)``: ``merge(layer)`` is one layer's block module (decoding)."""
    graphdef, stacked = nnx.split(blocks)
    return (lambda layer: nnx.merge(graphdef, layer)), stacked


def build_abstract(cls, cfg, extend):
    """Shapes only of ``extend(cls(cfg))``; the throwaway init key is made inside the trace."""
    return nnx.eval_shape(lambda: extend(cls(cfg, rngs=nnx.Rngs(0))))


def layout(model) -> Layout:
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    paths = []
    for path, _ in leaves:
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        paths.append((*map(str, keys[:-1]), LEAVES[keys[-1]]))
    shapes = tuple(tuple(x.shape) for _, x in leaves)
    return Layout(tuple(paths), shapes, (None,) * len(paths), treedef, graphdef)


def canonical_leaves(model, layout: Layout) -> list:
    """The module's arrays as canonical leaves, in ``layout``'s order."""
    return jax.tree_util.tree_leaves(nnx.split(model)[1])


def rebuild(layout: Layout, values: list):
    """The module of ``layout`` holding canonical ``values`` (in layout order)."""
    return nnx.merge(layout.graphdef, jax.tree_util.tree_unflatten(layout.treedef, values))
