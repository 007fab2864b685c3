"""``zoo models``: the presets with kind, sizes and parameter count."""

from __future__ import annotations

import dataclasses
import math

from zoo.models import canonical
from zoo.models.registry import DESCRIPTIONS, PRESETS
from zoo.ui import emit_json, print_table


def preset_rows() -> list[dict]:
    rows = []
    for name, cfg in PRESETS.items():
        shapes = canonical.canonical_shapes(cfg)
        params = sum(math.prod(s) for s in shapes.values())
        rows.append(
            {
                "name": name,
                "kind": cfg.kind,
                "task": cfg.task,
                "params": params,
                "description": DESCRIPTIONS[name],
                **dataclasses.asdict(cfg),
            }
        )
    return rows


def run(args) -> int:
    rows = preset_rows()
    if args.json:
        emit_json(rows)
        return 0
    print_table(
        "zoo model presets",
        ["name", "kind", "layers", "params", "description"],
        [(r["name"], r["kind"], r["num_layers"], f"{r['params']:,}", r["description"]) for r in rows],
    )
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list model presets")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)
