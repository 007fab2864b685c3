"""``zoo train``, ``zoo eval`` and ``zoo params``."""

from __future__ import annotations

import argparse
import shlex
import warnings
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from zoo import recipes as recipe_lib
from zoo.commands import settings
from zoo.configs import add_precision_flag
from zoo.data.table import dataset_help
from zoo.errors import ZooError
from zoo.train.rundir import new_run_dir
from zoo.ui import console, emit_json, print_table

# The training stack (orbax, datasets, the engine) is imported inside the commands that use
# it, so that `zoo train --help` starts without it.

FLAG_FIELDS = {  # flag dest -> (section, field) of the recipe
    "backend": ("model", "backend"),
    "remat": ("train", "remat"),
    "memory_budget": ("train", "memory_budget"),
    "precision": ("train", "precision"),
    "placement": ("train", "placement"),
    # The old spelling of --placement, one release more (zoo.recipes reads them as it).
    "offload": ("train", "offload"),
    "update_on": ("train", "update_on"),
    "microbatch_size": ("train", "microbatch_size"),
    "dataset": ("data", "dataset"),
    "steps": ("train", "steps"),
    "batch_size": ("train", "batch_size"),
    "lr": ("optim", "lr"),
    "seed": ("train", "seed"),
    "init_from": ("model", "init_from"),
    "freeze": ("freeze", "patterns"),
}


def _lora_values(text: str) -> dict[str, object]:
    from zoo.lora import parse_flag

    return {key.removeprefix("lora."): value for key, value in parse_flag(text).items()}


def _mesh_values(text: str) -> dict[str, object]:
    from zoo.parallel.mesh import flag_values

    return flag_values(text)  # --mesh '' is refused, not ignored


SECTION_FLAGS = {  # flag dest -> (section, parser of the flag into that section's fields)
    "lora": ("lora", _lora_values),
    "mesh": ("mesh", _mesh_values),
}


def recipe_changes(args) -> dict[str, dict[str, object]]:
    """The recipe fields that the flags and ``--set`` values of ``args`` set, parsed once, as
    ``{section: {field: value}}``. Flags and --set land together, so that one may complete
    another (--memory-budget with --set train.remat=auto). Where a flag and a --set name the
    same field, the flag wins, whatever their order: docs/recipes.md's "flags override fields",
    and a --set kept in a script or an alias stays open to a flag typed after it."""
    changes = settings.parse_sets(args.set or [])
    for dest, (section, field) in FLAG_FIELDS.items():
        if getattr(args, dest, None) is not None:
            changes.setdefault(section, {})[field] = getattr(args, dest)
    for dest, (section, parse) in SECTION_FLAGS.items():
        if getattr(args, dest, None) is not None:
            changes.setdefault(section, {}).update(parse(getattr(args, dest)))
    return changes


def resolve_recipe(args) -> recipe_lib.Recipe:
    """The recipe ``args`` name, with its flags and ``--set`` values applied."""
    recipe = recipe_lib.load_recipe(args.recipe)
    changes = recipe_changes(args)
    model = changes.get("model", {})
    if str(model.get("init_from", "")).startswith("hf:"):  # a Hugging Face checkpoint
        from zoo.train.hf import import_cached

        model["init_from"] = str(import_cached(model["init_from"][3:], recipe.model.backend))
    recipe = recipe_lib.override(recipe, changes) if changes else recipe
    if recipe.model.init_from:  # an import of a Hugging Face checkpoint brings its architecture
        from zoo.train.hf import with_imported_model

        recipe = with_imported_model(recipe, model)
    return recipe


