"""The classifier MLP kind: ``config.py`` (config, presets, logical axes, registration),
``nnx.py`` (Flax NNX module), ``eqx.py`` (Equinox module)."""

from zoo.models.mlp.config import ACTIVATIONS, MLPConfig

__all__ = ["ACTIVATIONS", "MLPConfig"]
