"""zoo: JAX reference models in Flax NNX and Equinox, with named remat, freezing and DP-SGD."""

import importlib

from zoo.api import (
    apply_fn,
    example_batch,
    example_labels,
    from_canonical,
    load_model,
    param_count,
    param_table,
    to_canonical,
)

# LoRA's adapters extend zoo.models' dense op from above it (zoo.models.extensions): importing
# them here, with the package, registers them before any submodule is used.
from zoo.lora import adapter as _lora_adapter  # noqa: F401
from zoo.models.registry import BACKENDS, PRESETS, get_config


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, *_LAZY})


__all__ = [
    "BACKENDS",
    "PRESETS",
    "apply_fn",
    "example_batch",
    "example_labels",
    "from_canonical",
    "get_config",
    "load_model",
    "param_count",
    "param_table",
    "load_checkpoint",
    "residual_report",
    "to_canonical",
]

# Loaded on first use (see ``__getattr__``): name -> the module that defines it.
_LAZY = {
    "load_checkpoint": "zoo.train.checkpoint",  # pulls in orbax
    "residual_report": "zoo.residuals",
}


# Subpackages and modules that ``zoo.<name>`` reaches without an explicit import, loaded on
# first touch: ``import zoo; zoo.dp.clipped_grad_sum(...)`` works and costs nothing until used.
_SUBMODULES = (
    "audit",
    "bench",
    "data",
    "dp",
    "freeze",
    "generate",
    "lora",
    "losses",
    "models",
    "names",
    "recipes",
    "remat",
    "residuals",
    "scan",
    "train",
)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
