"""Whether each recipe sized for an accelerator fits it at its shipped shapes, by analysis: the
device programs ``zoo train`` runs (the train step, or the gradient program where the update
runs on the host; the eval step at its batch) compiled from shapes, nothing allocated, and their
footprint read from XLA's ``memory_analysis()`` against the recipe's ``device_memory``.

    python benchmarks/device/recipe_fits.py                    # every recipe that declares device_memory
    python benchmarks/device/recipe_fits.py --recipes llama-1b-tokens --json rows.json
    python benchmarks/device/recipe_fits.py --target cpu       # the CPU's compiler (not the chip's figures)

``--target tpu-v5e`` (the default) compiles with the TPU compiler itself, without a chip: JAX's
compile-only devices of a one-chip v5e topology (``jax.experimental.topologies``), through
``libtpu`` of the installed JAX's version (``pip install libtpu==0.0.42.1`` beside JAX 0.10.2,
the chip image's). Its analysis is the chip's: GPT-2 124M's step (``gpt2-124m-tokens``) came to
8,699 MiB of temporaries here and 8,698 MiB on the chip (benchmarks/device/RESULTS.md). The
splash kernel is compiled as the chip runs it (``attention = "auto"``), not interpreted. One
program takes about 90-100 s of one core.

``--target cpu`` compiles with the CPU's XLA. Its figures are not the chip's, in either
direction: ``llama-1b`` LoRA at batch 10 came to 24.3 GiB there against 15.0 on the chip (the
CPU keeps float32 copies of bf16 activations), and ``llama-1b`` with only the optimizer state
offloaded to 12.8 GiB at batch 1 against the chip's refusal at 16.3 (the CPU moves no host
memory). It shows the script runs; it promises nothing about the chip.

The footprint of a program is the larger of XLA's ``peak_memory_in_bytes`` and arguments +
outputs - aliased (donated) + temporaries in device memory; an offloaded state's host-memory
arguments are not the device's (``zoo.remat.step_bytes``). A program the TPU compiler refuses
for memory is a row that does not fit, with the compiler's words. The recipe's model is its
preset at the preset's vocabulary (GPT-2's 50,257 ids, Llama 3's 128,256: what its description
says to tokenize with); a DP recipe's plan counts a store of 500,000 windows (about 0.5B tokens) (the padded batch
moves the scan's length, not a microbatch's memory).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

from zoo import recipes  # noqa: E402
from zoo.bench.step import bench_start, placed_shapes  # noqa: E402
from zoo.dp.plan import make_plan  # noqa: E402
from zoo.models import canonical, splash  # noqa: E402
from zoo.models.registry import get_config  # noqa: E402
from zoo.parallel.layout import layout_for  # noqa: E402
from zoo.remat import step_bytes  # noqa: E402
from zoo.train import stages  # noqa: E402

TARGETS = ("tpu-v5e", "cpu")
DP_WINDOWS = 500_000
OOM_WORDS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "exceeds")


def accelerator_recipes(names: list[str] | None = None) -> list[recipes.Recipe]:
    """The built-in recipes that declare ``device_memory`` (or those named)."""
    chosen = [recipes.load_recipe(n) for n in (names or recipes.builtin_names())]
    return [r for r in chosen if names or r.device_memory is not None]


def target_device(target: str) -> jax.Device:
    """A device to compile for: a compile-only TPU v5e chip, or this host's first CPU device."""
    if target == "cpu":
        return jax.devices("cpu")[0]
    # libtpu takes a lock file per process and asks a cloud metadata server where it runs; a
    # compile-only topology needs neither.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        topology_name="v5e:1x1", platform="tpu", chips_per_host_bounds=(1, 1, 1)
    )
    return topology.devices[0]


@contextlib.contextmanager
def compiled_for(device: jax.Device):
    """While lowering for a TPU from a CPU host: ``attention = "auto"`` is the splash kernel and
    it is compiled for the chip (``zoo.models.splash.on_tpu`` answers for the target, not for the
    process's default backend)."""
    real = splash.on_tpu
    splash.on_tpu = lambda: device.platform == "tpu"
    try:
        yield
    finally:
        splash.on_tpu = real


