"""The public Python API: load models, convert weights, inspect parameters, make inputs."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.experimental import checkify

from zoo.models import canonical
from zoo.models.registry import ModelConfig, check_backend, get_config
from zoo.precision import Precision, get_precision
from zoo.scan import Remat


def load_model(name: str | ModelConfig, backend: str = "nnx", seed: int = 0, **overrides):
    """A freshly initialised NNX or Equinox model of preset ``name``.

    The weights come from :func:`zoo.models.canonical.init_params`, so the same seed gives
    the same weights in both backends.
    """
    cfg = get_config(name, **overrides)
    return canonical.from_canonical(cfg, check_backend(backend), canonical.init_params(cfg, seed))


def to_canonical(model) -> dict:
    """NNX or Equinox model -> canonical nested dict of arrays."""
    return canonical.to_canonical(model)


def from_canonical(name: str | ModelConfig, backend: str, params: dict, **overrides):
    """Canonical params -> model of preset ``name`` in ``backend``. Shapes are checked."""
    cfg = get_config(name, **overrides)
    canonical.check_params(cfg, params)
    return canonical.from_canonical(cfg, check_backend(backend), params)


@dataclass(frozen=True)
class ParamRow:
    path: str
    shape: tuple[int, ...]
    dtype: str
    count: int


def param_table(model_or_params) -> list[ParamRow]:
    """Rows of (dotted canonical path, shape, dtype, count) for a model or canonical tree."""
    params = model_or_params if isinstance(model_or_params, dict) else to_canonical(model_or_params)
    return [
        ParamRow(
            jax.tree_util.keystr(path, simple=True, separator="."),
            tuple(leaf.shape),
            str(leaf.dtype),
            int(np.prod(leaf.shape, dtype=np.int64)),
        )
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    ]


def param_count(model_or_params) -> int:
    return sum(row.count for row in param_table(model_or_params))


def example_batch(
    name: str | ModelConfig, batch_size: int = 2, seed: int = 0, seq_len: int | None = None, **overrides
) -> jax.Array:
    """A valid random model input for preset ``name``: features, token ids or feature rows."""
    cfg = get_config(name, **overrides)
    return cfg.example_input(jax.random.key(seed), batch_size, seq_len)


def example_labels(cfg: ModelConfig, x: jax.Array, seed: int = 1) -> jax.Array:
    """Random valid labels for input ``x``: [B] for classifiers, [B, T] for language models."""
    return cfg.example_labels(jax.random.key(seed), x)


def apply_fn(
    cfg: ModelConfig, backend: str, *, checked: bool = False, precision: Precision | str | None = None
):
    """Pure ``apply(params, x, remat="none") -> logits`` on canonical params.

    The model checks shapes always, and token ids when they are concrete. Under ``jit`` ids are
    tracers; ``checked=True`` returns a jitted apply that checks them too (``checkify``) and
    raises for an id outside ``[0, vocab_size)`` instead of returning NaN or clamped logits.
    ``precision`` (a :class:`zoo.precision.Precision` or its name; default float32, the
    identity) casts the params and float inputs to its compute dtype inside ``apply`` and the
    logits back to float32 (:meth:`zoo.precision.Precision.apply`).
    """
    check_backend(backend)

    @get_precision(precision).apply
    def apply(params: dict, x: jax.Array, remat: Remat = "none") -> jax.Array:
        return canonical.from_canonical(cfg, backend, params)(x, remat=remat)

    if not checked:
        return apply

    def checked_body(params, x, remat):
        cfg.check_input_values(x)
        return apply(params, x, remat)

    compiled = jax.jit(checkify.checkify(checked_body), static_argnums=2)

    def checked_apply(params: dict, x: jax.Array, remat: Remat = "none") -> jax.Array:
        error, logits = compiled(params, x, remat)
        error.throw()
        return logits

    return checked_apply
