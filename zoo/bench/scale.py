"""``zoo bench scale``: one model's train step on several device meshes, side by side.

For each mesh: the per-device bytes of params and optimizer state (read off the placed
arrays' shards on the first device), the compiled step's temp bytes per device (XLA's
``memory_analysis()`` of the partitioned program), the median step time, and the collectives
XLA put into the compiled HLO (counts and result bytes per kind; a collective inside the
layer scan's loop body counts once, though it runs once per layer). The meshes take turns in
timed rounds on the same global batch.

``block_temp_bytes_per_device`` is the temp of one block alone: the forward and backward of a
single layer (params sharded by the same rules, the block input split over the batch axes
like the batch), compiled for the same mesh. Tensor parallelism splits what lives inside a
block (attention scores, MLP hidden), so this is where its saving shows; the whole step's temp
also holds the embedding, the logits and the loss, which ``tensor`` leaves whole.
"""

from __future__ import annotations

import math
import re
import statistics

import jax
import numpy as np

from zoo.api import example_batch, example_labels
from zoo.bench.common import positive_int, state_stepper, time_in_rounds
from zoo.bench.step import Progress, say
from zoo.configs import OptimConfig
from zoo.errors import ZooError
from zoo.models import canonical
from zoo.models.registry import get_config, replace_checked
from zoo.parallel import layout_for, parse_mesh
from zoo.train import stages
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.state import make_optimizer
from zoo.ui import emit_json, print_table, stage_lines

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_SHORT = {
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "collective-permute": "CP",
}
_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
# `%name = TYPE op(` where TYPE is one shape or a tuple of them (with /*index=N*/ comments);
# async pairs count at -start.
_OP = re.compile(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def collectives(hlo: str) -> dict[str, dict[str, int]]:
    """``{kind: {"count", "bytes"}}`` of the collectives in compiled HLO text."""
    out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for line in hlo.splitlines():
        match = _OP.search(line)
        if not match:
            continue
        kind = match.group(2)
        out[kind]["count"] += 1
        for dtype, dims in _SHAPE.findall(match.group(1)):
            size = int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
            out[kind]["bytes"] += size * _DTYPE_BYTES.get(dtype, 4)
    return out


def _bytes_on(tree, device) -> int:
    return sum(
        shard.data.nbytes
        for leaf in jax.tree_util.tree_leaves(tree)
        for shard in leaf.addressable_shards
        if shard.device == device
    )


def block_temp(cfg, backend: str, layout, batch: int, seq: int | None) -> int:
    """Compiled temp bytes per device of one block's forward and backward on ``layout``."""
    one = replace_checked(cfg, num_layers=1)
    one_layout = layout_for(one, layout.spec, list(layout.mesh.devices.flat))
    params = jax.eval_shape(lambda: canonical.init_params(one, 0))
    h = jax.ShapeDtypeStruct(one.block_input_shape(batch, seq), jax.numpy.float32)

    def fwd_bwd(params, h, cotangent):
        layer_fn, stacked = canonical.from_canonical(one, backend, params).stack()
        layer = jax.tree_util.tree_map(lambda a: a[0], stacked)
        _, vjp = jax.vjp(layer_fn, layer, h)
        return vjp(cotangent)

    rows = one_layout.batch_sharding()
    shardings = (one_layout.params(), rows, rows)
    compiled = jax.jit(fwd_bwd, in_shardings=shardings).lower(params, h, h).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def _seq(batch) -> int | None:
    return int(batch["x"].shape[1]) if batch["x"].ndim > 1 else None


def _layout(cfg, mesh_text: str, rows: int):
    """The layout of one ``--mesh``, checked against the batch's ``rows`` before anything is
    compiled or printed. A bench mesh may use fewer devices than there are (tensor=2 next to
    data=8): the first ones."""
    spec = parse_mesh(mesh_text)
    layout = layout_for(cfg, spec, jax.devices()[: spec.devices] if spec.data else None)
    ways = layout.spec.batch_ways
    if rows % ways:  # name the devices: a bench mesh may use fewer than there are
        raise ZooError(
            f"mesh {layout.spec} splits the batch {ways} ways over {layout.devices} of the "
            f"{jax.device_count()} devices, and --batch {rows} is not a multiple of {ways}; use "
            f"--batch {math.lcm(rows, ways)}, or a mesh whose data x fsdp divides {rows}"
        )
    return layout


def _mesh_run(cfg, backend, layout, remat, params, batch):
    start = stages.config_start(cfg, params, layout=layout)
    optimizer = make_optimizer(OptimConfig(name="adamw", lr=1e-4), 1000)
    engine = make_engine(start, GradientSettings(backend, optimizer, remat=remat))
    state, frozen = engine.init_state(params, 0)
    placed = engine.place_batch(batch)
    compiled = engine.train_step.lower(state, frozen, placed).compile()
    first = layout.mesh.devices.flat[0]
    return {
        "engine": engine,
        "state": state,
        "frozen": frozen,
        "batch": placed,
        "row": {
            "mesh": str(layout.spec),
            "devices": layout.devices,
            "param_bytes_per_device": _bytes_on((state.params, frozen), first),
            "opt_state_bytes_per_device": _bytes_on(state.opt_state, first),
            "temp_bytes_per_device": int(compiled.memory_analysis().temp_size_in_bytes),
            "block_temp_bytes_per_device": block_temp(
                cfg, backend, layout, int(batch["x"].shape[0]), _seq(batch)
            ),
            "collectives": collectives(compiled.as_text()),
        },
    }


def bench_scale(
    model: str,
    meshes: list[str],
    *,
    backend: str = "nnx",
    remat: str = "none",
    batch: int = 16,
    seq: int | None = None,
    repeats: int = 5,
    steps: int = 3,
    progress: Progress = None,
) -> dict:
    """``progress(message)`` hears each mesh's compile and each timing round as it starts."""
    cfg = get_config(model)
    x = np.asarray(example_batch(cfg, batch, seed=0, seq_len=seq))
    data = {"x": x, "y": np.asarray(example_labels(cfg, x)), "mask": np.ones(batch, np.float32)}
    layouts = {m: _layout(cfg, m, batch) for m in meshes}  # every mesh checked before any work
    if len({str(layout.spec) for layout in layouts.values()}) < len(layouts):
        raise ZooError(f"--mesh lists one mesh twice: {';'.join(meshes)}")
    params = canonical.init_params(cfg, 0)
    runs = {}
    for m, layout in layouts.items():
        say(progress, f"scale bench: compiling the step and one block on mesh {m}")
        runs[m] = _mesh_run(cfg, backend, layout, remat, params, data)
    steppers = {
        m: state_stepper(lambda s, r=r: r["engine"].train_step(s, r["frozen"], r["batch"]), r)
        for m, r in runs.items()
    }
    say(progress, f"scale bench: a warm-up step on each of {len(runs)} meshes")
    times = time_in_rounds(
        steppers,
        repeats,
        steps,
        on_round=lambda r: say(progress, f"scale bench: timing round {r + 1}/{repeats}"),
    )
    rows = [{**r["row"], "step_ms": statistics.median(times[m]) * 1e3} for m, r in runs.items()]
    return {
        "model": model,
        "backend": backend,
        "remat": remat,
        "batch": batch,
        "seq": _seq(data),
        "device": jax.devices()[0].platform,
        "repeats": repeats,
        "steps_per_repeat": steps,
        "rows": rows,
    }


def run(args) -> int:
    meshes = [m.strip() for m in args.mesh.split(";") if m.strip()]
    result = bench_scale(
        args.model,
        meshes,
        backend=args.backend,
        remat=args.remat,
        batch=args.batch,
        seq=args.seq,
        repeats=args.repeats,
        steps=args.steps,
        progress=stage_lines(args.quiet),
    )
    if args.json:
        emit_json(result)
        return 0
    base = result["rows"][0]
    print_table(
        f"scale: {args.model} ({args.backend}, remat={args.remat}, batch {args.batch}); "
        f"bytes per device, ratios to {base['mesh']}",
        [
            "mesh",
            "dev",
            "params+opt",
            "ratio",
            "temp",
            "ratio",
            "block temp",
            "ratio",
            "step ms",
            "collectives",
        ],
        [
            (
                r["mesh"],
                str(r["devices"]),
                f"{(r['param_bytes_per_device'] + r['opt_state_bytes_per_device']) / 2**20:.2f} MiB",
                f"{(r['param_bytes_per_device'] + r['opt_state_bytes_per_device']) / (base['param_bytes_per_device'] + base['opt_state_bytes_per_device']):.3f}",
                f"{r['temp_bytes_per_device'] / 2**20:.2f} MiB",
                f"{r['temp_bytes_per_device'] / base['temp_bytes_per_device']:.3f}",
                f"{r['block_temp_bytes_per_device'] / 2**20:.2f} MiB",
                f"{r['block_temp_bytes_per_device'] / base['block_temp_bytes_per_device']:.3f}",
                f"{r['step_ms']:.2f}",
                " ".join(f"{_SHORT[k]}:{v['count']}" for k, v in r["collectives"].items() if v["count"])
                or "-",
            )
            for r in result["rows"]
        ],
    )
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("scale", help="a train step on several device meshes: bytes, time, collectives")
    p.add_argument("model", nargs="?", default="transformer-s")
    p.add_argument(
        "--mesh",
        default="data=1;data=8;fsdp=8;data=2,fsdp=2,tensor=2",
        help="meshes separated by ';' (each as zoo train --mesh); the first is the ratios' base",
    )
    p.add_argument("--backend", default="nnx")
    p.add_argument("--remat", default="none")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--seq", type=positive_int)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=3, help="steps per timed round")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)
