"""A run, built once: a recipe becomes data, a model config, initial params, a freeze plan, a
DP plan, the DP-PCA projection and an engine (with its remat choice, ``auto``'s search
included), in the stages of :mod:`zoo.train.stages`.

Nothing after :func:`build_run` reads the recipe for a value the run holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
from rich.console import Console

from zoo import lora
from zoo.dp.clipping import KEEP_SUM, ClippedSumTransform
from zoo.dp.plan import DPPlan
from zoo.freeze import FreezePlan
from zoo.models.registry import ModelConfig
from zoo.precision import Precision
from zoo.recipes import Recipe
from zoo.remat import AUTO
from zoo.train import auto_remat, stages
from zoo.train.engine import Engine
from zoo.train.stages import dp_train_key  # noqa: F401  (the public name of the DP root key)
from zoo.train.task import Task


@dataclass(frozen=True)
class Run:
    recipe: Recipe
    task: Task
    cfg: ModelConfig
    params: dict | None  # initial canonical params; None once a train state holds them (release_params)
    freeze: FreezePlan
    engine: Engine
    plan_steps: int  # the horizon of the lr schedule and the DP calibration (resume.py)
    lora: lora.LoraSetup | None = None
    base: dict | None = None  # a LoRA run's base checkpoint (checkpoint.base_reference)
    remat: str = "none"  # what the summary reports: the policy, or "auto:<chosen>"
    root: jax.Array | None = None  # root key data of a DP run (stages.root_key): secret
    auto: dict | None = None  # what --remat auto chose and why (auto_remat.choose), for the summary

    @property
    def dp(self) -> DPPlan | None:
        """The DP settings of the run: the engine's, one object."""
        return self.engine.dp

    @property
    def precision(self) -> Precision:
        """The precision policy of the run: the engine's, one object."""
        return self.engine.precision

    @property
    def steps(self) -> int:
        return self.recipe.train.steps

    @property
    def batch_rows(self) -> int:
        """Rows of a training batch: the padded Poisson batch under DP."""
        return self.dp.sampler.padded_batch_size if self.dp else self.recipe.train.batch_size

    @property
    def eval_rows(self) -> int:
        """Rows of an eval batch: the step's microbatch where the step accumulates
        (``train.microbatch_size``, the one knob; a multiple of the mesh's batch
        ways), else :attr:`batch_rows`. The eval step is one program over its whole batch: at a
        DP step's 1,024 rows of 1,024 tokens it would hold every row's logits at once (200 GB at
        GPT-2's vocabulary), where the train step holds one microbatch's."""
        micro = self.recipe.train.microbatch_size
        if not micro:
            return self.batch_rows
        ways = self.engine.layout.spec.batch_ways
        return min(self.batch_rows, -(-micro // ways) * ways)

    @property
    def eval_batch_count(self) -> int:
        """Eval batches of :attr:`eval_rows` rows that read what ``train.eval_batches`` batches
        of :attr:`batch_rows` read (the same windows, in smaller batches)."""
        return -(-self.recipe.train.eval_batches * self.batch_rows // self.eval_rows)


def release_params(run: Run) -> None:
    """Let go of the run's initial params once a train state has been built from them.

    ``Engine.init_state`` copies the trainable leaves (the state is donated to every step), so
    without this the initial weights stay resident beside the state's for the whole run: for
    ``llama-1b`` 4.9 GB of float32 on a 16 GB chip. Frozen leaves live on in ``frozen``.
    Read ``run.params`` before the state is built (the CLI's parameter table, the dtype
    check); after, it is None. A resume restores its state from the checkpoint, not from here.
    """
    object.__setattr__(run, "params", None)  # a frozen dataclass: this one field is let go


def epsilon_at(run: Run, step: int) -> float:
    """Epsilon the run has spent after ``step`` steps (at the run's delta)."""
    return run.dp.epsilon_at(step)


def privacy_at(run: Run, step: int) -> dict[str, float]:
    """The ``(epsilon, delta)`` the run guarantees after ``step`` steps, Poisson truncation
    included (:meth:`zoo.dp.plan.DPPlan.privacy_at`)."""
    return run.dp.privacy_at(step)


def state_key(run: Run) -> jax.Array | None:
    """The key the run's ``TrainState`` hangs its step keys off: the DP root key (the one its
    batches and DP-PCA noise came from), or None (``train.seed``'s) without DP."""
    return None if run.root is None else jax.random.wrap_key_data(run.root)


def build_run(
    recipe: Recipe,
    plan_steps: int | None = None,
    *,
    console: Console | None = None,
    choose_remat: bool = True,
    root: jax.Array | None = None,
    task: Task | None = None,
    wrap_mechanism: Callable | None = None,
    clipped_sum_transform: ClippedSumTransform = KEEP_SUM,
) -> Run:
    """Resolve a recipe through the stages of :mod:`zoo.train.stages`: data, model start, DP
    plan, projection and engine.

    ``plan_steps`` (default ``train.steps``) is the horizon of the learning-rate schedule and
    of the DP noise calibration; a resumed run that was extended keeps its original one.
    ``root`` is the run's root key data (default: a new one, :func:`stages.root_key`); a resumed
    run passes its checkpoint's, so it draws the same batches. A variant passes what it
    changes: ``task`` (data of its own), ``wrap_mechanism`` (``zoo audit``'s canaries,
    :class:`zoo.dp.mechanisms.Canaries`) and the audit's ``clipped_sum_transform``.
    With ``train.remat = "auto"`` the policy (and, on an accelerator, the offload setting) is
    searched for here (its table printed on ``console``); ``choose_remat=False`` skips the
    search (no step runs: eval, params) and
    leaves the stack unrematerialized.
    """
    plan_steps = plan_steps or recipe.train.steps
    source = stages.start_checkpoint(recipe)
    task = task or stages.load_data(recipe, source)
    start = stages.model_start(recipe, task, source)
    root = stages.root_key(recipe) if root is None and recipe.dp.enabled else root
    plan = stages.dp_plan(
        recipe, task, start, plan_steps, root, wrap=wrap_mechanism, transform=clipped_sum_transform
    )
    start = stages.projection(start, task, plan, root)
    engine = stages.engine(recipe, start, plan, plan_steps)
    policy = "none" if recipe.train.remat == AUTO else recipe.train.remat
    run = Run(
        recipe, task, start.cfg, start.params, start.freeze, engine, plan_steps,
        start.adapters, start.base, policy, root,
    )  # fmt: skip
    if recipe.train.remat == AUTO and choose_remat:
        chosen = auto_remat.resolve(run, train_batch(run, 0), console or Console(stderr=True))
        engine = auto_remat.apply(engine, chosen)
        run = dataclasses.replace(run, engine=engine, remat=f"{AUTO}:{chosen['policy']}", auto=chosen)
    return run


def train_batch(run: Run, step: int) -> dict[str, np.ndarray]:
    """The host batch of ``step``: a function of (seed, step) only, so resume replays it."""
    return local_batch(run, step, slice(None))[0]


def local_batch(run: Run, step: int, rows: slice) -> tuple[dict[str, np.ndarray], int]:
    """``rows`` of ``step`` 's batch (one process's share: only they are read), and how many
    real examples the whole batch holds."""
    if run.dp is None:
        batch_size = run.recipe.train.batch_size
        return run.task.train_batch(step, batch_size, run.recipe.train.seed, rows), batch_size
    indices, mask, realised = run.dp.sampler.batch_indices(step)
    return run.task.examples(indices[rows], mask[rows]), realised
