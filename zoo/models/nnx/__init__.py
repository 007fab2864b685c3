"""Flax NNX reference models."""

from zoo.models.nnx.mlp import MLP
from zoo.models.nnx.transformer import Transformer

__all__ = ["MLP", "Transformer"]
