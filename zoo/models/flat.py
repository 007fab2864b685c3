"""What the classifier kinds that read flat feature rows [B, d_in] (the MLP, the CNN) share:
their outputs, input shape and input check, and the shape entering their dense stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from zoo.models.ops import check_features
from zoo.models.registry import ModelConfig


@dataclass(frozen=True)
class FlatClassifierConfig(ModelConfig):
    """Base of the flat-input classifiers. A kind sets ``d_in`` (a field or a property),
    ``d_hidden``, ``num_classes`` and how it names its input in errors (``input_form``)."""

    input_form: ClassVar[str] = "[B, d_in]"

    @property
    def num_outputs(self) -> int:
        return self.num_classes

    def input_spec(self, batch: int, seq: int | None = None) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((batch, self.d_in), jnp.float32)

    def block_input_shape(self, batch: int, seq: int | None = None) -> tuple[int, ...]:
        return (batch, self.d_hidden)

    def check_input(self, x: jax.Array) -> None:
        check_features(x, self.d_in, self.input_form)
