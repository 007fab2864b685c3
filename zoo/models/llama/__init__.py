"""The Llama-style decoder kind: ``config.py`` (config, presets, logical axes, registration),
``nnx.py`` (Flax NNX module), ``eqx.py`` (Equinox module)."""

from zoo.models.llama.config import LlamaConfig

__all__ = ["LlamaConfig"]
