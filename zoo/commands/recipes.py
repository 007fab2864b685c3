"""``zoo recipes``: list the named recipes, or show one."""

from __future__ import annotations

from zoo import recipes as recipe_lib
from zoo.errors import ZooError
from zoo.ui import emit_json, print_table, write_out


def run_recipes(args) -> int:
    if args.action == "show":
        if not args.name:
            raise ZooError("usage: zoo recipes show NAME")
        if args.json and args.toml:
            raise ZooError("zoo recipes show takes --json or --toml, not both")
        recipe = recipe_lib.load_recipe(args.name)
        if args.json:
            emit_json(recipe_lib.to_dict(recipe))
        else:  # plain TOML, never wrapped: `zoo recipes show NAME > f.toml` is a recipe file
            write_out(recipe_lib.to_toml(recipe))
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
                "init_from": recipe.model.init_from,
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


def add_parser(sub) -> None:
    p = sub.add_parser("recipes", help="list recipes, or `zoo recipes show NAME`")
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true", help="JSON instead of TOML (show) or a table (list)")
    p.add_argument("--toml", action="store_true", help="show: the recipe as TOML (the default)")
    p.set_defaults(func=run_recipes)
