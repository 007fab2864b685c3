"""The image-classifier CNN kind: config, presets and what zoo needs to know about it.

Two conv layers, each followed by the activation and a max pool, then a dense layer, an
optional scanned stack of ``num_layers`` dense blocks, and the head. Preset ``cnn-mnist`` is
Opacus's ``SampleConvNet`` (its MNIST example): 26,010 parameters, no stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from zoo import names
from zoo.checks import require_choice, require_int
from zoo.configs import require_positive
from zoo.errors import ZooError
from zoo.models.flat import FlatClassifierConfig
from zoo.models.ops import ACTIVATIONS as ACTIVATION_FNS
from zoo.models.ops import conv_output_size
from zoo.models.registry import DataFit, axes_from_table, register

ACTIVATIONS = tuple(ACTIVATION_FNS)
CONVS = ("conv1", "conv2")

# Logical axes of each leaf (without the stack's leading ``layers`` axis). A conv kernel is
# [kh, kw, in, out]: the window axes are positions, never sharded by a rule.
_AXES = {
    "conv1.w": ("positions", "positions", "input", "mlp"),
    "conv1.b": ("mlp",),
    "conv2.w": ("positions", "positions", "embed", "mlp"),
    "conv2.b": ("mlp",),
    "in_proj.w": ("input", "mlp"),
    "in_proj.b": ("mlp",),
    "dense.w": ("embed", "mlp"),
    "dense.b": ("mlp",),
    "head.w": ("mlp", "classes"),
    "head.b": ("classes",),
}


@dataclass(frozen=True)
class CNNConfig(FlatClassifierConfig):
    """Image classifier: conv1 -> act -> max pool -> conv2 -> act -> max pool -> in_proj -> act
    -> ``num_layers`` scanned dense blocks -> head.

    The input is a flattened ``image_size`` x ``image_size`` x ``channels`` image (as zoo's
    image datasets hold it, [B, H*W*C]); the model reshapes it to NHWC. Both pools use
    ``pool_window`` and ``pool_stride``; convs have their own kernel, stride and padding.
    """

    kind: ClassVar[str] = "cnn"
    input_form: ClassVar[str] = "[B, image_size * image_size * channels]"
    image_size: int = 28
    channels: int = 1
    conv1_features: int = 16
    conv1_kernel: int = 8
    conv1_stride: int = 2
    conv1_padding: int = 3
    conv2_features: int = 32
    conv2_kernel: int = 4
    conv2_stride: int = 2
    conv2_padding: int = 0
    pool_window: int = 2
    pool_stride: int = 1
    d_hidden: int = 32
    num_layers: int = 0
    num_classes: int = 10
    activation: str = "relu"

    def __post_init__(self) -> None:
        require_positive(
            self, "image_size", "channels", "conv1_features", "conv1_kernel", "conv1_stride",
            "conv2_features", "conv2_kernel", "conv2_stride", "pool_window", "pool_stride",
            "d_hidden", "num_classes", section="model",
        )  # fmt: skip
        for field in ("conv1_padding", "conv2_padding", "num_layers"):
            require_int(f"CNNConfig.{field}", getattr(self, field), lo=0, what="an int >= 0", error=ZooError)
        require_choice("activation", self.activation, ACTIVATIONS)
        sides = self.sides()
        if min(sides) < 1:
            raise ZooError(
                f"a {self.image_size}x{self.image_size} image is too small for this CNN: the sides "
                f"after conv1, pool, conv2, pool would be {sides}; use a larger image_size or "
                "smaller kernels and strides"
            )

    @property
    def activation_names(self) -> tuple[str, ...]:
        """The names this model tags: the stack's only when it has one."""
        stack = (names.LAYER_INPUT, names.MLP_HIDDEN, names.MLP_OUT) if self.num_layers else ()
        return (*stack, names.LOGITS)

    def frozen_prefix(self) -> tuple[str, ...]:
        """The conv feature extractor, then the first half of the stack when there is one."""
        return (*CONVS, *(super().frozen_prefix() if self.num_layers else ()))

    def sides(self) -> tuple[int, int, int, int]:
        """Image side after conv1, its pool, conv2 and its pool."""
        a = conv_output_size(self.image_size, self.conv1_kernel, self.conv1_stride, self.conv1_padding)
        b = conv_output_size(a, self.pool_window, self.pool_stride)
        c = conv_output_size(b, self.conv2_kernel, self.conv2_stride, self.conv2_padding)
        return a, b, c, conv_output_size(c, self.pool_window, self.pool_stride)

    @property
    def flat_features(self) -> int:
        """Width of the flattened conv features that ``in_proj`` reads."""
        return self.sides()[-1] ** 2 * self.conv2_features

    @property
    def d_in(self) -> int:
        return self.image_size**2 * self.channels

    def fit_to_data(self, data: DataFit) -> dict:
        if data.row_shape:  # (text never reaches here: the data is loaded for cfg.task)
            raise ZooError(f"a CNN reads flattened images (data.layout='flat'), not rows ({data.dataset!r})")
        side = math.isqrt(data.num_features // self.channels)
        if side * side * self.channels != data.num_features:
            raise ZooError(
                f"a CNN needs square images of {self.channels} channel(s); {data.dataset!r} has "
                f"{data.num_features} features per example"
            )
        return {"image_size": side, "num_classes": data.num_classes}

    def init_leaf(self, path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array) -> jax.Array:
        """Conv kernels LeCun normal over their fan-in (window x input channels); the rest as
        every kind."""
        if path[0] in CONVS and path[-1] == "w":
            return math.prod(shape[:-1]) ** -0.5 * jax.random.normal(key, shape, jnp.float32)
        return super().init_leaf(path, shape, key)

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        return axes_from_table(_AXES, path, ndim)


KIND = register(
    CNNConfig,
    nnx="zoo.models.cnn.nnx:CNN",
    eqx="zoo.models.cnn.eqx:CNN",
    presets={
        "cnn-mnist": (
            CNNConfig(),
            "Opacus SampleConvNet: conv 16 8x8/2, pool, conv 32 4x4/2, pool, 32, 10 (28x28 images)",
        ),
    },
    small=CNNConfig(
        image_size=8,
        conv1_features=3,
        conv1_kernel=3,
        conv1_stride=1,
        conv1_padding=1,
        conv2_features=4,
        conv2_kernel=3,
        conv2_stride=2,
        d_hidden=6,
        num_layers=2,
        activation="tanh",
    ),  # fmt: skip
    order=40,
)
