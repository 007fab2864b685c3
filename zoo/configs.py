"""Frozen dataclass configs. Recipes (TOML) validate into these; flags override fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from zoo.errors import ZooError, check_choice

ACTIVATIONS = ("gelu", "tanh", "relu")


def _require_positive(cfg: object, *fields: str) -> None:
    for field in fields:
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ZooError(f"{type(cfg).__name__}.{field} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class MLPConfig:
    """Classifier MLP: in_proj -> `num_layers` scanned dense blocks -> head."""

    kind: ClassVar[str] = "mlp"
    d_in: int = 64
    d_hidden: int = 128
    num_layers: int = 1
    num_classes: int = 10
    activation: str = "gelu"

    def __post_init__(self) -> None:
        _require_positive(self, "d_in", "d_hidden", "num_layers", "num_classes")
        check_choice("activation", self.activation, ACTIVATIONS)


@dataclass(frozen=True)
class TransformerConfig:
    """Decoder-only transformer: pre-LayerNorm, causal multi-head attention, GELU MLP,
    learned positional embeddings.

    Inputs are token ids [B, T] (``d_in == 0``) or feature vectors [B, T, d_in] (``d_in > 0``,
    e.g. the 8 rows of an 8x8 digit). The head is a language-model head over the vocabulary
    (``num_classes == 0``) or a mean-pooled classifier (``num_classes > 0``).
    """

    kind: ClassVar[str] = "transformer"
    vocab_size: int = 128
    d_model: int = 64
    num_heads: int = 4
    d_ff: int = 256
    num_layers: int = 2
    max_len: int = 64
    d_in: int = 0
    num_classes: int = 0

    def __post_init__(self) -> None:
        _require_positive(self, "vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "max_len")
        if self.d_model % self.num_heads:
            raise ZooError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                f"valid num_heads: {[h for h in range(1, self.d_model + 1) if self.d_model % h == 0]}"
            )
        if self.d_in < 0 or self.num_classes < 0:
            raise ZooError(f"d_in and num_classes must be >= 0, got {self.d_in}, {self.num_classes}")

    @property
    def is_classifier(self) -> bool:
        return self.num_classes > 0

    @property
    def takes_features(self) -> bool:
        return self.d_in > 0

    @property
    def out_dim(self) -> int:
        return self.num_classes if self.is_classifier else self.vocab_size


ModelConfig = MLPConfig | TransformerConfig


def replace_checked(cfg, **overrides):
    """`dataclasses.replace` that names an unknown field and lists the valid ones."""
    valid = [f.name for f in dataclasses.fields(cfg)]
    for key in overrides:
        check_choice(f"override for {type(cfg).__name__}", key, valid)
    return dataclasses.replace(cfg, **overrides)
