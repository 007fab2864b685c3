"""Low-rank adapters on dense layers, for both backends, on the canonical tree.

A dense layer ``y = x W + b`` (``W`` [in, out]) with an adapter computes

    y = x W + b + (alpha / rank) * (x A) B        A [in, rank], B [rank, out]

The adapter is two more dense layers without bias, nested under the layer they adapt, so the
canonical tree holds ``blocks.attn.q.lora_a.w`` [L, D, r] and ``blocks.attn.q.lora_b.w``
[L, r, D] next to ``blocks.attn.q.w``. In a scanned stack they are stacked per layer like any
other leaf. Because each adapter half runs through :func:`zoo.models.ops.dense`, ghost clipping
and the inspector see two ordinary dense ops: no rule of their own.

A model config carries the adapters it has in its ``lora`` field (a :class:`LoraSpec`); the
model classes know nothing of them. :func:`attach` adds them to a freshly built module
(``zoo.models.canonical`` does so when it lays out a config), NNX by adding two
``nnx.Linear`` children to the ``nnx.Linear`` it adapts, Equinox by swapping the
``eqx.nn.Linear`` for a :class:`LoraLinear`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx

A, B = "lora_a", "lora_b"  # canonical names of the two halves (each a dense layer: ``.w``)
ADAPTER_KEYS = (A, B)
# Adapters draw their initial values from a stream of their own, so adding them to a config
# leaves every base leaf's initial value as it was (canonical.init_params).
INIT_STREAM = 0x4C6F5241


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of a model config.

    ``targets`` are dotted canonical paths of dense layers (``blocks.attn.q``, ``head``); each
    gets an adapter of rank ``rank``, scaled by ``alpha / rank``.
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive int, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoRA targets must be distinct dense paths, got {self.targets!r}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_dict(cls, fields: dict) -> LoraSpec:
        """From the ``dataclasses.asdict`` form (checkpoint metadata; JSON lists)."""
        return cls(int(fields["rank"]), float(fields["alpha"]), tuple(fields["targets"]))


def is_adapter_path(path) -> bool:
    """True for a canonical path (tuple or dotted) inside an adapter."""
    parts = path.split(".") if isinstance(path, str) else path
    return any(p in ADAPTER_KEYS for p in parts)


def adapter_paths(target: str) -> tuple[str, str]:
    """The dotted weight paths of one target's adapter: (``A``, ``B``)."""
    return f"{target}.{A}.w", f"{target}.{B}.w"


# --- Equinox: a Linear with an adapter ------------------------------------------------------


class LoraLinear(eqx.Module):
    """An ``eqx.nn.Linear``'s weight and bias ([out, in], as Equinox stores them) plus the two
    adapter halves, each an ``eqx.nn.Linear`` without bias."""

    weight: jax.Array
    bias: jax.Array | None
    lora_a: eqx.nn.Linear
    lora_b: eqx.nn.Linear
    lora_scale: float = eqx.field(static=True)


# --- Attaching adapters to a built module ---------------------------------------------------


def _get(module, dotted: str):
    return functools.reduce(getattr, dotted.split("."), module)


def _zeros_init(lead):
    return lambda key, shape, dtype=jnp.float32: jnp.zeros((*lead, *shape), dtype)


def _attach_nnx(model: nnx.Module, spec: LoraSpec) -> nnx.Module:
    for target in spec.targets:
        layer = _get(model, target)
        if not isinstance(layer, nnx.Linear):
            raise TypeError(f"LoRA target {target!r} is a {type(layer).__name__}, not a dense layer")
        *lead, d_in, d_out = layer.kernel.shape
        rngs = nnx.Rngs(0)  # values are placeholders: the canonical tree supplies them
        layer.lora_a = nnx.Linear(d_in, spec.rank, use_bias=False, kernel_init=_zeros_init(lead), rngs=rngs)
        layer.lora_b = nnx.Linear(spec.rank, d_out, use_bias=False, kernel_init=_zeros_init(lead), rngs=rngs)
        layer.lora_scale = spec.scale
    return model


def _eqx_half(d_in: int, d_out: int, lead) -> eqx.nn.Linear:
    half = eqx.nn.Linear(d_in, d_out, use_bias=False, key=jax.random.key(0))
    return eqx.tree_at(lambda m: m.weight, half, jnp.zeros((*lead, d_out, d_in)))


def _attach_eqx(model: eqx.Module, spec: LoraSpec) -> eqx.Module:
    for target in spec.targets:
        layer = _get(model, target)
        if not isinstance(layer, eqx.nn.Linear):
            raise TypeError(f"LoRA target {target!r} is a {type(layer).__name__}, not a dense layer")
        *lead, d_out, d_in = layer.weight.shape
        adapted = LoraLinear(
            weight=layer.weight,
            bias=layer.bias,
            lora_a=_eqx_half(d_in, spec.rank, lead),
            lora_b=_eqx_half(spec.rank, d_out, lead),
            lora_scale=spec.scale,
        )
        model = eqx.tree_at(lambda m, t=target: _get(m, t), model, adapted)
    return model


def attach(model, spec: LoraSpec | None):
    """``model`` (NNX or Equinox, freshly built) with an adapter on each target of ``spec``."""
    if spec is None:
        return model
    return _attach_nnx(model, spec) if isinstance(model, nnx.Module) else _attach_eqx(model, spec)


# --- On canonical trees ---------------------------------------------------------------------


def init_adapter(path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array) -> jax.Array:
    """``A`` LeCun-normal over its fan-in, ``B`` zeros: a fresh adapter adds exactly nothing."""
    if B in path:
        return jnp.zeros(shape, jnp.float32)
    return shape[-2] ** -0.5 * jax.random.normal(key, shape, jnp.float32)
