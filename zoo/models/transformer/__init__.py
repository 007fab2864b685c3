"""The decoder-only transformer kind: ``config.py`` (config, presets, logical axes,
registration), ``nnx.py`` (Flax NNX module), ``eqx.py`` (Equinox module)."""

from zoo.models.transformer.config import TransformerConfig

__all__ = ["TransformerConfig"]
