"""``zoo bench finetune``: full fine-tuning against fine-tuning with a frozen prefix, and with
``--lora SPEC`` against low-rank adapters on the frozen model, private or not.

Side by side in one process, on the same params and batch: compiled train-step temp memory,
optimizer-state bytes, and median step time, each as a ratio to full fine-tuning. The runs
take turns in timed rounds (:func:`zoo.bench.common.time_in_rounds`); a step ratio is the
median of the per-round ratios. With ``--lora``, two rows join: ``lora`` (adapters, no DP) and
``dp-lora`` (DP-SGD on the adapters with ghost clipping), whose ``vs_lora`` is its step time
over the ``lora`` step's.
"""

from __future__ import annotations

import dataclasses
import statistics

import jax
import numpy as np

from zoo import lora as lora_adapters
from zoo.api import example_batch, example_labels
from zoo.bench.common import median_ratio, positive_int, state_stepper, time_in_rounds
from zoo.bench.step import Progress, say
from zoo.configs import LoraConfig, OptimConfig
from zoo.dp.plan import fixed_batch_plan
from zoo.models import canonical
from zoo.models.registry import get_config
from zoo.train import stages
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.state import make_optimizer
from zoo.ui import emit_json, print_table, stage_lines


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _compiled_run(start: stages.Start, backend, policy, batch, dp=None):
    """One row's run: the engine stage on the model ``start`` (:mod:`zoo.train.stages`, its
    freeze plan) with the DP plan ``dp`` (None: no DP), compiled for ``batch``."""
    optimizer = make_optimizer(OptimConfig(name="adamw", lr=1e-4), 1000, clip=dp is None)
    engine = make_engine(start, GradientSettings(backend, optimizer, remat=policy), dp=dp)
    state, frozen = engine.init_state(start.params, 0)
    compiled = engine.train_step.lower(state, frozen, batch).compile()
    return dict(
        engine=engine,
        plan=start.freeze,
        state=state,
        frozen=frozen,
        temp=compiled.memory_analysis().temp_size_in_bytes,
        opt_bytes=_nbytes(state.opt_state),
    )


def lora_start(cfg, params: dict, section: LoraConfig, seed: int = 0) -> stages.Start:
    """The model start of a LoRA run on ``params`` as its frozen base, without a recipe: the
    adapters ``section`` names (:func:`zoo.lora.resolve`), fresh from ``seed`` as ``zoo train``
    starts them, and the base frozen (:func:`zoo.lora.freeze_plan`), through
    :func:`zoo.train.stages.config_start`."""
    setup = lora_adapters.resolve(cfg, section)
    adapted = lora_adapters.adapted_config(cfg, setup)
    params = lora_adapters.initial_params(adapted, cfg, params, seed)
    start = stages.config_start(adapted, params, freeze=lora_adapters.freeze_plan(adapted, setup))
    return dataclasses.replace(start, adapters=setup)


def _lora_runs(cfg, backend, params, spec: str, policy, data, batch, progress: Progress):
    start = lora_start(cfg, params, lora_adapters.section_from_flag(spec))
    dp = fixed_batch_plan(batch, noise_multiplier=1.0, clip_norm=1.0, clipping="ghost")
    runs = {}
    for name, plan in (("lora", None), ("dp-lora", dp)):
        say(progress, f"finetune bench: compiling {name}")
        runs[name] = _compiled_run(start, backend, policy, data, plan)
    return runs


