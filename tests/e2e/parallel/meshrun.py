"""A few training steps of an engine on a mesh, from fixed params and batches."""

import jax
import numpy as np

import zoo
from tests.conftest import FAST_COMPILE, labels_for, random_params
from zoo.configs import OptimConfig
from zoo.freeze import resolve_freeze
from zoo.parallel import layout_for, parse_mesh
from zoo.precision import Precision
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.start import config_start
from zoo.train.state import make_optimizer

BATCH = 8


def batches(cfg, steps: int, batch: int = BATCH) -> list[dict]:
    out = []
    for step in range(steps):
        x = np.asarray(zoo.example_batch(cfg, batch, seed=10 + step))
        y = np.asarray(labels_for(cfg, x, seed=20 + step))
        out.append({"x": x, "y": y, "mask": np.ones(batch, np.float32)})
    return out


def engine_for(cfg, mesh: str, *, backend="nnx", remat="none", freeze=(), dp=None, precision="float32"):
    params = random_params(cfg, 1)
    plan = resolve_freeze(params, tuple(freeze))
    layout = layout_for(cfg, parse_mesh(mesh))
    # SGD: an update is linear in the gradient, so rounding stays rounding. Adam's first
    # steps divide a gradient by its own size, and a near-zero entry can flip sign.
    optimizer = make_optimizer(OptimConfig(name="sgd", lr=0.1, schedule="constant"), 10, clip=dp is None)
    grad = GradientSettings(backend, optimizer, remat=remat, precision=Precision(precision))
    engine = make_engine(config_start(cfg, params, freeze=plan, layout=layout), grad, dp=dp)
    return engine, params


def train_steps(cfg, mesh: str, steps: int = 3, **kwargs) -> dict:
    """``{"losses", "params" (host arrays, trainable and frozen), "state", "frozen", "compiles"}``."""
    engine, params = engine_for(cfg, mesh, **kwargs)
    state, frozen = engine.init_state(params, seed=0)
    # The engine's step as `engine.train_step` jits it, at XLA's fast compile level.
    step = jax.jit(engine.train_step_fn, donate_argnames="state", compiler_options=FAST_COMPILE)
    losses = []
    for batch in batches(cfg, steps):
        state, metrics = step(state, frozen, engine.place_batch(batch))
        losses.append(float(metrics["loss"]))
    return {
        "losses": np.asarray(losses),
        "params": jax.device_get(engine.freeze.merge(state.params, frozen)),
        "state": state,
        "frozen": frozen,
        "compiles": step._cache_size(),
        "engine": engine,
    }
