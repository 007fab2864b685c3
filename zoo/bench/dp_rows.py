"""The rows of ``zoo bench dp`` (:mod:`zoo.bench.dp`): one step builder per DP-SGD implementation; each gets the same
:class:`Setup`.

zoo's own rows come from the clipping table (:data:`zoo.dp.clipping.CLIPPING`), read when the
bench runs: a clipping method registered there is a row here with nothing to add. Other
libraries' DP-SGD steps are rows registered by name (:func:`register_method`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from zoo.dp import CLIPPING, privatize
from zoo.dp.noise import DEFAULT_NOISE_PRNG, NOISE_PRNGS
from zoo.dp.plan import DPPlan, fixed_batch_plan
from zoo.train import stages
from zoo.train.engine import Engine
from zoo.train.state import TrainState

BASELINE = "non-private"
LR, MOMENTUM, CLIP, SIGMA = 0.1, 0.9, 1.0, 1.0
Step = Callable[[TrainState, dict, dict], tuple[TrainState, dict]]


@dataclass(frozen=True)
class Setup:
    """What every method builder gets: the non-private engine and the DP constants."""

    engine: Engine  # dp=None; its optimizer is the shared SGD-with-momentum
    batch_size: int
    microbatch_size: int
    clip_norm: float = CLIP
    noise_multiplier: float = SIGMA

    def plan(self, **settings) -> DPPlan:
        """The DP plan of a fixed batch of ``batch_size`` with the bench's clip norm and noise
        multiplier; ``settings`` are other ``[dp]`` fields (``clipping``, ``microbatch_size``...)."""
        return fixed_batch_plan(
            self.batch_size, noise_multiplier=self.noise_multiplier, clip_norm=self.clip_norm, **settings
        )

    def dp_engine(self, microbatch_size: int | None) -> Engine:
        """The engine's DP step with vmap clipping (in chunks of ``microbatch_size`` if set)."""
        plan = self.plan(clipping="vmap", microbatch_size=microbatch_size)
        return dataclasses.replace(self.engine, dp=plan)

    def one_example_loss(self, trainable, frozen, x, y):
        """Loss of one example (no leading batch axis), as the engine's DP step defines it."""
        return self.engine.example_losses(trainable, frozen, x[None], y[None])[0][0]


def setup_for(cfg, backend: str, batch: int, microbatch: int, freeze: Sequence[str], seed: int):
    """``(Setup, params)``: the model start and engine of the run stages
    (:func:`zoo.train.stages.config_start`, :func:`~zoo.train.stages.start_engine`) for a preset
    on the bench's synthetic batches, with the bench's SGD with momentum."""
    return setup_from(stages.config_start(cfg, seed=seed, patterns=tuple(freeze)), backend, batch, microbatch)


def setup_from(start: stages.Start, backend: str, batch: int, microbatch: int):
    """:func:`setup_for` from a model start made elsewhere: a recipe's
    (:func:`zoo.train.stages.model_start`, its freeze plan included)."""
    engine = stages.start_engine(start, backend, optax.sgd(LR, momentum=MOMENTUM))
    return Setup(engine=engine, batch_size=batch, microbatch_size=microbatch), start.params


def compile_step(step: Step, state, frozen, batch):
    """``step`` jitted with its state donated, compiled for these arguments."""
    return jax.jit(step, donate_argnames="state").lower(state, frozen, batch).compile()


def fresh_state(setup: Setup, params, optimizer, seed: int):
    """A fresh ``(state, frozen)`` of ``params`` (copied: the step donates its state)."""
    trainable, frozen = setup.engine.freeze.split(jax.tree.map(jnp.copy, params))
    return TrainState.create(trainable, optimizer, seed), frozen


Builder = Callable[[Setup], tuple[Step, optax.GradientTransformation]]
_OTHERS: dict[str, Builder] = {}  # rows registered by name, in order
_OTHERS_DEFAULT: list[str] = []


def register_method(name: str, builder: Builder, default: bool = True) -> Builder:
    """Add a row to the bench (after zoo's rows, in registration order). ``default=False`` rows
    run only when asked for with ``methods=[...]`` / ``--methods``."""
    _OTHERS[name] = builder
    if default and name not in _OTHERS_DEFAULT:
        _OTHERS_DEFAULT.append(name)
    return builder


