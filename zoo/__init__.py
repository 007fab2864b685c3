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
    "load_checkpoint",
    "to_canonical",
]


def __getattr__(name: str):
    # Checkpoint loading pulls in orbax; import it only when asked for.
    if name == "load_checkpoint":
        from zoo.train.checkpoint import load_checkpoint

        return load_checkpoint
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
