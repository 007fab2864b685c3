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

import jax

from zoo.checks import is_int
from zoo.errors import ZooError
from zoo.models import backends, extensions
from zoo.models.paths import dotted, flat_by_path, get_path, nested
from zoo.models.registry import ModelConfig, check_backend, module_class

__all__ = [
    "canonical_shapes",
    "check_params",
    "from_canonical",
    "init_adapters",
    "init_params",
    "leaf_paths",
    "to_canonical",
]


@functools.lru_cache(maxsize=64)
def _template(cfg: ModelConfig, backend: str) -> backends.Layout:
    adapter = backends.get(backend)
    # Shapes only. Extensions (cfg.lora's adapters) are attached to the built module: the
    # model classes know nothing of them.
    extend = (lambda m: m) if cfg.lora is None else (lambda m: cfg.lora.attach(m, backend))
    return adapter.layout(adapter.build_abstract(module_class(cfg, backend), cfg, extend))


def leaf_paths(cfg: ModelConfig, backend: str) -> tuple[tuple[str, ...], ...]:
    """The canonical path of each leaf of ``cfg``'s ``backend`` module, in the module's leaf
    order (Equinox and NNX order their leaves differently)."""
    return _template(cfg, check_backend(backend)).paths


def to_canonical(model) -> dict:
    """NNX or Equinox module -> canonical nested dict of arrays."""
    adapter = backends.of(model)
    layout = adapter.layout(model)
    return nested(layout.paths, adapter.canonical_leaves(model, layout))


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
    return backends.get(backend).rebuild(layout, values)


def init_params(cfg: ModelConfig, seed: int | jax.Array = 0) -> dict:
    """Fresh canonical params. Each leaf draws from ``fold_in(key, index)`` in path order;
    adapter leaves (``cfg.lora``) from a stream of their own, so the base leaves are those of
    the same config without adapters."""
    key = jax.random.key(int(seed)) if is_int(seed) else seed  # a NumPy integer is a seed too
    return _init_params(cfg, key, adapters_only=False)


def init_adapters(cfg: ModelConfig, seed: int | jax.Array = 0) -> dict:
    """Just the adapter leaves of :func:`init_params` (``cfg.lora`` must be set)."""
    if cfg.lora is None:
        raise ValueError(f"{type(cfg).__name__} has no adapters (lora=None)")
    key = jax.random.key(int(seed)) if is_int(seed) else seed  # a NumPy integer is a seed too
    return _init_params(cfg, key, adapters_only=True)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params(cfg: ModelConfig, key: jax.Array, adapters_only: bool) -> dict:
    shapes = canonical_shapes(cfg)
    paths = sorted(_template(cfg, "nnx").paths)
    base = [p for p in paths if not extensions.is_extension_path(p)]
    adapters = [p for p in paths if extensions.is_extension_path(p)]
    adapter_key = jax.random.fold_in(key, extensions.INIT_STREAM)
    values = [
        cfg.lora.init_leaf(p, shapes[dotted(p)], jax.random.fold_in(adapter_key, i))
        for i, p in enumerate(adapters)
    ]
    if adapters_only:
        return nested(adapters, values)
    values += [cfg.init_leaf(p, shapes[dotted(p)], jax.random.fold_in(key, i)) for i, p in enumerate(base)]
    return nested(adapters + base, values)
