"""Canaries: which of them are in the training set, and what each one is.

An audit draws ``M`` canaries and includes each one independently with probability 1/2
(:func:`draw_inclusion`). Included canaries are training examples like any other: the
Poisson sampler picks each of them with the same rate ``q`` as a real example.

* **White-box** canaries are gradients (:class:`GradientCanaries`): canary ``j`` is a random
  unit direction ``u_j``, and when it is sampled it adds the clipped version of
  ``r * C * u_j`` (``r`` = :data:`RAW_NORM_MULTIPLE`) to the clipped sum, so the DP step's own
  clip brings it to norm ``C``. After the noise it reads the step's release along each
  direction (see :meth:`GradientCanaries.project`).
* **Black-box** canaries are inputs (:func:`example_canaries`): out-of-distribution points
  with random labels for a classifier, random strings for a language model.

Canary gradients are scaled by :func:`zoo.dp.clipping.clip_factor`, the clip factor that both
clipping paths (vmap and ghost) apply to real examples. The per-example norms those paths
compute are held to plain ``jax.grad`` and to each other by their own tests, not by the audit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from zoo.dp import clipping
from zoo.errors import ZooError

# What a canary gradient measures before the step clips it, in units of the clip norm. Larger
# than 1 so that a step that skips clipping lets a canary through at r times its share.
RAW_NORM_MULTIPLE = 10.0
# Canary directions live on at most this many floats in all (M x support): 256 MiB. A model
# with more trainable coordinates than fit gets directions on a random subset of them; any
# fixed vector of norm <= C is a valid canary gradient, only the overlaps between canaries
# (about 1/sqrt(support)) grow.
MAX_DIRECTION_FLOATS = 2**26
MIN_SUPPORT = 256  # fewer coordinates would make the canaries' overlaps the signal
AUDIT_STREAM = 0x61756469  # separates the audit's draws from the run's own uses of the seed


def audit_rng(seed: int, *purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, AUDIT_STREAM, *purpose])


def draw_inclusion(num_canaries: int, seed: int) -> np.ndarray:
    """Bool ``[M]``: canary ``j`` is in the training set (each with probability 1/2)."""
    return audit_rng(seed, 0).random(num_canaries) < 0.5


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GradientCanaries:
    """The white-box canaries of one step, as a pytree the jitted step takes.

    ``directions`` ``[M, d]`` are unit rows on the coordinates ``support`` ``[d]`` of the
    flattened trainable tree; ``sampled`` ``[M]`` is 1 for the canaries in this step's batch.
    """

    directions: jax.Array
    direction_norms: jax.Array  # [M], 1 up to rounding
    support: jax.Array
    sampled: jax.Array
    raw_norm: jax.Array  # r * C

    def add_clipped(self, grad_sum, dp):
        """``grad_sum`` plus the sampled canaries' gradients ``raw_norm * u_j``, each scaled by
        the clip factor that both clipping paths use (:func:`zoo.dp.clipping.clip_factor`)."""
        flat, unravel = ravel_pytree(grad_sum)
        norms = self.raw_norm * self.direction_norms  # of the raw canary gradients
        weights = self.sampled * clipping.clip_factor(norms, dp.clip_norm) * self.raw_norm
        push = weights @ self.directions
        return unravel(flat.at[self.support].add(push.astype(flat.dtype)))

    def project(self, grads, clean_sum, dp) -> jax.Array:
        """``[M]``: the step's released noisy sum, less the clipped sum of the real examples,
        along each canary direction, in units of the clip norm.

        The real examples' part is what an adversary who knows the training data computes
        (the white-box threat model): removing it leaves the canaries and the noise.
        """
        released = ravel_pytree(grads)[0] * jnp.float32(dp.expected_batch_size)
        residual = (released - ravel_pytree(clean_sum)[0])[self.support]
        return (self.directions @ residual) / jnp.float32(dp.clip_norm)

    def at_step(self, sampled: np.ndarray) -> GradientCanaries:
        return replace(self, sampled=jnp.asarray(sampled, jnp.float32))


CANARY_KEY = "canaries"  # where a white-box step's batch carries its GradientCanaries


@dataclass(frozen=True)
class WhiteBoxCanaries:
    """The audit's transform of the clipped sum (the DP plan's ``transform``,
    :class:`zoo.dp.clipping.ClippedSumTransform`): the step's batch carries this step's
    :class:`GradientCanaries` under :data:`CANARY_KEY`; their clipped gradients join the clipped
    sum before the noise, and the step reports the release along each canary direction as
    ``metrics["canary_projection"]`` ``[M]``."""

    def add(self, grad_sum, plan, batch):
        return batch[CANARY_KEY].add_clipped(grad_sum, plan)

    def project(self, release, grad_sum, plan, batch) -> dict:
        return {"canary_projection": batch[CANARY_KEY].project(release, grad_sum, plan)}


def gradient_canaries(num_canaries: int, num_params: int, clip_norm: float, seed: int) -> GradientCanaries:
    """``M`` random unit directions over (a random subset of) ``num_params`` coordinates."""
    if num_params == 0:
        raise ZooError("a white-box audit needs trainable parameters; this run freezes all of them")
    rng = audit_rng(seed, 1)
    width = min(num_params, MAX_DIRECTION_FLOATS // num_canaries)
    if width < min(num_params, MIN_SUPPORT):
        raise ZooError(
            f"--canaries {num_canaries} is too many for white-box directions of at least "
            f"{MIN_SUPPORT} coordinates each; use at most {MAX_DIRECTION_FLOATS // MIN_SUPPORT:,}"
        )
    support = np.arange(num_params) if width == num_params else np.sort(rng.choice(num_params, width, False))
    directions = rng.standard_normal((num_canaries, width), dtype=np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return GradientCanaries(
        directions=jnp.asarray(directions),
        direction_norms=jnp.asarray(np.linalg.norm(directions, axis=1), jnp.float32),
        support=jnp.asarray(support, jnp.int32),
        sampled=jnp.zeros((num_canaries,), jnp.float32),
        raw_norm=jnp.float32(RAW_NORM_MULTIPLE * clip_norm),
    )


def example_canaries(task, num_canaries: int, seed: int) -> dict[str, np.ndarray]:
    """``{"x", "y"}`` for ``M`` black-box canaries shaped like the task's training examples.

    A classifier's canary is a point drawn uniformly from the box of the training features'
    ranges, with a label drawn uniformly from the classes: far from the data and wrongly
    labelled, so a model that memorises it changes its loss on it. A language model's canary
    is a window of tokens drawn uniformly from the vocabulary.
    """
    canaries = task.type.uniform_examples(task.data, audit_rng(seed, 2), num_canaries, task.seq_len)
    return {**canaries, "x": task.shape_x(canaries["x"])}
