"""The precision policy: params and optimizer state in float32, the model's compute in the
policy's dtype, outputs in float32 (Levanter's ``p=f32,c=bfloat16``; MaxText's
``weight_dtype``/``dtype``).

One object, :class:`Precision`, says it, and one method, :meth:`Precision.apply`, applies it:
the params and the float inputs enter the model cast to the compute dtype, *inside* the
function that is differentiated, so the cast's transpose hands float32 gradients to the
float32 params; the model's floating outputs leave as float32. Everything that calls a model
for training goes through it (``zoo.apply_fn(..., precision=)``, the engine, ghost clipping's
passes). ``float32`` is the identity: :meth:`apply` returns the function it is given, and the
casts return the tree they are given, so a float32 run is the program it was before.

What stays float32 under ``bfloat16`` is the ops' business (:mod:`zoo.models.ops`: norm
statistics, the softmax, the logits) and the loss's (:mod:`zoo.losses`); under DP the clipping
and the noise accumulate in float32 (:mod:`zoo.dp`). Frozen leaves need no float32 master
copy: :meth:`Precision.held` is the dtype a run holds them in on device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.errors import choice_error

PRECISIONS = ("float32", "bfloat16")  # [train] precision / --precision
DEFAULT = "float32"


def _floating(a) -> bool:
    return hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)


def _cast(tree, dtype):
    """Floating leaves as ``dtype`` (a NumPy leaf stays on the host: ml_dtypes' bfloat16)."""
    return jax.tree_util.tree_map(lambda a: a.astype(dtype) if _floating(a) else a, tree)


def _as(tree, dtype):
    """Floating leaves as ``dtype``; ``tree`` itself when every one already is (no copy)."""
    if not any(_floating(a) and a.dtype != dtype for a in jax.tree_util.tree_leaves(tree)):
        return tree
    return jax.tree_util.tree_map(lambda a: a.astype(dtype) if _floating(a) and a.dtype != dtype else a, tree)


@dataclass(frozen=True)
class Precision:
    """A precision policy by name (one of :data:`PRECISIONS`).

    ``param_dtype`` holds the trainable params and the optimizer state; ``compute_dtype`` is
    what the model's activations and weights are cast to for the forward and backward passes;
    ``output_dtype`` is what its floating outputs (the logits) leave as.
    """

    name: str = DEFAULT

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise choice_error("precision", self.name, PRECISIONS)

    param_dtype = jnp.dtype(jnp.float32)
    output_dtype = jnp.dtype(jnp.float32)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.name)

    @property
    def is_identity(self) -> bool:
        """True for ``float32``: nothing is cast, the program is the one without a policy."""
        return self.compute_dtype == self.param_dtype

    def to_compute(self, tree):
        """``tree``'s floating leaves in the compute dtype (integer leaves, token ids, as they
        are); ``tree`` itself under float32."""
        return tree if self.is_identity else _cast(tree, self.compute_dtype)

    def to_output(self, tree):
        """``tree``'s floating leaves as ``output_dtype``; ``tree`` itself under float32."""
        return tree if self.is_identity else _cast(tree, self.output_dtype)

    def master(self, trainable: dict) -> dict:
        """Trainable leaves as their master copy: floating leaves in ``param_dtype`` under every
        policy (a leaf imported in bf16, or saved frozen in bf16 by an earlier run, is widened
        once, exactly, before its optimizer state is made)."""
        return _as(trainable, self.param_dtype)

    def held(self, frozen: dict) -> dict:
        """Frozen leaves as a run holds them on device: in the compute dtype, since no
        optimizer update ever lands on them (under bfloat16 a bf16 import stays bf16 and a
        float32 base is rounded once, here, instead of at every step; under float32 a leaf
        saved or imported in bf16 is widened, so the float32 program computes in float32)."""
        return _as(frozen, self.compute_dtype)

    def apply(self, fn: Callable) -> Callable:
        """``fn(params, x, *rest)`` under the policy: params and ``x`` cast to the compute
        dtype on the way in, floating outputs cast to ``output_dtype`` on the way out. The
        casts are part of the returned function, so a gradient taken through it reaches the
        params in their own dtype. Under float32 it is ``fn`` itself."""
        if self.is_identity:
            return fn

        def under_policy(params, x, *rest, **kwargs):
            return self.to_output(fn(self.to_compute(params), self.to_compute(x), *rest, **kwargs))

        return under_policy


FLOAT32 = Precision(DEFAULT)


# What stays float32 under every policy is computed inside one of these named scopes, so that
# the tests can find it in the traced program (a jaxpr equation carries its scope) and check
# that every float it makes there is float32. The names cost nothing in the compiled program.
FLOAT32_SCOPES = (
    "f32_norm_statistics",  # LayerNorm / RMSNorm: mean, variance, rsqrt, the normalised x
    "f32_softmax",  # attention: the softmax's max, exp and sum (chunked: the running ones)
    "f32_loss",  # the log-softmax and the per-example loss
    "f32_per_example_norms",  # DP: per-example gradient norms
    "f32_clip_factors",  # DP: min(1, C / norm)
    "f32_clipped_sum",  # DP: the sum of clipped per-example gradients
    "f32_accumulate",  # microbatches (zoo.microbatch): the running totals of the summed outputs
    "f32_noise",  # DP: the Gaussian noise, added to the clipped sum, and the mean
)


def float32_scope(name: str):
    """The named scope of one of :data:`FLOAT32_SCOPES` (a context manager)."""
    if name not in FLOAT32_SCOPES:
        raise ValueError(f"unknown float32 scope {name!r}; valid: {', '.join(FLOAT32_SCOPES)}")
    return jax.named_scope(name)


def get_precision(policy: Precision | str | None) -> Precision:
    """A :class:`Precision` from itself, its name, or ``None`` (float32)."""
    if policy is None:
        return FLOAT32
    return policy if isinstance(policy, Precision) else Precision(policy)