def add_recipe_flags(p) -> None:
    """The recipe argument and the flags that override its fields (``zoo train``, ``zoo audit``)."""
    p.add_argument("recipe", help="recipe name (see `zoo recipes`) or path to a .toml file")
    p.add_argument("--backend", choices=None, help="nnx or eqx")
    p.add_argument("--remat", help="remat policy (see `zoo remat-policies`), or auto (the fastest that fits)")
    p.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="with --remat auto: the budget its step must fit, e.g. 256MiB (default on an accelerator: "
        "its memory less 5%%; a CPU needs one)",
    )
    add_precision_flag(p, "compute dtype over float32 params and optimizer state")
    p.add_argument(
        "--placement",
        help="where the training state lives: device; offload-optimizer or offload-optimizer+params "
        "(host memory between steps); update-on-host (the state and the update on the host's CPU)",
    )
    p.add_argument("--offload", help=argparse.SUPPRESS)  # old spelling of --placement, one release more
    p.add_argument("--update-on", help=argparse.SUPPRESS)
    p.add_argument(
        "--microbatch-size",
        type=int,
        help="take each step's batch this many rows at a time (train.microbatch_size): the gradient, or "
        "under DP the clipped sums, accumulate; the noise is drawn once",
    )
    p.add_argument("--dataset", help=dataset_help())
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--init-from",
        metavar="CHECKPOINT_DIR",
        help="start from a zoo run directory, or hf:SRC (a Hugging Face checkpoint, imported once)",
    )
    p.add_argument(
        "--freeze",
        action="append",
        metavar="PATTERN",
        help="freeze canonical params matching PATTERN (repeatable), e.g. embed, blocks[0:2]",
    )
    p.add_argument(
        "--lora",
        metavar="SPEC",
        help="low-rank adapters on a frozen base (needs --init-from), e.g. "
        "rank=8,alpha=16,targets=attn.q|attn.v ; targets are dense-layer patterns as in --freeze",
    )
    p.add_argument(
        "--mesh",
        metavar="SPEC",
        help="device mesh, e.g. data=2,fsdp=4,tensor=1 (sizes multiply to the device count), "
        "or auto: every device on data",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override any recipe field, e.g. --set dp.epsilon=8",
    )


def run_train(args) -> int:
    from zoo.parallel import distributed

    # Before anything touches a device: join the other processes, if there are any.
    distributed.initialize(distributed.cluster_from(args.coordinator, args.num_processes, args.process_id))
    from zoo.train.loop import train_recipe

    recipe = resolve_recipe(args)
    main = distributed.is_main_process()
    if args.resume and not args.out:
        raise ZooError("--resume needs --out DIR: the run directory to continue")
    out = Path(args.out) if args.out else new_run_dir(recipe.name, only_process=jax.process_count() == 1)
    human = Console(stderr=True) if args.json or not main else console
    profile = _profile_window(args.profile, recipe) if args.profile is not None else None
    summary = train_recipe(
        recipe,
        out,
        resume=args.resume,
        console=Console(stderr=True),
        show_progress=not args.no_progress,
        on_built=(lambda run: print_param_table(run, human)) if main else None,
        resume_command=continue_command(args, out),
        profile=profile,
    )
    if not main:
        return 0
    if args.json:
        emit_json(summary)
    else:
        print_table(
            f"{recipe.name} ({summary['backend']}, remat={summary['remat']}, {summary.get('precision', 'float32')})",
            ["metric", "value"],
            [(k, _fmt(v)) for k, v in summary.items()],
        )
    return 0


def _profile_window(text: str, recipe):
    from zoo.train.tracking import parse_profile

    try:
        return parse_profile(text, recipe.train.steps, jax.process_count())
    except ValueError as error:
        raise ZooError(str(error)) from None


def continue_command(args, out: Path) -> str:
    """The ``zoo train`` command that continues this one after an interrupt: the same recipe,
    flags and ``--set`` values (a resume must not change the run), ``--resume --out OUT``."""
    words = ["zoo", "train", args.recipe]
    for dest in (*FLAG_FIELDS, *SECTION_FLAGS):
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else [] if value is None else [value]:
            words += [f"--{dest.replace('_', '-')}", str(item)]
    for assignment in args.set or []:
        words += ["--set", assignment]
    return shlex.join(
        [*words, *(["--no-progress"] if args.no_progress else []), "--resume", "--out", str(out)]
    )


def _fmt(value) -> str:
    if value is None:  # a figure with nothing to measure it by (the MFU on a CPU)
        return "n/a"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_param_table(run, out: Console) -> None:
    print_table(
        f"parameters of {run.recipe.model.preset}",
        ["path", "shape", "count", "trainable"],
        [
            (path, shape, f"{count:,}", str(run.freeze.trainable(path)))
            for path, shape, count in _param_rows(run.params)
        ],
        out=out,
    )
    out.print(
        f"trainable {run.freeze.trainable_count:,}  frozen {run.freeze.frozen_count:,}  "
        f"total {run.freeze.trainable_count + run.freeze.frozen_count:,}"
    )


def _param_rows(params):
    return [
        (jax.tree_util.keystr(p, simple=True, separator="."), tuple(x.shape), int(np.prod(x.shape)))
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    ]


