"""``--set section.field=value``: the only place where settings are dotted strings.

The command line (and scripts that take ``--set``) parse them here, once, into
``{section: {field: value}}``, which :func:`zoo.recipes.override` checks and applies to the
typed recipe sections. Nothing below the command line reads a dotted key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping

from zoo.checks import require_choice
from zoo.errors import ZooError
from zoo.recipes import SECTIONS, Recipe, override


def parse_value(text: str):
    """A ``--set`` value: parsed as TOML (``3``, ``1e-3``, ``true``, ``[1, 2]``), else the bare
    string (``--set data.dataset=digits``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # bare strings: --set data.dataset=digits


def split_key(key: str) -> tuple[str, str]:
    """``"train.steps"`` -> ``("train", "steps")``; the section must be a recipe section."""
    section, dot, field = key.strip().partition(".")
    if not dot or not field:
        raise ZooError(f"expected section.field, got {key!r}")
    require_choice("recipe section", section, SECTIONS)
    return section, field


def nest(values: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """``{"train.steps": 10}`` -> ``{"train": {"steps": 10}}``."""
    nested: dict[str, dict[str, object]] = {}
    for key, value in values.items():
        section, field = split_key(key)
        nested.setdefault(section, {})[field] = value
    return nested


def parse_sets(assignments: Iterable[str]) -> dict[str, dict[str, object]]:
    """``section.field=value`` overrides as ``{section: {field: value}}`` (values parsed as
    TOML, else as strings; ``none`` unsets an optional field). A later one wins."""
    values = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ZooError(f"--set expects section.field=value, got {assignment!r}")
        values[key.strip()] = parse_value(text.strip())
    return nest(values)


def with_values(recipe: Recipe, values: Mapping[str, object]) -> Recipe:
    """``recipe`` with fields overridden by dotted key (``{"train.steps": 10}``), as ``--set``."""
    return override(recipe, nest(values))


def with_sets(recipe: Recipe, assignments: Iterable[str]) -> Recipe:
    """``recipe`` with ``--set`` assignments (``["train.steps=10"]``) applied."""
    return override(recipe, parse_sets(assignments))