def _zoo_rows() -> list[tuple[str, Builder, bool]]:
    """``(row, builder, runs by default)`` for each clipping method in the table: its row,
    its microbatched row if it has one, and opt-in rows with the other noise PRNGs."""
    rows = []
    for method in CLIPPING.values():
        rows.append((method.label, _zoo_step(method.name, False, DEFAULT_NOISE_PRNG), True))
        if method.bench_microbatch_label:
            rows.append(
                (method.bench_microbatch_label, _zoo_step(method.name, True, DEFAULT_NOISE_PRNG), True)
            )
        for prng in NOISE_PRNGS:
            if prng != DEFAULT_NOISE_PRNG:  # e.g. --methods "ghost,ghost threefry2x32"
                rows.append((f"{method.label} {prng}", _zoo_step(method.name, False, prng), False))
    return rows


def methods() -> dict[str, Builder]:
    """Every row, by name: the non-private baseline, zoo's clipping methods, other libraries'."""
    return {BASELINE: _non_private, **{name: b for name, b, _ in _zoo_rows()}, **_OTHERS}


def default_methods() -> list[str]:
    """The rows that run without ``--methods``."""
    return [BASELINE, *(name for name, _, default in _zoo_rows() if default), *_OTHERS_DEFAULT]


def _sgd_step(setup: Setup, grads_fn) -> Step:
    """A train step whose gradient comes from ``grads_fn(state, frozen, batch) -> (loss, grads)``."""
    opt = setup.engine.optimizer

    def step(state, frozen, batch):
        loss, grads = grads_fn(state, frozen, batch)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        return (
            TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, state.rng),
            {"loss": loss},
        )

    return step


def _non_private(setup: Setup):
    return setup.engine.train_step_fn, setup.engine.optimizer


def _zoo_step(clipping: str, microbatched: bool, noise_prng: str) -> Builder:
    """The engine's DP step with the ``clipping`` method (microbatched: in chunks of k)."""

    def build(setup: Setup):
        microbatch = setup.microbatch_size if microbatched else None
        plan = setup.plan(clipping=clipping, microbatch_size=microbatch, noise_prng=noise_prng)
        return dataclasses.replace(setup.engine, dp=plan).train_step_fn, setup.engine.optimizer

    return build


def _jax_privacy(setup: Setup):
    from jax_privacy.clipping import clipped_grad

    def masked(trainable, frozen, x, y, m):
        return setup.one_example_loss(trainable, frozen, x, y) * m

    clipped = clipped_grad(
        masked,
        argnums=0,
        l2_clip_norm=setup.clip_norm,
        batch_argnums=(2, 3, 4),
        keep_batch_dim=False,
        return_values=True,
    )

    def grads_fn(state, frozen, batch):
        grad_sum, aux = clipped(state.params, frozen, batch["x"], batch["y"], batch["mask"])
        grads = privatize(
            grad_sum,
            state.step_key(),
            noise_multiplier=setup.noise_multiplier,
            l2_clip_norm=setup.clip_norm,
            expected_batch_size=setup.batch_size,
        )
        return aux.values.sum() / jnp.maximum(batch["mask"].sum(), 1.0), grads

    return _sgd_step(setup, grads_fn), setup.engine.optimizer


def _optax_dpsgd(setup: Setup):
    opt = optax.contrib.dpsgd(
        LR, l2_norm_clip=setup.clip_norm, noise_multiplier=setup.noise_multiplier, seed=0, momentum=MOMENTUM
    )

    def step(state, frozen, batch):
        def masked(trainable, x, y, m):
            return setup.one_example_loss(trainable, frozen, x, y) * m

        losses, grads = jax.vmap(jax.value_and_grad(masked), in_axes=(None, 0, 0, 0))(
            state.params, batch["x"], batch["y"], batch["mask"]
        )
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        return (
            TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, state.rng),
            {"loss": losses.sum() / jnp.maximum(batch["mask"].sum(), 1.0)},
        )

    return step, opt


register_method("jax_privacy clipped_grad", _jax_privacy)
register_method("optax dpsgd", _optax_dpsgd)
GHOST = CLIPPING["ghost"].label  # ghost clipping's row


# ----------------------------------------------------------------------------- measuring
