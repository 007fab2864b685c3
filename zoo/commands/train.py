"""``zoo train``, ``zoo eval``, ``zoo sample``, ``zoo recipes`` and ``zoo params``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.table import Table

from zoo import recipes as recipe_lib
from zoo.errors import ZooError
from zoo.ui import console, emit_json, print_table

if TYPE_CHECKING:
    from zoo.train.checkpoint import Checkpoint

# The training stack (orbax, datasets, the engine) is imported inside the commands that use
# it: `zoo recipes` needs none of it and starts in half the time.

FLAG_FIELDS = {  # flag dest -> recipe field
    "backend": "model.backend",
    "remat": "train.remat",
    "dataset": "data.dataset",
    "steps": "train.steps",
    "batch_size": "train.batch_size",
    "lr": "optim.lr",
    "seed": "train.seed",
    "init_from": "freeze.init_from",
    "freeze": "freeze.patterns",
}


def resolve_recipe(args) -> recipe_lib.Recipe:
    recipe = recipe_lib.load_recipe(args.recipe)
    values = {
        field: getattr(args, dest)
        for dest, field in FLAG_FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if values:
        recipe = recipe_lib.with_values(recipe, values)
    return recipe_lib.with_sets(recipe, args.set or [])


def _add_recipe_flags(p) -> None:
    p.add_argument("recipe", help="recipe name (see `zoo recipes`) or path to a .toml file")
    p.add_argument("--backend", choices=None, help="nnx or eqx")
    p.add_argument("--remat", help="remat policy (see `zoo remat-policies`)")
    p.add_argument(
        "--dataset", help="digits, python-docs, hf:NAME[:CONFIG], text:PATH, csv:PATH, parquet:PATH"
    )
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--init-from", metavar="CHECKPOINT_DIR", help="start from a zoo run directory")
    p.add_argument(
        "--freeze",
        action="append",
        metavar="PATTERN",
        help="freeze canonical params matching PATTERN (repeatable), e.g. embed, blocks[0:2]",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override any recipe field, e.g. --set dp.epsilon=8",
    )


def run_train(args) -> int:
    from zoo.train.loop import build_run, train

    recipe = resolve_recipe(args)
    out = Path(args.out or f"runs/{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    human = Console(stderr=True) if args.json else console
    run = build_run(recipe)
    print_param_table(run, human)
    summary = train(
        recipe,
        out,
        resume=args.resume,
        console=Console(stderr=True),
        show_progress=not args.no_progress,
        run=run,
    )
    if args.json:
        emit_json(summary)
    else:
        print_table(
            f"{recipe.name} ({summary['backend']}, remat={summary['remat']})",
            ["metric", "value"],
            [(k, _fmt(v)) for k, v in summary.items()],
        )
    return 0


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_param_table(run, out: Console) -> None:
    table = Table(title=f"parameters of {run.recipe.model.preset}")
    for column in ("path", "shape", "count", "trainable"):
        table.add_column(column)
    for path, shape, count in _param_rows(run.params):
        table.add_row(path, str(shape), f"{count:,}", run.freeze.is_trainable(path))
    out.print(table)
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
    from zoo.train.loop import build_run

    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    recipe = recipe_lib.with_values(
        ckpt.recipe, {"freeze.init_from": str(args.checkpoint_dir), "freeze.patterns": []}
    )
    run = build_run(recipe)
    state, frozen = run.engine.init_state(run.params, recipe.train.seed)
    metrics = evaluate(
        run.engine, state, frozen, run.task.eval_batches(recipe.train.batch_size, recipe.train.eval_batches)
    )
    metrics = {"checkpoint": str(args.checkpoint_dir), "step": ckpt.step, **metrics}
    if run.task.is_lm:
        metrics.pop("eval_accuracy")
    else:
        metrics.pop("eval_bits_per_char")
    if args.json:
        emit_json(metrics)
    else:
        print_table(
            f"eval of {args.checkpoint_dir}", ["metric", "value"], [(k, _fmt(v)) for k, v in metrics.items()]
        )
    return 0


def sample_text(ckpt: Checkpoint, prompt: str, length: int, temperature: float, seed: int) -> str:
    """Sample ``length`` characters after ``prompt`` from an LM checkpoint.

    The model always sees a fixed [1, max_len] window, so the step compiles once.
    """
    from zoo.api import apply_fn

    cfg, tokenizer = ckpt.model_config, ckpt.tokenizer
    if tokenizer is None or cfg.kind != "transformer" or cfg.is_classifier:
        raise ZooError(f"{str(ckpt.path)!r} is not a language model checkpoint; `zoo sample` needs one")
    apply = apply_fn(cfg, ckpt.backend)
    window = cfg.max_len

    @jax.jit
    def next_token(params, tokens, position, key):
        logits = apply(params, tokens[None])[0, position]
        if temperature <= 0:
            return jnp.argmax(logits)
        return jax.random.categorical(key, logits / temperature)

    ids = list(tokenizer.encode(prompt)) or [0]
    key = jax.random.key(seed)
    for i in range(length):
        context = ids[-window:]
        tokens = np.zeros(window, np.int32)
        tokens[: len(context)] = context
        token = next_token(ckpt.params, tokens, len(context) - 1, jax.random.fold_in(key, i))
        ids.append(int(token))
    return tokenizer.decode(np.asarray(ids[len(tokenizer.encode(prompt)) :], np.int32))


def run_sample(args) -> int:
    from zoo.train import checkpoint

    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    text = sample_text(ckpt, args.prompt, args.length, args.temperature, args.seed)
    if args.json:
        emit_json({"prompt": args.prompt, "sample": text})
    else:
        console.print(args.prompt + text, markup=False, highlight=False)
    return 0


def run_recipes(args) -> int:
    if args.action == "show":
        if not args.name:
            raise ZooError("usage: zoo recipes show NAME")
        recipe = recipe_lib.load_recipe(args.name)
        if args.json:
            emit_json(recipe_lib.to_dict(recipe))
        else:
            for section, values in recipe_lib.to_dict(recipe).items():
                if isinstance(values, dict):
                    console.print(f"[bold]\\[{section}][/]")
                    for key, value in values.items():
                        console.print(f"{key} = {json.dumps(value)}", markup=False, highlight=False)
                else:
                    console.print(f"{section} = {json.dumps(values)}", markup=False, highlight=False)
        return 0
    rows = []
    for recipe in recipe_lib.list_recipes():
        rows.append(
            {
                "name": recipe.name,
                "description": recipe.description,
                "model": recipe.model.preset,
                "backend": recipe.model.backend,
                "dataset": recipe.data.dataset,
                "steps": recipe.train.steps,
                "remat": recipe.train.remat,
                "dp": recipe.dp.enabled,
                "freeze": list(recipe.freeze.patterns),
                "init_from": recipe.freeze.init_from,
            }
        )
    if args.json:
        emit_json(rows)
    else:
        print_table(
            "zoo recipes",
            ["name", "model", "dataset", "description"],
            [(r["name"], r["model"], r["dataset"], r["description"]) for r in rows],
        )
    return 0


def run_params(args) -> int:
    from zoo.train import checkpoint
    from zoo.train.loop import build_run

    target = Path(args.target)
    if (target / checkpoint.CHECKPOINT_DIR).exists():
        ckpt = checkpoint.load_checkpoint(target)
        recipe = recipe_lib.with_values(ckpt.recipe, {"freeze.init_from": str(target)})
    else:
        recipe = recipe_lib.load_recipe(args.target)
    if args.freeze:
        recipe = recipe_lib.with_values(recipe, {"freeze.patterns": args.freeze})
    run = build_run(recipe)
    if args.json:
        emit_json(
            {
                "rows": [
                    {"path": p, "shape": s, "count": c, "trainable": run.freeze.is_trainable(p)}
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
    _add_recipe_flags(p)
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/RECIPE-TIMESTAMP)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON (last line)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_train)

    p = sub.add_parser("eval", help="re-evaluate a saved run")
    p.add_argument("checkpoint_dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_eval)

    p = sub.add_parser("sample", help="sample text from a language-model run")
    p.add_argument("checkpoint_dir")
    p.add_argument("--prompt", required=True)
    p.add_argument("--length", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_sample)

    p = sub.add_parser("recipes", help="list recipes, or `zoo recipes show NAME`")
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_recipes)

    p = sub.add_parser("params", help="parameter table of a recipe or run directory")
    p.add_argument("target", metavar="RECIPE|CHECKPOINT_DIR")
    p.add_argument("--freeze", action="append", metavar="PATTERN")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_params)