def _on(device, tree):
    sharding = SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def programs(recipe: recipes.Recipe, device: jax.Device) -> dict:
    """``{name: (jitted function, argument shapes)}``: what ``zoo train`` runs on the device for
    ``recipe`` at its shipped shapes, from shapes alone."""
    cfg = get_config(recipe.model.preset, **dict(recipe.model.overrides))
    shapes = jax.eval_shape(functools.partial(canonical.init_params, cfg, 0))
    start = bench_start(cfg, recipe, shapes)
    layout = layout_for(start.cfg, devices=[device])
    start = dataclasses.replace(start, layout=layout)
    plan = None
    if recipe.dp.enabled:
        plan = make_plan(
            recipe.dp,
            DP_WINDOWS,
            recipe.train.steps,
            layout,
            seed=0,
            microbatch_size=recipe.train.microbatch_size,
        )
    engine = stages.engine(recipe, start, plan, recipe.train.steps)
    state, frozen = placed_shapes(engine, *jax.eval_shape(lambda p: engine.init_state(p, 0), start.params))
    rows = plan.sampler.padded_batch_size if plan else recipe.train.batch_size
    micro = recipe.train.microbatch_size
    eval_rows = min(rows, micro) if micro else rows  # zoo.train.run.Run.eval_rows, one device
    seq = recipe.data.seq_len

    def batch(n: int) -> dict:
        return _on(device, {
            "x": jax.ShapeDtypeStruct((n, seq), jnp.int32),
            "y": jax.ShapeDtypeStruct((n, seq), jnp.int32),
            "mask": jax.ShapeDtypeStruct((n,), jnp.float32),
        })  # fmt: skip

    out = {}
    if (
        recipe.train.placement == "update-on-host"
    ):  # the device's program: the gradient from compute-dtype params
        step = engine.train_step
        up = jax.eval_shape(engine.precision.to_compute, state.params)
        read = dataclasses.replace(
            state, params=_on(device, up), opt_state=(), **_on(device, {"step": state.step, "rng": state.rng})
        )
        out["gradient"] = (step.grads, (read, frozen, batch(rows)))  # zoo.parallel.host_step.HostStep.up
        eval_params = _on(device, up)
    else:
        out["train"] = (engine.train_step, (state, frozen, batch(rows)))
        eval_params = state.params
    out["eval"] = (engine.eval_step, (eval_params, frozen, batch(eval_rows)))
    return out


def footprint(compiled) -> dict:
    """Device bytes of a compiled program (the module docstring's rule) and their parts."""
    parts = step_bytes(compiled, host_separate=True)
    peak = int(getattr(compiled.memory_analysis(), "peak_memory_in_bytes", 0) or 0)
    total = parts["argument_bytes"] + parts["output_bytes"] - parts["alias_bytes"] + parts["temp_bytes"]
    return {**parts, "peak_bytes": peak, "footprint_bytes": max(peak, total)}


def measure(recipe: recipes.Recipe, device: jax.Device, only: str | None = None) -> list[dict]:
    """One row per program of ``recipe`` (``only``: that program alone)."""
    limit = recipe.device_memory
    rows = []
    with compiled_for(device):
        for name, (fn, args) in programs(recipe, device).items():
            if only and name != only:
                continue
            row = {"recipe": recipe.name, "program": name, "target": device.device_kind, "limit_bytes": limit}
            tic = time.perf_counter()
            try:
                compiled = fn.lower(*args).compile()
            except Exception as error:  # noqa: BLE001 - a compile-time out-of-memory is a result
                if not any(w in str(error) for w in OOM_WORDS):
                    raise
                rows.append({**row, "fits": False, "why": " ".join(str(error).split())[:400]})
                say(rows[-1])
                continue
            found = footprint(compiled)
            fits = limit is None or found["footprint_bytes"] <= limit
            rows.append({**row, **found, "fits": fits, "compile_s": round(time.perf_counter() - tic, 1)})
            say(rows[-1])
    return rows


def say(row: dict) -> None:
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b is not None else "-"  # noqa: E731
    what = gib(row.get("footprint_bytes")) if "footprint_bytes" in row else row.get("why", "")
    print(
        f"recipe_fits: {row['recipe']} {row['program']} on {row['target']}: {what} of {gib(row['limit_bytes'])}"
        f" ({'fits' if row['fits'] else 'DOES NOT FIT'}; temp {gib(row.get('temp_bytes'))},"
        f" args {gib(row.get('argument_bytes'))}, compile {row.get('compile_s', '-')} s)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", help="comma-separated recipe names (default: every one with device_memory)")
    p.add_argument("--target", choices=TARGETS, default="tpu-v5e")
    p.add_argument("--program", help="one program of each recipe: train, gradient or eval")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    device = target_device(args.target)
    rows = []
    for recipe in accelerator_recipes(args.recipes.split(",") if args.recipes else None):
        rows += measure(recipe, device, args.program)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
