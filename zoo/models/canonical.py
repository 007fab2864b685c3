"""One canonical parameter tree shared by both backends.

The canonical tree is a nested dict of arrays. Dense weights are ``w`` with shape
[in, out], biases ``b``, LayerNorm gains ``scale``, embedding tables ``w`` [rows, D].
Stacked blocks carry a leading L axis. For ``transformer-s``::

    embed.w [V, D]      pos.w [T, D]
    blocks.ln1.scale [L, D]  blocks.ln1.b [L, D]
    blocks.attn.{q,k,v,o}.w [L, D, D]
    blocks.ln2.scale [L, D]  blocks.ln2.b [L, D]
    blocks.mlp.up.w [L, D, F]  blocks.mlp.up.b [L, F]  blocks.mlp.down.w [L, F, D]  blocks.mlp.down.b [L, D]
    ln_f.scale [D]  ln_f.b [D]  head.w [D, V]  head.b [V]

Parameters are initialised here, once, from a seed, and both backends are built from the
result: the same seed gives the same weights in NNX and in Equinox.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx

from zoo.errors import ZooError
from zoo.models import lora
from zoo.models.paths import Path, dotted, flat_by_path, get_path, nest_by_path, nested
from zoo.models.registry import ModelConfig, check_backend, module_class

__all__ = [  # the path helpers are zoo.models.paths'; still reachable here for old callers
    "canonical_shapes",
    "check_params",
    "flat_by_path",
    "from_canonical",
    "init_adapters",
    "init_params",
    "nest_by_path",
    "to_canonical",
]

_NNX_LEAF = {"kernel": "w", "embedding": "w", "bias": "b", "scale": "scale"}
_EQX_LEAF = {  # (module type, field) -> (canonical leaf, stored transposed)
    (eqx.nn.Linear, "weight"): ("w", True),
    (eqx.nn.Linear, "bias"): ("b", False),
    (lora.LoraLinear, "weight"): ("w", True),
    (lora.LoraLinear, "bias"): ("b", False),
    (eqx.nn.Embedding, "weight"): ("w", False),
    (eqx.nn.LayerNorm, "weight"): ("scale", False),
    (eqx.nn.LayerNorm, "bias"): ("b", False),
    (eqx.nn.RMSNorm, "weight"): ("scale", False),
    (eqx.nn.RMSNorm, "bias"): ("b", False),
    (eqx.nn.Conv2d, "weight"): ("w", "conv_w"),  # [out, in, kh, kw] <-> canonical [kh, kw, in, out]
    (eqx.nn.Conv2d, "bias"): ("b", "conv_b"),  # [out, 1, 1] <-> canonical [out]
}


@dataclass(frozen=True)
class _Layout:
    """How one backend's module leaves map onto canonical paths."""

    paths: tuple[Path, ...]
    shapes: tuple[tuple[int, ...], ...]  # canonical (not stored) shapes
    transposed: tuple[bool | str, ...]  # True: last two axes swapped; "conv_w"/"conv_b": see _EQX_LEAF
    treedef: object
    graphdef: object = None  # NNX only


def _swap(x):
    return jnp.swapaxes(x, -1, -2)


def _stored_to_canonical(x, how):
    if how == "conv_w":  # [..., O, I, H, W] -> [..., H, W, I, O]
        n = x.ndim
        return jnp.transpose(x, (*range(n - 4), n - 2, n - 1, n - 3, n - 4))
    if how == "conv_b":
        return x[..., 0, 0]
    return _swap(x) if how else x


def _canonical_to_stored(x, how):
    if how == "conv_w":  # [..., H, W, I, O] -> [..., O, I, H, W]
        n = x.ndim
        return jnp.transpose(x, (*range(n - 4), n - 1, n - 2, n - 4, n - 3))
    if how == "conv_b":
        return x[..., None, None]
    return _swap(x) if how else x


def _canonical_shape(shape: tuple[int, ...], how) -> tuple[int, ...]:
    if how == "conv_w":
        *lead, o, i, h, w = shape
        return (*lead, h, w, i, o)
    if how == "conv_b":
        return shape[:-2]
    return (*shape[:-2], shape[-1], shape[-2]) if how else shape


def _nnx_layout(model: nnx.Module) -> _Layout:
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    paths = []
    for path, _ in leaves:
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        paths.append((*map(str, keys[:-1]), _NNX_LEAF[keys[-1]]))
    shapes = tuple(tuple(x.shape) for _, x in leaves)
    return _Layout(tuple(paths), shapes, (False,) * len(paths), treedef, graphdef)


def _eqx_layout(model: eqx.Module) -> _Layout:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model)
    paths, shapes, transposed = [], [], []
    for path, x in leaves:
        fields = [k.name for k in path]
        parent = functools.reduce(getattr, fields[:-1], model)
        leaf, swap = _EQX_LEAF[(type(parent), fields[-1])]
        paths.append((*fields[:-1], leaf))
        shape = tuple(x.shape)
        shapes.append(_canonical_shape(shape, swap))
        transposed.append(swap)
    return _Layout(tuple(paths), tuple(shapes), tuple(transposed), treedef)


