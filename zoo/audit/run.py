"""One audited training run: the recipe trained once with canaries, then scored.

The privacy parameters are fixed before the canaries' coins are tossed: the sampling rate is
``q = expected_batch_size / (N + M/2)`` (``N`` real examples, ``M`` canaries, half of which
are expected to be included) and the noise multiplier is calibrated for that ``q``, so the
claimed epsilon holds for adding or removing any one example, canary or not. Every included
canary is then sampled with probability ``q`` in every step, exactly like a real example.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import jax
import numpy as np

from zoo.audit.canaries import (
    CANARY_KEY,
    WhiteBoxCanaries,
    audit_rng,
    draw_inclusion,
    example_canaries,
    gradient_canaries,
)
from zoo.checks import require_int
from zoo.dp import PoissonSampler
from zoo.dp.clipping import KEEP_SUM
from zoo.dp.mechanisms import Canaries
from zoo.dp.plan import without_noise
from zoo.errors import ZooError, choice_error
from zoo.recipes import Recipe
from zoo.train.compiles import CompileCounter
from zoo.train.engine import Engine
from zoo.train.run import Run, build_run, state_key

MODES = ("whitebox", "blackbox")


@dataclass(frozen=True)
class AuditPlan:
    recipe: Recipe
    run: Run  # the run `zoo train` builds, with the canaries counted in its DP plan
    engine: Engine  # the run's, with the audit's clipped-sum hook (and --no-noise)
    mode: str
    included: np.ndarray  # bool [M]
    epsilon_claimed: float  # what the canaries can measure: DP-SGD's steps alone
    privacy: dict | None = None  # the run's (epsilon, delta) and parts (DPPlan.privacy_at)

    @property
    def sampler(self) -> PoissonSampler | None:
        """The DP plan's sampler (None: a non-private recipe's uniform minibatches)."""
        return self.engine.dp.sampler if self.engine.dp else None

    @property
    def num_canaries(self) -> int:
        return int(self.included.size)

    @property
    def num_real(self) -> int:
        return self.run.task.num_train

    @property
    def records_per_canary(self) -> int:
        """Under ``dp.unit = "user"`` a canary is a user holding ``dp.records_per_user``
        records (its ``[k]`` slots); otherwise one record."""
        return (self.engine.dp.records_per_user if self.engine.dp else None) or 1

    @property
    def steps(self) -> int:
        return self.recipe.train.steps

    @property
    def projection_fitted(self) -> bool:
        """A DP-PCA projection (data.dp_pca) was fitted before the first step: a release the
        canaries do not pass through (they are gradients or rows of the projected model)."""
        return self.run.cfg.input_projection is not None


def check_request(recipe: Recipe, num_canaries: int, mode: str, confidence: float, no_noise: bool) -> None:
    if mode not in MODES:
        raise choice_error("mode", mode, MODES)
    require_int("--canaries", num_canaries, lo=2, what="an integer >= 2 (half in, half out)", error=ZooError)
    if not (isinstance(confidence, float | int) and 0 < confidence < 1):
        raise ZooError(f"--confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    if not recipe.dp.enabled and mode == "whitebox":
        raise ZooError(
            f"recipe {recipe.name!r} is not DP (dp.enabled = false): a white-box audit plants "
            "gradients in the DP step's clipped sum; use --mode blackbox, or a DP recipe"
        )
    if recipe.dp.unit == "user" and not recipe.dp.enabled:
        raise ZooError(
            f"a user-level audit (dp.unit = 'user', --unit user) bounds a DP recipe's user-level "
            f"epsilon; {recipe.name!r} is not DP (dp.enabled = false)"
        )
    if recipe.dp.enabled and recipe.dp.unit == "user" and recipe.dp.sampler == "els":
        raise ZooError(
            "zoo audit plants canary users drawn as units (ULS); dp.sampler = 'els' has no audit yet: "
            "audit dp.sampler = 'poisson'"
        )
    if no_noise and not recipe.dp.enabled:
        raise ZooError(f"--no-noise turns off the noise of a DP recipe; {recipe.name!r} is not DP")


def plan_audit(recipe: Recipe, num_canaries: int, mode: str, no_noise: bool = False) -> AuditPlan:
    """The run ``zoo train`` builds (:func:`zoo.train.run.build_run`: the same stages, DP on,
    the same loader and public-domain check, DP-PCA with its noise and key), with the canaries
    counted in its plan.

    The plan is :func:`zoo.dp.plan.make_plan`'s, its mechanism wrapped by the canaries
    (:class:`zoo.dp.mechanisms.Canaries`), extra units: half of
    them are expected in, and the noise is calibrated for q = expected_batch_size / (N + M/2).
    The real examples are drawn by the plan's sampler, the canaries by coins of their own
    (:meth:`Batches.canaries_drawn`): which real examples a step draws does not depend on which
    canaries are in. Black-box canaries are rows, so the padding has room for all of them.
    """
    included = draw_inclusion(num_canaries, recipe.train.seed)
    if included.all() or not included.any():
        side = "in" if included.all() else "out"
        raise ZooError(
            f"all {num_canaries} canaries fell {side} of the training set with seed "
            f"{recipe.train.seed}; the audit compares included with excluded ones: use more canaries"
        )
    dp = recipe.dp.enabled
    run = build_run(
        recipe,
        wrap_mechanism=Canaries(num_canaries, rows=mode == "blackbox") if dp else None,
        clipped_sum_transform=WhiteBoxCanaries() if mode == "whitebox" else KEEP_SUM,
    )
    if not dp:
        return AuditPlan(recipe, run, run.engine, mode, included, math.inf)
    if no_noise:  # audit-only: clipping on, noise off, no privacy claimed
        engine = dataclasses.replace(run.engine, dp=without_noise(run.dp))
        return AuditPlan(recipe, run, engine, mode, included, math.inf)
    privacy = run.dp.privacy_at(recipe.train.steps)
    # The canaries pass through the DP-SGD steps only, never through a DP-PCA fit: what they
    # can measure is DP-SGD's epsilon, not the composed one.
    claimed = privacy.get("epsilon_sgd", privacy["epsilon"])
    return AuditPlan(recipe, run, run.engine, mode, included, claimed, privacy)


@dataclass(frozen=True)
class Trace:
    """What the audited run leaves for scoring."""

    projections: np.ndarray | None  # white-box: [T, M], the release along each canary direction
    loss_before: np.ndarray | None  # black-box: [M] canary losses at the initial params
    loss_after: np.ndarray | None  # black-box: [M] at the final params
    sampled: np.ndarray  # [M] steps each canary was in the batch (0 for excluded ones)
    compile_count: int


class Batches:
    """The step's batch: real rows from the task, plus canary rows (black-box) or canary
    gradients (white-box).

    A DP run draws the real examples with its Poisson sampler and every included canary with
    a coin of its own (probability ``q``, :meth:`canaries_drawn`), so the real examples a
    step draws do not depend on which canaries are in. A non-private run draws its minibatch
    uniformly from the real examples and all canaries, and masks out the excluded ones.
    """

    def __init__(self, plan: AuditPlan):
        self.plan = plan
        self.k = plan.records_per_canary  # canary j's rows: examples[j * k : (j + 1) * k]
        self.examples = example_canaries(plan.run.task, plan.num_canaries * self.k, plan.recipe.train.seed)

    def canaries_drawn(self, step: int) -> np.ndarray:
        """Bool ``[M]``: the included canaries in this step's batch."""
        plan = self.plan
        coins = audit_rng(plan.recipe.train.seed, 3, step).random(plan.num_canaries)
        return (coins < plan.sampler.sampling_prob) & plan.included

    def _real(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(real indices, their mask, canaries drawn, batch rows)``: the real rows come
        first (under users, ``[k]`` slots per drawn user, empty slots masked)."""
        plan, n = self.plan, self.plan.num_real
        if plan.sampler is None:
            rng = np.random.default_rng([plan.recipe.train.seed, step])
            size = plan.recipe.train.batch_size
            indices = rng.choice(n + plan.num_canaries, size, replace=False)
            drawn_ids = indices[indices >= n] - n
            drawn_ids = drawn_ids[plan.included[drawn_ids]]
            real = indices[indices < n]
            # excluded canaries drawn stay masked out
            return real, np.ones((real.size,), np.float32), drawn_ids, size
        indices, mask, realised = plan.sampler.batch_indices(step)
        used = realised * self.k
        return indices[:used], mask[:used], np.flatnonzero(self.canaries_drawn(step)), mask.size

    def at(self, step: int) -> tuple[dict, np.ndarray]:
        """``(batch, sampled)``: ``sampled`` ``[M]`` is 1 for the included canaries drawn."""
        plan, k = self.plan, self.k
        real, real_mask, drawn_ids, size = self._real(step)
        batch = plan.run.task.examples(
            np.concatenate([real, np.zeros(size - real.size, np.int64)]), np.ones((size,), np.float32)
        )
        batch = {key: np.array(value) for key, value in batch.items()}  # own copies, then edit
        mask = np.zeros((size,), np.float32)
        mask[: real.size] = real_mask
        if plan.mode == "blackbox":
            room = (size - real.size) // k
            if drawn_ids.size > room:
                warnings.warn(
                    f"step {step} drew {drawn_ids.size} canaries with room for {room}; dropping the rest",
                    RuntimeWarning,
                    stacklevel=2,
                )
                drawn_ids = drawn_ids[:room]
            slots = real.size + np.arange(drawn_ids.size * k)
            rows = (drawn_ids[:, None] * k + np.arange(k)).reshape(-1)
            batch["x"][slots] = self.examples["x"][rows]
            batch["y"][slots] = self.examples["y"][rows]
            mask[slots] = 1.0
        batch["mask"] = mask
        sampled = np.zeros((plan.num_canaries,), np.float32)
        sampled[drawn_ids] = 1.0
        return batch, sampled


def train_with_canaries(plan: AuditPlan, progress=None, engine: Engine | None = None) -> Trace:
    """Train the plan's recipe once with its canaries. ``engine`` replaces the plan's own
    (tests plant known bugs in the DP step this way; no recipe or flag reaches it)."""
    engine = engine or plan.engine
    recipe = plan.recipe
    state, frozen = engine.init_state(plan.run.params, recipe.train.seed, state_key(plan.run))
    batches = Batches(plan)
    whitebox = plan.mode == "whitebox"
    if whitebox:
        count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
        canaries = gradient_canaries(plan.num_canaries, count, recipe.dp.clip_norm, recipe.train.seed)
    else:
        loss_before = canary_losses(engine, state, frozen, batches)
    projections, sampled_total = [], np.zeros((plan.num_canaries,), np.int64)
    with CompileCounter() as compiles:
        for step in range(plan.steps):
            batch, sampled = batches.at(step)
            sampled_total += sampled.astype(np.int64)
            batch = engine.place_batch(batch)  # split over the mesh's batch axes, as in training
            if whitebox:  # the canaries drawn this step travel with its batch
                batch = {**batch, CANARY_KEY: canaries.at_step(sampled)}
            with compiles.track():
                state, metrics = engine.train_step(state, frozen, batch)
            if whitebox:
                projections.append(np.asarray(metrics["canary_projection"], np.float64))
            if progress is not None:
                progress(step + 1, float(metrics["loss"]))
    if whitebox:
        return Trace(np.stack(projections), None, None, sampled_total, compiles.count)
    loss_after = canary_losses(engine, state, frozen, batches)
    return Trace(None, loss_before, loss_after, sampled_total, compiles.count)


def canary_losses(engine: Engine, state, frozen, batches: Batches) -> np.ndarray:
    """``[M]`` loss of every black-box canary under the state's params: a canary user's is
    the mean over its ``k`` records, as its clipped gradient is."""
    losses = jax.jit(lambda p, fz, x, y: engine.example_losses(p, fz, x, y)[0])
    x, y = batches.examples["x"], batches.examples["y"]
    params = engine.eval_params(state.params)  # beside the frozen leaves (update-on-host: a device copy)
    chunk = 256
    out = []
    for start in range(0, x.shape[0], chunk):
        xs, ys = x[start : start + chunk], y[start : start + chunk]
        rows = xs.shape[0]
        if rows < chunk:  # one shape for every call
            xs = np.concatenate([xs, np.repeat(xs[:1], chunk - rows, axis=0)])
            ys = np.concatenate([ys, np.repeat(ys[:1], chunk - rows, axis=0)])
        out.append(np.asarray(losses(params, frozen, xs, ys))[:rows])
    return np.concatenate(out).astype(np.float64).reshape(-1, batches.k).mean(axis=1)
