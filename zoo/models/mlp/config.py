"""The classifier MLP kind: config, presets and what zoo needs to know about it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from zoo import names
from zoo.checks import require_choice, require_int
from zoo.configs import require_positive
from zoo.errors import ZooError
from zoo.models.flat import FlatClassifierConfig
from zoo.models.ops import ACTIVATIONS as ACTIVATION_FNS
from zoo.models.registry import DataFit, axes_from_table, register

ACTIVATIONS = tuple(ACTIVATION_FNS)

# Logical axes of each leaf (without the stack's leading ``layers`` axis).
_AXES = {
    "pca.w": ("input", None),
    "in_proj.w": ("input", "mlp"),
    "in_proj.b": ("mlp",),
    "dense.w": ("embed", "mlp"),
    "dense.b": ("mlp",),
    "head.w": ("mlp", "classes"),
    "head.b": ("classes",),
}


@dataclass(frozen=True)
class MLPConfig(FlatClassifierConfig):
    """Classifier MLP: [pca ->] in_proj -> `num_layers` scanned dense blocks -> head.

    ``d_pca > 0`` reads the input through a fixed ``pca.w`` [d_in, d_pca] first: a projection
    fitted before training (``data.dp_pca``, :mod:`zoo.dp.pca_fit`) and never trained
    (:attr:`input_projection`), kept in the checkpoint like any other weight. ``num_layers = 0``
    is one hidden layer (in_proj) and no stack.
    """

    kind: ClassVar[str] = "mlp"
    d_in: int = 64
    d_hidden: int = 128
    num_layers: int = 1
    num_classes: int = 10
    activation: str = "gelu"
    d_pca: int = 0

    def __post_init__(self) -> None:
        require_positive(self, "d_in", "d_hidden", "num_classes", section="model")
        require_int("MLPConfig.num_layers", self.num_layers, lo=0, what="an int >= 0", error=ZooError)
        require_int(
            "MLPConfig.d_pca", self.d_pca, lo=0, hi=self.d_in, what=f"an int in [0, d_in={self.d_in}]",
            error=ZooError,
        )  # fmt: skip
        require_choice("activation", self.activation, ACTIVATIONS)

    @property
    def activation_names(self) -> tuple[str, ...]:
        """The names this model tags: the stack's only when it has one."""
        stack = (names.LAYER_INPUT, names.MLP_HIDDEN, names.MLP_OUT) if self.num_layers else ()
        return (*stack, names.LOGITS)

    @property
    def d_first(self) -> int:
        """Width in_proj reads: the projection's, or the input's."""
        return self.d_pca or self.d_in

    @property
    def input_projection(self) -> tuple[str, ...] | None:
        return ("pca", "w") if self.d_pca else None

    def with_input_projection(self, width: int) -> MLPConfig:
        return dataclasses.replace(self, d_pca=width)

    def fit_to_data(self, data: DataFit) -> dict:
        if data.row_shape:  # (text never reaches here: the data is loaded for cfg.task)
            raise ZooError(f"a classifier MLP needs flat features, not rows ({data.dataset!r})")
        return {"d_in": data.num_features, "num_classes": data.num_classes}

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        return axes_from_table(_AXES, path, ndim)

    def frozen_prefix(self) -> tuple[str, ...]:
        return ("in_proj", *(super().frozen_prefix() if self.num_layers else ()))


KIND = register(
    MLPConfig,
    nnx="zoo.models.mlp.nnx:MLP",
    eqx="zoo.models.mlp.eqx:MLP",
    presets={
        "mlp-s": (
            MLPConfig(d_in=64, d_hidden=128, num_layers=1, num_classes=10),
            "64-128-128-10 classifier MLP (8x8 digits)",
        ),
        "mlp-m": (
            MLPConfig(d_in=64, d_hidden=256, num_layers=2, num_classes=10),
            "64-256-256-256-10 classifier MLP",
        ),
        "mlp-mnist": (
            MLPConfig(d_in=784, d_hidden=512, num_layers=1, num_classes=10),
            "784-512-512-10 classifier MLP (28x28 images)",
        ),
    },
    small=MLPConfig(d_in=12, d_hidden=24, num_layers=2, num_classes=10),
    order=10,
)
