"""zoo: JAX reference models in Flax NNX and Equinox, with named remat, freezing and DP-SGD."""

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
    "from_canonical",
    "get_config",
    "load_model",
    "param_count",
    "param_table",
    "to_canonical",
]