def _is_nnx(model) -> bool:
    return isinstance(model, nnx.Module)


def _layout_of(model) -> _Layout:
    return _nnx_layout(model) if _is_nnx(model) else _eqx_layout(model)


@functools.lru_cache(maxsize=64)
def _template(cfg: ModelConfig, backend: str) -> _Layout:
    cls = module_class(cfg, backend)
    # Shapes only. The throwaway init key is made inside the abstract trace, so it never
    # leaks into a caller that is itself tracing. Adapters (cfg.lora) are attached to the
    # built module: the model classes know nothing of them.
    if backend == "nnx":
        abstract = nnx.eval_shape(lambda: lora.attach(cls(cfg, rngs=nnx.Rngs(0)), cfg.lora))
    else:
        abstract = eqx.filter_eval_shape(lambda: lora.attach(cls(cfg, key=jax.random.key(0)), cfg.lora))
    return _layout_of(abstract)


def leaf_paths(cfg: ModelConfig, backend: str) -> tuple[tuple[str, ...], ...]:
    """The canonical path of each leaf of ``cfg``'s ``backend`` module, in the module's leaf
    order (Equinox and NNX order their leaves differently)."""
    return _template(cfg, check_backend(backend)).paths


def to_canonical(model) -> dict:
    """NNX or Equinox module -> canonical nested dict of arrays."""
    layout = _layout_of(model)
    if _is_nnx(model):
        leaves = jax.tree_util.tree_leaves(nnx.split(model)[1])
    else:
        leaves = jax.tree_util.tree_leaves(model)
    values = [_stored_to_canonical(x, t) for x, t in zip(leaves, layout.transposed, strict=True)]
    return nested(layout.paths, values)


def canonical_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Dotted canonical path -> shape, without allocating any parameters."""
    layout = _template(cfg, "nnx")
    return {dotted(p): s for p, s in zip(layout.paths, layout.shapes, strict=True)}


def check_params(cfg: ModelConfig, params: dict) -> None:
    """Raise a clear error when ``params`` does not fit ``cfg`` (missing, extra, bad shapes)."""
    expected = canonical_shapes(cfg)
    got = {path: tuple(x.shape) for path, x in flat_by_path(params).items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(
        f"{k}: got {got[k]}, want {expected[k]}"
        for k in set(expected) & set(got)
        if tuple(expected[k]) != got[k]
    )
    if missing or extra or wrong:
        raise ZooError(
            "parameters do not fit the model config "
            f"{cfg}: missing {missing or 'none'}; unexpected {extra or 'none'}; "
            f"shape mismatches {wrong or 'none'}"
        )


def from_canonical(cfg: ModelConfig, backend: str, params: dict):
    """Canonical params -> an NNX or Equinox module of ``cfg``. Cheap inside ``jit``."""
    layout = _template(cfg, check_backend(backend))
    try:
        values = [get_path(params, p) for p in layout.paths]
    except (KeyError, TypeError):
        check_params(cfg, params)
        raise
    values = [_canonical_to_stored(x, t) for x, t in zip(values, layout.transposed, strict=True)]
    tree = jax.tree_util.tree_unflatten(layout.treedef, values)
    return nnx.merge(layout.graphdef, tree) if backend == "nnx" else tree


def init_params(cfg: ModelConfig, seed: int | jax.Array = 0) -> dict:
    """Fresh canonical params. Each leaf draws from ``fold_in(key, index)`` in path order;
    adapter leaves (``cfg.lora``) from a stream of their own, so the base leaves are those of
    the same config without adapters."""
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    return _init_params(cfg, key, adapters_only=False)


def init_adapters(cfg: ModelConfig, seed: int | jax.Array = 0) -> dict:
    """Just the adapter leaves of :func:`init_params` (``cfg.lora`` must be set)."""
    if cfg.lora is None:
        raise ValueError(f"{type(cfg).__name__} has no adapters (lora=None)")
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    return _init_params(cfg, key, adapters_only=True)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params(cfg: ModelConfig, key: jax.Array, adapters_only: bool) -> dict:
    shapes = canonical_shapes(cfg)
    paths = sorted(_template(cfg, "nnx").paths)
    base = [p for p in paths if not lora.is_adapter_path(p)]
    adapters = [p for p in paths if lora.is_adapter_path(p)]
    adapter_key = jax.random.fold_in(key, lora.INIT_STREAM)
    values = [
        lora.init_adapter(p, shapes[dotted(p)], jax.random.fold_in(adapter_key, i))
        for i, p in enumerate(adapters)
    ]
    if adapters_only:
        return nested(adapters, values)
    values += [cfg.init_leaf(p, shapes[dotted(p)], jax.random.fold_in(key, i)) for i, p in enumerate(base)]
    return nested(adapters + base, values)
