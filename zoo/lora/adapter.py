"""The adapter op: low-rank adapters on dense layers, for both backends, on the canonical tree.

A dense layer ``y = x W + b`` (``W`` [in, out]) with an adapter computes

    y = x W + b + (alpha / rank) * (x A) B        A [in, rank], B [rank, out]

The adapter is two more dense layers without bias, nested under the layer they adapt, so the
canonical tree holds ``blocks.attn.q.lora_a.w`` [L, D, r] and ``blocks.attn.q.lora_b.w``
[L, r, D] next to ``blocks.attn.q.w``. In a scanned stack they are stacked per layer like any
other leaf. Because each adapter half runs through :func:`zoo.models.ops.dense`, ghost clipping
and the inspector see two ordinary dense ops: no rule of their own.

``zoo.models`` knows nothing of LoRA: a config's ``lora`` field holds a :class:`LoraSpec`,
opaque there, and this module registers the rest with :mod:`zoo.models.extensions` (what
the dense op adds, the adapter leaves' logical axes, the spec's checkpoint form) and the
Equinox adapted Linear with the Equinox backend. :func:`attach` adds the adapters to a
freshly built module: NNX by adding two ``nnx.Linear`` children to the ``nnx.Linear`` it
adapts, Equinox by swapping the ``eqx.nn.Linear`` for a :class:`LoraLinear`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx

from zoo.checks import require_number, require_positive_int
from zoo.models import extensions, ops
from zoo.models.backends import eqx as eqx_backend

A, B = "lora_a", "lora_b"  # canonical names of the two halves (each a dense layer: ``.w``)
ADAPTER_KEYS = (A, B)


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of a model config.

    ``targets`` are dotted canonical paths of dense layers (``blocks.attn.q``, ``head``); each
    gets an adapter of rank ``rank``, scaled by ``alpha / rank``. ``zoo.models`` holds it as
    an opaque extension spec (:class:`zoo.models.extensions.Spec`): :meth:`attach` and
    :meth:`init_leaf` are what the canonical tree asks of it.
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        require_positive_int("LoRA rank", self.rank)
        require_number("LoRA alpha", self.alpha, positive=True)
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoRA targets must be distinct dense paths, got {self.targets!r}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_dict(cls, fields: dict) -> LoraSpec:
        """From the ``dataclasses.asdict`` form (checkpoint metadata; JSON lists)."""
        return cls(int(fields["rank"]), float(fields["alpha"]), tuple(fields["targets"]))

    def attach(self, module, backend: str):
        """``module`` (freshly built) with an adapter on each target (:func:`attach`)."""
        return attach(module, backend, self)

    def init_leaf(self, path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array) -> jax.Array:
        """``A`` LeCun-normal over its fan-in, ``B`` zeros: a fresh adapter adds exactly nothing."""
        if B in path:
            return jnp.zeros(shape, jnp.float32)
        return shape[-2] ** -0.5 * jax.random.normal(key, shape, jnp.float32)


def is_adapter_path(path) -> bool:
    """True for a canonical path (tuple or dotted) inside an adapter."""
    parts = path.split(".") if isinstance(path, str) else path
    return any(p in ADAPTER_KEYS for p in parts)


def adapter_paths(target: str) -> tuple[str, str]:
    """The dotted weight paths of one target's adapter: (``A``, ``B``)."""
    return f"{target}.{A}.w", f"{target}.{B}.w"


# --- The op -------------------------------------------------------------------------------


class LoraLinear(eqx.Module):
    """An ``eqx.nn.Linear``'s weight and bias ([out, in], as Equinox stores them) plus the two
    adapter halves, each an ``eqx.nn.Linear`` without bias."""

    weight: jax.Array
    bias: jax.Array | None
    lora_a: eqx.nn.Linear
    lora_b: eqx.nn.Linear
    lora_scale: float = eqx.field(static=True)


def adapter_delta(layer, x: jax.Array) -> jax.Array | None:
    """What a dense layer's adapter adds to its output, ``scale * (x @ A) @ B`` (None for a
    layer without one); each half is a dense op of its own."""
    if getattr(layer, A, None) is None:
        return None
    return layer.lora_scale * ops.dense(getattr(layer, B), ops.dense(getattr(layer, A), x))


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


_ATTACH = {"nnx": _attach_nnx, "eqx": _attach_eqx}


def attach(model, backend: str, spec: LoraSpec | None):
    """``model`` (``backend`` "nnx" or "eqx", freshly built) with an adapter on each target."""
    return model if spec is None else _ATTACH[backend](model, spec)


# --- Registration with zoo.models -------------------------------------------------------------
# A [in, r] takes the adapted layer's input axis, B [r, out] its output axis.
extensions.register(
    "lora",
    dense=adapter_delta,
    keys={A: lambda axes: (*axes[:-1], "lora_rank"), B: lambda axes: (*axes[:-2], "lora_rank", axes[-1])},
    decode=LoraSpec.from_dict,
)
eqx_backend.register_layer(LoraLinear, "dense", dict(eqx_backend.LAYERS[eqx.nn.Linear][1]))
