"""Folding trained adapters into their base weights (``zoo export --merge``)."""

from __future__ import annotations

import jax.numpy as jnp

from zoo.lora.adapter import LoraSpec, adapter_paths, is_adapter_path
from zoo.models.paths import flat_by_path, nest_by_path


def merged_weights(params: dict, spec: LoraSpec) -> dict:
    """Canonical params without adapters: each target's ``w`` becomes ``w + scale * A @ B``
    (per layer in a stack). The tree of a config without ``lora``."""
    flat = flat_by_path(params)
    out = {p: x for p, x in flat.items() if not is_adapter_path(p)}
    for target in spec.targets:
        a, b = (flat[p] for p in adapter_paths(target))
        out[f"{target}.w"] = flat[f"{target}.w"] + spec.scale * jnp.matmul(a, b)
    return nest_by_path(out)