def bench_finetune(
    model: str = "transformer-s",
    *,
    backend: str = "nnx",
    batch: int = 16,
    seq: int | None = None,
    freeze: tuple[str, ...] | None = None,
    lora: str | None = None,
    policy: str = "none",
    steps: int = 5,
    repeats: int = 5,
    layers: int | None = None,
    progress: Progress = None,
) -> dict:
    """``freeze`` patterns may say ``{half}`` (``num_layers // 2``); the default is the kind's
    frozen prefix (``cfg.frozen_prefix()``). ``layers`` overrides the preset's ``num_layers``.
    ``progress(message)`` hears each compile and timing round as it starts."""
    cfg = get_config(model, **({"num_layers": layers} if layers else {}))
    half = cfg.num_layers // 2
    patterns = tuple(p.format(half=half) for p in freeze) if freeze else cfg.frozen_prefix()
    params = canonical.init_params(cfg, 0)
    x = example_batch(cfg, batch, seed=1, seq_len=seq)
    labels = example_labels(cfg, x, seed=0)  # [B] for a classifier, [B, T] for a language model
    data = jax.device_put({"x": x, "y": labels, "mask": np.ones(batch, np.float32)})
    runs = {}
    for name, pats in (("full", ()), ("frozen", patterns)):
        say(progress, f"finetune bench: compiling {name}")
        runs[name] = _compiled_run(stages.config_start(cfg, params, patterns=pats), backend, policy, data)
    if lora:
        runs.update(_lora_runs(cfg, backend, params, lora, policy, data, batch, progress))

    say(progress, f"finetune bench: a warm-up step of each of {len(runs)} runs")
    times = time_in_rounds(
        {
            name: state_stepper(run["engine"].train_step, run, run["frozen"], data)
            for name, run in runs.items()
        },
        repeats,
        steps,
        on_round=lambda r: say(progress, f"finetune bench: timing round {r + 1}/{repeats}"),
    )
    rows = []
    for name, run in runs.items():
        rows.append(
            {
                "run": name,
                "trainable_params": run["plan"].trainable_count,
                "temp_bytes": int(run["temp"]),
                "opt_state_bytes": run["opt_bytes"],
                "step_ms": statistics.median(times[name]) * 1e3,
                "step_ratio": median_ratio(times[name], times["full"]),
            }
        )
    full = rows[0]
    for row in rows:
        row["temp_ratio"] = row["temp_bytes"] / full["temp_bytes"]
        row["opt_state_ratio"] = row["opt_state_bytes"] / full["opt_state_bytes"]
        row["trainable_ratio"] = row["trainable_params"] / full["trainable_params"]
        if row["run"] == "dp-lora":
            row["vs_lora"] = median_ratio(times["dp-lora"], times["lora"])
    return {
        "model": model,
        "backend": backend,
        "batch": batch,
        "seq": int(x.shape[1]) if x.ndim > 1 else None,
        "policy": policy,
        "freeze": list(patterns),
        "lora": lora,
        "rows": rows,
    }


def run(args) -> int:
    freeze = tuple(args.freeze) if args.freeze else None
    result = bench_finetune(
        args.model,
        backend=args.backend,
        batch=args.batch,
        seq=args.seq,
        freeze=freeze,
        lora=args.lora,
        policy=args.remat,
        steps=args.steps,
        repeats=args.repeats,
        layers=args.layers,
        progress=stage_lines(args.quiet),
    )
    if args.json:
        emit_json(result)
        return 0
    print_table(
        f"fine-tune vs full: {args.model}, freeze {', '.join(result['freeze'])}"
        + (f", lora {args.lora}" if args.lora else "")
        + f", remat={args.remat}",
        [
            "run",
            "trainable",
            "temp MiB",
            "temp ratio",
            "opt-state ratio",
            "trainable ratio",
            "step ms",
            "step ratio",
            "vs lora",
        ],
        [
            (
                r["run"],
                f"{r['trainable_params']:,}",
                f"{r['temp_bytes'] / 2**20:.1f}",
                f"{r['temp_ratio']:.3f}",
                f"{r['opt_state_ratio']:.4f}",
                f"{r['trainable_ratio']:.4f}",
                f"{r['step_ms']:.1f}",
                f"{r['step_ratio']:.3f}",
                f"{r['vs_lora']:.3f}" if "vs_lora" in r else "",
            )
            for r in result["rows"]
        ],
    )
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("finetune", help="full fine-tuning vs a frozen prefix: memory and time")
    p.add_argument("model", nargs="?", default="transformer-s")
    p.add_argument("--backend", default="nnx")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--seq", type=positive_int)
    p.add_argument("--layers", type=positive_int, help="override num_layers")
    p.add_argument(
        "--freeze",
        action="append",
        metavar="PATTERN",
        help="default: the kind's input layers and blocks[0:L/2] ({half} in a pattern is L/2)",
    )
    p.add_argument(
        "--lora",
        metavar="SPEC",
        help="also LoRA rows, e.g. rank=8,alpha=16,targets=attn.* (as zoo train --lora)",
    )
    p.add_argument("--remat", default="none")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed rounds")
    p.add_argument("--steps", type=positive_int, default=5, help="steps per timed round")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)
