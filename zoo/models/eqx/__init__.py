"""Equinox reference models."""

from zoo.models.eqx.mlp import MLP
from zoo.models.eqx.transformer import Transformer

__all__ = ["MLP", "Transformer"]
