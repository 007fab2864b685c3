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


# --- Recipe sections ------------------------------------------------------------------------

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "constant")
LAYOUTS = ("flat", "rows")


@dataclass(frozen=True)
class ModelSection:
    """Which preset, which backend, and config field overrides (e.g. ``num_layers``)."""

    preset: str = "mlp-s"
    backend: str = "nnx"
    overrides: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class DataConfig:
    """``dataset`` is a spec understood by :func:`zoo.data.load_dataset`.

    ``layout="rows"`` feeds a classifier's 8x8 (or HxW) image to a transformer as H row
    tokens of W features. ``classes`` keeps and remaps a subset of labels (5..9 -> 0..4).
    ``seq_len`` is the LM context (default: the model's ``max_len``).
    """

    dataset: str = "digits"
    layout: str = "flat"
    classes: tuple[int, ...] | None = None
    eval_fraction: float = 0.2
    seq_len: int | None = None
    text_column: str = "text"
    label_column: str = "label"

    def __post_init__(self) -> None:
        check_choice("data.layout", self.layout, LAYOUTS)
        if not 0.0 < self.eval_fraction < 1.0:
            raise ZooError(f"data.eval_fraction must be in (0, 1), got {self.eval_fraction!r}")
        if self.seq_len is not None and self.seq_len <= 0:
            raise ZooError(f"data.seq_len must be positive, got {self.seq_len!r}")


@dataclass(frozen=True)
class OptimConfig:
    """optax optimizer: adamw or sgd with momentum, warmup + cosine decay, global-norm clip."""

    name: str = "adamw"
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup_steps: int = 0
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    grad_clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        check_choice("optim.name", self.name, OPTIMIZERS)
        check_choice("optim.schedule", self.schedule, SCHEDULES)
        if not self.lr > 0:
            raise ZooError(f"optim.lr must be > 0, got {self.lr!r}")
        if self.warmup_steps < 0:
            raise ZooError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.grad_clip_norm is not None and not self.grad_clip_norm > 0:
            raise ZooError(f"optim.grad_clip_norm must be > 0 or unset, got {self.grad_clip_norm!r}")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 64
    eval_every: int = 200
    eval_batches: int = 50
    log_every: int = 10
    checkpoint_every: int = 200
    seed: int = 0
    remat: str = "none"

    def __post_init__(self) -> None:
        _require_positive(
            self, "steps", "batch_size", "eval_every", "eval_batches", "log_every", "checkpoint_every"
        )
        from zoo.remat import get_policy

        get_policy(self.remat)  # unknown names fail here, with the valid list


@dataclass(frozen=True)
class FreezeConfig:
    """Start from a checkpoint and freeze canonical paths matching ``patterns``."""

    patterns: tuple[str, ...] = ()
    init_from: str | None = None
