"""The image-classifier CNN kind: ``config.py`` (config, presets, logical axes, registration),
``nnx.py`` (Flax NNX module), ``eqx.py`` (Equinox module)."""

from zoo.models.cnn.config import ACTIVATIONS, CNNConfig

__all__ = ["ACTIVATIONS", "CNNConfig"]