def run_eval(args) -> int:
    from zoo.train import checkpoint
    from zoo.train.engine import evaluate
    from zoo.train.run import build_run
    from zoo.train.summary import task_metrics

    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    if "hf_source" in checkpoint.restore_meta(args.checkpoint_dir, ckpt.step):
        raise ZooError(
            f"{args.checkpoint_dir} is an import of a Hugging Face checkpoint: it has no eval data "
            "of its own; evaluate a run trained from it (zoo train hf-lm-lora --init-from "
            f"{args.checkpoint_dir} --dataset text:PATH)"
        )
    recipe = recipe_lib.override(
        ckpt.recipe, {"model": {"init_from": str(args.checkpoint_dir)}, "freeze": {"patterns": []}}
    )
    with warnings.catch_warnings():  # the training-time notices were given when it trained
        warnings.simplefilter("ignore")
        run = build_run(recipe, choose_remat=False)
    state, frozen = run.engine.init_state(run.params, recipe.train.seed)
    metrics = evaluate(run.engine, state, frozen, run.task.eval_batches(run.eval_rows, run.eval_batch_count))
    metrics = {"checkpoint": str(args.checkpoint_dir), "step": ckpt.step, **task_metrics(run.task, metrics)}
    if run.dp:
        metrics.update(_dp_guarantee(run, ckpt))
    hard = None
    if args.hardest:
        from zoo.train.hardest import hardest

        batches = run.task.eval_batches(run.eval_rows, run.eval_batch_count)
        hard = hardest(run.engine, state, frozen, batches, args.hardest)
    if args.json:
        emit_json({**metrics, "hardest": hard} if hard is not None else metrics)
        return 0
    print_table(
        f"eval of {args.checkpoint_dir}", ["metric", "value"], [(k, _fmt(v)) for k, v in metrics.items()]
    )
    if hard is not None:
        columns = list(dict.fromkeys(key for row in hard for key in row))
        print_table(
            f"the {len(hard)} eval examples with the highest loss",
            ["rank", *columns],
            [(str(i + 1), *(_fmt(row.get(c, "")) for c in columns)) for i, row in enumerate(hard)],
        )
    return 0


def _dp_guarantee(run, ckpt) -> dict:
    """The ``(epsilon, delta)`` a DP checkpoint's parameters carry, truncation (and a DP-PCA
    projection) included, and what they protect, as the run's summary says it (a user's
    epsilon must not read like a record's): the privacy unit, the number of units and, for
    users, the records a user gives a step."""
    from zoo.train.summary import privacy_unit

    return {**run.dp.privacy_at(ckpt.step), **privacy_unit(run.task, run.dp)}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of examples, got {text!r}")
    return value


def run_params(args) -> int:
    from zoo.train import checkpoint
    from zoo.train.run import build_run

    target = Path(args.target)
    if (target / checkpoint.CHECKPOINT_DIR).exists():
        ckpt = checkpoint.load_checkpoint(target)
        recipe = recipe_lib.override(ckpt.recipe, {"model": {"init_from": str(target)}})
        if "hf_source" in checkpoint.restore_meta(target, ckpt.step):  # an import: no data to read
            from types import SimpleNamespace

            from zoo.freeze import resolve_freeze

            run = SimpleNamespace(recipe=recipe, params=ckpt.params)
            run.freeze = resolve_freeze(ckpt.params, args.freeze or [])
            return _print_params(run, args.json)
    else:
        recipe = recipe_lib.load_recipe(args.target)
    if args.freeze:
        recipe = recipe_lib.override(recipe, {"freeze": {"patterns": args.freeze}})
    return _print_params(build_run(recipe, choose_remat=False), args.json)


def _print_params(run, as_json: bool) -> int:
    if as_json:
        emit_json(
            {
                "rows": [
                    {"path": p, "shape": s, "count": c, "trainable": str(run.freeze.trainable(p))}
                    for p, s, c in _param_rows(run.params)
                ],
                "trainable": run.freeze.trainable_count,
                "frozen": run.freeze.frozen_count,
            }
        )
    else:
        print_param_table(run, console)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a recipe")
    add_recipe_flags(p)
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/RECIPE-TIMESTAMP)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON (last line)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--profile",
        metavar="STEP[:N]",
        help="jax.profiler trace of N steps (default 1) from STEP (at least 2: step 1 compiles) "
        "into OUT/tb/plugins/profile, with the device memory profile beside it",
    )
    p.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="train on many processes: the address of process 0 (or JAX_COORDINATOR_ADDRESS)",
    )
    p.add_argument("--num-processes", type=int, help="with --coordinator (or JAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, help="this process, 0..N-1 (or JAX_PROCESS_ID)")
    p.set_defaults(func=run_train)

    p = sub.add_parser("eval", help="re-evaluate a saved run")
    p.add_argument("checkpoint_dir")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--hardest", type=_positive, metavar="K", help="also list the K eval examples with the highest loss"
    )
    p.set_defaults(func=run_eval)

    p = sub.add_parser("params", help="parameter table of a recipe or run directory")
    p.add_argument("target", metavar="RECIPE|CHECKPOINT_DIR")
    p.add_argument("--freeze", action="append", metavar="PATTERN")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_params)
