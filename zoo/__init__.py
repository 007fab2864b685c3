"""zoo: JAX reference models in Flax NNX and Equinox, with named remat, freezing and DP-SGD."""

import importlib

from zoo.api import (
    apply_fn,
    example_batch,
    from_canonical,
    load_model,
    param_count,
    param_table,
    to_canonical,
)
from zoo.models.registry import BACKENDS, PRESETS, get_config

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
    "example_labels": "zoo.residuals",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "inspect":
        # ``zoo/inspect.py`` became ``zoo/residuals.py`` (it shadowed the standard library's
        # ``inspect``); keep ``zoo.inspect`` working for a while.
        import warnings

        warnings.warn(
            "zoo.inspect is deprecated; use zoo.residuals instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("zoo.residuals")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
