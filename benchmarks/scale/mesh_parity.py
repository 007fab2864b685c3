"""Training on a mesh against training on one device: the same model, params and batches,
20 steps on each mesh, compared by the test suite's float rule (tests/numerics.py).

Runs in one process over 8 simulated CPU devices::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python benchmarks/scale/mesh_parity.py transformer-s llama-s --steps 20

For each model and mesh it prints the largest loss and parameter differences against the
one-device run, the same as a fraction of the float rule's tolerance (below 1 passes), and the
compile count of the step. ``--optimizer adamw`` shows why the suite compares SGD runs: Adam's
first updates divide each gradient entry by its own size, so an entry near zero turns rounding
into a full learning-rate step.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import zoo  # noqa: E402
from zoo.bench.floats import excess
from zoo.configs import OptimConfig  # noqa: E402
from zoo.parallel import layout_for, parse_mesh  # noqa: E402
from zoo.train import stages
from zoo.train.engine import GradientSettings, make_engine  # noqa: E402
from zoo.train.state import make_optimizer  # noqa: E402

MESHES = ("data=8", "fsdp=8", "data=2,fsdp=2,tensor=2")


def run(cfg, mesh: str, steps: int, batch: int, optim: OptimConfig, backend: str):
    start = stages.config_start(cfg, seed=0, layout=layout_for(cfg, parse_mesh(mesh)))
    engine = make_engine(start, GradientSettings(backend, make_optimizer(optim, steps)))
    state, frozen = engine.init_state(start.params, 0)
    losses = []
    for step in range(steps):
        x = np.asarray(zoo.example_batch(cfg, batch, seed=step))
        y = np.asarray(zoo.example_labels(cfg, x, seed=1000 + step))
        state, metrics = engine.train_step(
            state, frozen, engine.place_batch({"x": x, "y": y, "mask": np.ones(batch, np.float32)})
        )
        losses.append(float(metrics["loss"]))
    return np.asarray(losses), jax.device_get(state.params), engine.train_step._cache_size()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["transformer-s", "llama-s"])
    parser.add_argument("--meshes", default=";".join(MESHES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--backend", default="nnx")
    args = parser.parse_args(argv)
    optim = (
        OptimConfig(name="sgd", lr=0.1, schedule="constant")
        if args.optimizer == "sgd"
        else OptimConfig(name="adamw", lr=1e-3)
    )
    print(
        f"{'model':<15}{'mesh':<24}{'max |dloss|':>12}{'/tol':>8}{'max |dparam|':>14}{'/tol':>8}{'compiles':>10}"
    )
    for name in args.models:
        cfg = zoo.get_config(name)
        n = args.batch * (getattr(cfg, "max_len", None) or 1) * cfg.d_model
        ref_losses, ref_params, _ = run(cfg, "data=1", args.steps, args.batch, optim, args.backend)
        for mesh in args.meshes.split(";"):
            losses, params, compiles = run(cfg, mesh, args.steps, args.batch, optim, args.backend)
            dloss = float(np.abs(losses - ref_losses).max())
            dparam = max(
                float(np.abs(a - b).max())
                for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True)
            )
            print(
                f"{name:<15}{mesh:<24}{dloss:>12.2e}{excess(losses, ref_losses, n):>8.0e}"
                f"{dparam:>14.2e}{excess(params, ref_params, n):>8.0e}{compiles:>10}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
