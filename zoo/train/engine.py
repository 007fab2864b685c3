"""One training engine for both backends, made from its owned parts.

A model meets the engine as canonical params plus a pure ``apply``; the freeze plan splits
params into (trainable, frozen). Remat, freezing and DP are written once, here, on pytrees.
Everything under ``jit`` is a pure function of arrays and keys.

An engine is made (:func:`make_engine`, the one place) from four parts, each with one owner:
the model start (:class:`zoo.train.start.Start`: config, freeze plan, layout), the
:class:`GradientSettings` (backend, optimizer, remat policy, precision, microbatch size), the
:class:`zoo.parallel.placement.Placement` (where the state lives and the update runs: its own
checks and its own step program) and the :class:`zoo.dp.plan.DPPlan` (the made sampler,
aggregation and noise; None without DP). A new memory setting is a new placement or a new
microbatch output (:mod:`zoo.microbatch`), never a keyword threaded through the stages.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from zoo import microbatch
from zoo.api import apply_fn
from zoo.dp import ClipModel
from zoo.dp.plan import DPPlan
from zoo.dp.users import group_users, user_loss
from zoo.freeze import FreezePlan
from zoo.losses import accuracy_per_example, masked_mean, per_example_loss
from zoo.models.registry import ModelConfig
from zoo.parallel import Layout
from zoo.parallel.placement import ON_DEVICE, Placement
from zoo.precision import FLOAT32, Precision
from zoo.remat import RematPolicy
from zoo.scan import StackPlan
from zoo.train.state import TrainState, step_metrics


@dataclass(frozen=True)
class GradientSettings:
    """How the engine computes a step's gradient: the model's ``backend``, the ``optimizer``
    that applies it, the ``remat`` policy of the layer stack (a name or a
    :class:`zoo.remat.RematPolicy`, run over the freeze plan's frozen prefix), the run's
    ``precision`` (:class:`zoo.precision.Precision`: applied to the model in
    :meth:`Engine.logits`, handed to the clipping methods, and to the frozen leaves it holds)
    and ``microbatch_size`` (``train.microbatch_size``: a non-private step's gradient
    accumulated over microbatches, :func:`mean_loss_and_grad`; under DP the plan's performance
    settings carry the same knob to the clipping)."""

    backend: str
    optimizer: optax.GradientTransformation
    remat: str | RematPolicy = "none"
    precision: Precision = FLOAT32
    microbatch_size: int | None = None


@dataclass(frozen=True)
class Engine:
    """A model's train and eval steps: remat, freezing and DP written once, on pytrees.

    Made by :func:`make_engine` from its parts: the model's ``cfg``, ``freeze`` plan and
    ``layout`` (a model start's), the :class:`GradientSettings` ``grad``, the ``placement``
    (:mod:`zoo.parallel.placement`: where the state lives, and the step's program, which for the
    update on the host calls :meth:`grads` and :meth:`update`) and the ``dp`` plan
    (:class:`zoo.dp.plan.DPPlan`, None without DP: the engine calls its made aggregation and
    noise, and its transform of the clipped sum, ``zoo audit``'s canaries).
    """

    cfg: ModelConfig
    freeze: FreezePlan
    layout: Layout
    grad: GradientSettings
    placement: Placement = ON_DEVICE
    dp: DPPlan | None = None

    # -- the parts, as the steps read them -------------------------------------------------
    backend = property(lambda self: self.grad.backend)
    optimizer = property(lambda self: self.grad.optimizer)
    precision = property(lambda self: self.grad.precision)
    microbatch_size = property(lambda self: self.grad.microbatch_size)

    @property
    def stack(self) -> StackPlan:
        """The scan of the layer stack: the remat policy over the freeze plan's frozen prefix."""
        return self.freeze.stack_plan(self.grad.remat)

    # -- pure pieces ---------------------------------------------------------------------
    def logits(self, params: dict, x: jax.Array) -> jax.Array:
        return apply_fn(self.cfg, self.backend, precision=self.precision)(params, x, self.stack)

    def example_losses(self, trainable: dict, frozen: dict, x: jax.Array, y: jax.Array):
        logits = self.logits(self.freeze.merge(trainable, frozen), x)
        return per_example_loss(logits, y), logits

    def grads(self, state: TrainState, frozen: dict, batch: dict):
        """``(loss, grads, report)`` of the step at ``state``: ``report`` is what the clipped-sum
        transform says about the step (``{}`` without DP, and by default)."""
        if self.dp is None:

            def losses(trainable, x, y):
                return self.example_losses(trainable, frozen, x, y)[0]

            return (*mean_loss_and_grad(losses, state.params, batch, self.microbatch_size), {})
        return self._dp_grads(state, frozen, batch)

    def clipped_sum(self, state: TrainState, frozen: dict, batch: dict):
        """``(sum of clipped per-example grads, pre-clip norms, per-example losses)`` by the
        run's clipping method (a row of :data:`zoo.dp.clipping.CLIPPING`), in microbatches of
        ``train.microbatch_size`` examples under one scan (:func:`zoo.dp.clipping.accumulated_clip`)."""
        return self.dp.made.aggregate(self.clip_model, state.params, frozen, batch)

    @property
    def clip_model(self) -> ClipModel:
        """The model as the clipping methods see it."""

        def one_example(trainable, frozen, x, y):
            return self.example_losses(trainable, frozen, x[None], y[None])[0][0]

        if self.dp.records_per_user:  # dp.unit = "user": one "example" is a user's [k] slots
            one_example = user_loss(
                lambda trainable, frozen, x, y: self.example_losses(trainable, frozen, x, y)[0]
            )
        return ClipModel(
            self.cfg,
            self.backend,
            self.stack,
            self.freeze,
            one_example,
            self.precision,
            self.dp.records_per_user,
        )

    def noise_key(self, state: TrainState) -> jax.Array:
        return state.step_key()

    def privatize(self, state: TrainState, grad_sum: dict) -> dict:
        """Noisy mean of a clipped sum: the plan's made noise, drawn with the step's key."""
        noise = dataclasses.replace(self.dp.made.noise, partitioned=self.layout.devices > 1)
        return noise.apply(grad_sum, self.noise_key(state))

    def _dp_grads(self, state: TrainState, frozen: dict, batch: dict):
        """``(loss, noisy mean gradient, report)`` of the DP step."""
        if self.dp.records_per_user:  # dp.unit = "user": the rows as [users, k] slots
            batch = group_users(batch, self.dp.records_per_user)
        # The logged loss comes from the clipping pass itself: no extra forward over the batch.
        # The clipped sum accumulates over the microbatches; the noise below is drawn once, for
        # the logical batch, with its key and its normaliser.
        grad_sum, _, losses = self.clipped_sum(state, frozen, batch)
        loss = masked_mean(losses, batch["mask"])
        transform = self.dp.transform
        grads = self.privatize(state, transform.add(grad_sum, self.dp, batch))
        return loss, grads, transform.project(grads, grad_sum, self.dp, batch)

    def train_step_fn(self, state: TrainState, frozen: dict, batch: dict):
        """One step: ``(state, metrics)``, always. The metrics hold ``loss`` and ``grad_norm``,
        and whatever the clipped-sum transform reports (the audit's canary projections)."""
        # Offloaded params: the forward pass reads a device copy, and the update fetches its own
        # from the host (apply_grads), so the first copy need not live through the step.
        on_device = dataclasses.replace(state, params=self._fetch(state, "params"))
        loss, grads, report = self.grads(on_device, frozen, batch)
        new_state, metrics = self.apply_grads(state, loss, grads)
        return new_state, {**metrics, **report}

    def _fetch(self, state: TrainState, field: str):
        """``state.<field>`` in device memory (a copy of each leaf the placement keeps on the host)."""
        return self.placement.fetch(self.layout, self.optimizer, state, field)

    def apply_grads(self, state: TrainState, loss: jax.Array, grads: dict):
        # The moments (and offloaded params) come to the device for the update.
        fetched = dataclasses.replace(
            state, opt_state=self._fetch(state, "opt_state"), params=self._fetch(state, "params")
        )
        # The step's outputs leave as its inputs came: one compile.
        new_state = self.layout.constrain_state(self.updated(fetched, grads), self.optimizer)
        new_state = self.placement.store(self.layout, self.optimizer, new_state)
        return new_state, step_metrics(loss, grads)

    def update(self, state: TrainState, loss: jax.Array, grads: dict):
        """``(state after the update with grads, the step's metrics)``, where the state is: the
        host step's second program (:class:`zoo.parallel.host_step.HostStep`)."""
        return self.updated(state, grads), step_metrics(loss, grads)

    def updated(self, state: TrainState, grads: dict) -> TrainState:
        """``state`` after the optimizer's update with ``grads``: the one update, wherever it
        runs (in the step's program, or on the host: :mod:`zoo.parallel.host_step`)."""
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        return TrainState(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            rng=state.rng,
        )

    def eval_step_fn(self, trainable: dict, frozen: dict, batch: dict) -> dict:
        trainable = self.placement.fetch_params(self.layout, trainable)
        losses, logits = self.example_losses(trainable, frozen, batch["x"], batch["y"])
        mask = batch["mask"]
        return {
            "loss_sum": (losses * mask).sum(),
            "correct_sum": (accuracy_per_example(logits, batch["y"]) * mask).sum(),
            "count": mask.sum(),
        }

    # -- compiled entry points -----------------------------------------------------------
    @functools.cached_property
    def train_step(self):
        """``(state, frozen, batch) -> (state, metrics)``; the state is donated. The placement's
        program (:meth:`zoo.parallel.placement.Placement.step`): one, or for the update on the
        host two, the gradient on the device and the update on the host."""
        return self.placement.step(self)

    @functools.cached_property
    def eval_step(self):
        return jax.jit(self.eval_step_fn)

    def eval_params(self, trainable: dict) -> dict:
        """The trainable params as a read-only pass (the eval step, the audit's canary losses,
        ``zoo eval --hardest``) takes them beside the frozen ones
        (:meth:`zoo.parallel.placement.Placement.eval_params`)."""
        return self.placement.eval_params(self.train_step, trainable)

    def init_state(self, params: dict, seed: int, key: jax.Array | None = None) -> tuple[TrainState, dict]:
        trainable, frozen = self.freeze.split(params)
        frozen = self.precision.held(frozen)

        # The state is donated to every step, so it must own its buffers: without the copy a
        # trainable leaf would alias the caller's params and be deleted by the first step.
        def make(trainable):
            trainable = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), trainable)
            return TrainState.create(trainable, self.optimizer, seed, key)

        state = self.placement.build(self.layout, trainable, make)
        # Committed where the steps keep it (one device, sharded over the mesh, host memory).
        return self.placement.place(self.layout, self.optimizer, state, frozen)

    def place_state(self, state: TrainState) -> TrainState:
        """A state (a restored one) where the placement keeps it between steps."""
        return self.placement.place_state(self.layout, self.optimizer, state)

    def place_batch(self, batch: dict):
        """A host batch as the step's input: split over the mesh's batch axes."""
        return self.layout.place_batch(batch)

    def place_frozen(self, frozen: dict) -> dict:
        return self.layout.place_params(self.precision.held(frozen))


def mean_loss_and_grad(example_losses, trainable: dict, batch: dict, microbatch_size: int | None):
    """``(masked mean loss, its gradient)`` over ``batch`` (``x``, ``y``, ``mask``), where
    ``example_losses(trainable, x, y)`` gives the per-example losses: a non-private step's.

    With ``microbatch_size`` (``train.microbatch_size``) the batch is taken that many rows at a
    time (:func:`zoo.microbatch.accumulate`): each microbatch's masked loss sum is divided by
    the whole batch's count, so the summed loss and gradient are the whole batch's
    :func:`zoo.losses.masked_mean` and its gradient, added in another order. Only one
    microbatch's activations are alive at once, and the optimizer update (and an offloaded
    state's trips) is paid once for the batch."""
    mask = batch["mask"]
    total = jnp.maximum(mask.sum(), 1.0)

    def part(micro):
        def mean(params):
            losses = example_losses(params, micro["x"], micro["y"])
            return jnp.where(micro["mask"] > 0, losses * micro["mask"], 0.0).sum() / total

        return jax.value_and_grad(mean)(trainable)

    n = microbatch.count(mask.shape[0], microbatch_size)
    xym = {k: batch[k] for k in ("x", "y", "mask")}
    return microbatch.accumulate(part, xym, n, (microbatch.SUM, microbatch.SUM))


def make_engine(
    start, grad: GradientSettings, placement: Placement = ON_DEVICE, dp: DPPlan | None = None
) -> Engine:
    """The one way to make an :class:`Engine`: from a model ``start`` (a
    :class:`zoo.train.start.Start`: its config, freeze plan and layout), the gradient settings,
    the ``placement`` (checked here against the layout, :meth:`Placement.check`) and the DP plan
    (:func:`zoo.dp.plan.make_plan` or :func:`zoo.dp.plan.fixed_batch_plan`'s; None: no DP).
    ``zoo train`` makes its parts from the recipe (:func:`zoo.train.stages.engine`); a bench or
    a test passes its own."""
    placement.check(layout=start.layout)
    return Engine(start.cfg, start.freeze, start.layout, grad, placement, dp)


def evaluate(engine: Engine, state: TrainState, frozen: dict, batches) -> dict:
    """Mean loss and accuracy over fixed-shape eval batches (padding masked out), and how many
    examples (LM: windows) they held."""
    totals = {"loss_sum": 0.0, "correct_sum": 0.0, "count": 0.0}
    params = engine.eval_params(state.params)
    for batch in batches:
        out = engine.eval_step(params, frozen, engine.place_batch(batch))
        for key in totals:
            totals[key] += float(out[key])
    count = max(totals["count"], 1.0)
    loss = totals["loss_sum"] / count
    return {
        "eval_loss": loss,
        "eval_accuracy": totals["correct_sum"] / count,
        "eval_count": totals["count"],  # examples, or LM windows (zoo.train.summary.task_metrics)
    }
