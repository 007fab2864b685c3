"""Training state and the optax optimizer built from a recipe."""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zoo.configs import OptimConfig
from zoo.precision import FLOAT32

# ``canonical.init_params`` draws leaf i from ``fold_in(key(seed), i)``. Step s's key would be
# that same key if the step keys hung off ``key(seed)`` directly, and the DP noise of step s
# could then be read off the published initial weights. The training stream branches off at
# a constant no leaf index reaches.
TRAIN_RNG_STREAM = 0x7A6F6F21


def train_key(seed: int) -> jax.Array:
    """The root of a run's per-step keys, independent of the keys that initialise the model."""
    return jax.random.fold_in(jax.random.key(seed), TRAIN_RNG_STREAM)


# Under DP the Poisson batches are drawn from a seed of their own under the run's root key, as
# secret as the noise (``batch_seed``): subsampling amplifies privacy only when which records a
# step reads is hidden. At or above 2**31, so no step's fold_in(root, step) meets it.
BATCH_STREAM = 0xD7CA0002


def batch_seed(rng: jax.Array) -> int:
    """A 64-bit sampler seed from a run's root key data ``rng`` (``TrainState.rng``)."""
    key = jax.random.fold_in(jax.random.wrap_key_data(_local(rng)), BATCH_STREAM)
    high, low = (int(b) for b in np.asarray(jax.random.bits(key, (2,), jnp.uint32)))
    return high << 32 | low


def key_bytes(rng: jax.Array) -> bytes:
    """The bytes of a run's root key data ``rng``: the key of what it must keep secret (a DP
    run's digest of its training data, ``zoo.train.resume.data_digest``)."""
    return np.asarray(_local(rng)).tobytes()


def _local(rng: jax.Array):
    """``rng`` as this process holds it (a replicated array's local copy)."""
    shards = getattr(rng, "addressable_shards", None)
    return rng if not shards else shards[0].data


def secret_train_key() -> jax.Array:
    """A root of per-step keys from 64 bits of OS entropy.

    A DP run's noise must not be computable from anything public. ``train_key(seed)`` is not
    enough for that: the seed also draws the initial weights and has at most 32 bits (JAX
    truncates larger seeds), so it can be found by search from those weights.
    """
    return jax.random.wrap_key_data(np.frombuffer(os.urandom(8), dtype=np.uint32).copy())


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TrainState:
    """Everything that changes during training. Frozen weights live outside it.

    ``rng`` holds raw key data (uint32) so checkpoints store plain arrays.
    """

    step: jax.Array
    params: dict
    opt_state: optax.OptState
    rng: jax.Array

    @classmethod
    def create(
        cls, params: dict, optimizer: optax.GradientTransformation, seed: int, key: jax.Array | None = None
    ) -> TrainState:
        """A fresh state whose per-step keys hang off ``key``, or ``train_key(seed)`` without one.

        The params become their float32 master copy first (:meth:`zoo.precision.Precision.master`),
        so the optimizer state is float32 too, whatever dtype they were imported or saved in."""
        params = FLOAT32.master(params)
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            rng=jax.random.key_data(train_key(seed) if key is None else key),
        )

    def step_key(self) -> jax.Array:
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


def learning_rate(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    end = cfg.lr * cfg.end_lr_ratio
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if cfg.warmup_steps else cfg.lr,
            peak_value=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            decay_steps=max(total_steps, cfg.warmup_steps + 1),
            end_value=end,
        )
    if not cfg.warmup_steps:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
        [cfg.warmup_steps],
    )


def make_optimizer(cfg: OptimConfig, total_steps: int, clip: bool = True) -> optax.GradientTransformation:
    """adamw or sgd+momentum on a warmup schedule, after optional global-norm clipping.

    DP runs pass ``clip=False``: their gradients are already clipped per example.
    """
    schedule = learning_rate(cfg, total_steps)
    if cfg.name == "adamw":
        opt = optax.adamw(schedule, weight_decay=cfg.weight_decay)
    else:
        opt = optax.sgd(schedule, momentum=cfg.momentum or None)
        if cfg.weight_decay:
            opt = optax.chain(optax.add_decayed_weights(cfg.weight_decay), opt)
    if clip and cfg.grad_clip_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), opt)
    return opt


def step_metrics(loss: jax.Array, grads: dict) -> dict:
    """What every train step reports, besides the clipped-sum transform's report."""
    return {"loss": loss, "grad_norm": optax.tree.norm(grads)}
