"""Recipes: TOML files validated into frozen dataclasses. Flags override fields.

A recipe has a name, a description and sections ``model``, ``data``, ``optim``, ``train``,
``dp``, ``freeze``, ``lora`` and ``mesh`` (the last two left out of the resolved form while
they are off). Unknown sections or keys, and values of the wrong type, are errors.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from zoo.configs import (
    DataConfig,
    DPConfig,
    FreezeConfig,
    LoraConfig,
    MeshConfig,
    ModelSection,
    OptimConfig,
    TrainConfig,
)
from zoo.dp import check_choices
from zoo.errors import ZooError, choice_error
from zoo.models.registry import check_backend, get_config


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    model: ModelSection
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    dp: DPConfig
    freeze: FreezeConfig
    lora: LoraConfig
    mesh: MeshConfig = MeshConfig()

    @property
    def model_config(self):
        return get_config(self.model.preset, **dict(self.model.overrides))


SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "dp": DPConfig,
    "freeze": FreezeConfig,
    "lora": LoraConfig,
    "mesh": MeshConfig,
}


def _coerce(value, hint, where: str):
    """Check ``value`` against a dataclass field's type hint; ints are accepted as floats."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ZooError as error:
                errors.append(str(error))
        raise ZooError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        item_type = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            raise ZooError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    if hint is object:
        return value
    name = getattr(hint, "__name__", str(hint))
    raise ZooError(f"{where} must be {name}, got {value!r} ({type(value).__name__})")


def _section(cls: type, values: dict, where: str):
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise choice_error(f"key in [{where}]", key, fields)
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def _model_section(values: dict) -> ModelSection:
    values = dict(values)
    preset = values.pop("preset", ModelSection.preset)
    backend = check_backend(values.pop("backend", ModelSection.backend))
    init_from = _coerce(values.pop("init_from", None), str | None, "model.init_from")
    if "lora" in values:
        raise ZooError("model.lora is set by the [lora] section (or --lora), not as a model override")
    get_config(preset, **values)  # validates preset and override names
    return ModelSection(preset, backend, tuple(sorted(values.items())), init_from)


# Keys that moved to another section: (old section, key) -> new section. Old recipe files and
# the recipe.json of old run directories read the same; a value under the old key wins, as
# ``with_values`` sets it there.
_MOVED_KEYS = {("freeze", "init_from"): "model"}


def _move_old_keys(doc: dict) -> dict:
    doc = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    for (old, key), new in _MOVED_KEYS.items():
        if isinstance(doc.get(old), dict) and key in doc[old]:
            doc.setdefault(new, {})[key] = doc[old].pop(key)
    return doc


def parse_recipe(doc: dict, default_name: str = "recipe") -> Recipe:
    doc = _move_old_keys(doc)
    name = doc.pop("name", default_name)
    description = doc.pop("description", "")
    for key in doc:
        if key not in SECTIONS:
            raise choice_error("recipe section", key, [*SECTIONS, "name", "description"])
    sections = {"model": _model_section(doc.get("model", {}))}
    for key, cls in SECTIONS.items():
        if key != "model":
            sections[key] = _section(cls, doc.get(key, {}), key)
    check_choices(sections["dp"])  # clipping and sampler name rows of zoo.dp's tables
    return Recipe(name=name, description=description, **sections)


def _builtin_dir():
    return resources.files("zoo") / "recipes"


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A built-in recipe by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        text, default = path.read_text(), path.stem
    elif name_or_path in builtin_names():
        text, default = (_builtin_dir() / f"{name_or_path}.toml").read_text(), name_or_path
    else:
        raise choice_error("recipe (name or path to a .toml file)", name_or_path, builtin_names())
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ZooError(f"recipe {name_or_path!r} is not valid TOML: {error}") from None
    return parse_recipe(doc, default)


def to_dict(recipe: Recipe) -> dict:
    """The resolved recipe as plain data (TOML/JSON-ready); model overrides are inlined."""
    out = {"name": recipe.name, "description": recipe.description}
    for key in SECTIONS:
        section = getattr(recipe, key)
        if (key == "lora" and not section.enabled) or (key == "mesh" and section.is_default):
            continue  # off: recipes (and the fingerprints of runs) from before LoRA read the same
        if key == "model":
            out[key] = {"preset": section.preset, "backend": section.backend, **dict(section.overrides)}
            if section.init_from is not None:
                out[key]["init_from"] = section.init_from
        else:
            out[key] = {
                f.name: getattr(section, f.name)
                for f in dataclasses.fields(section)
                # None is "unset" where it is the default; elsewhere (grad_clip_norm = None: no
                # clipping) it is a value, and dropping it would read back as the default.
                if getattr(section, f.name) is not None or f.default is not None
            }
    return out


def to_toml(recipe: Recipe) -> str:
    """The resolved recipe as a TOML document that ``load_recipe`` reads back to an equal recipe."""
    lines, sections = [], []
    for key, value in to_dict(recipe).items():
        if isinstance(value, dict):
            unset = [k for k, v in value.items() if v is None]
            if unset:  # TOML has no null; a TOML recipe never holds one
                raise ZooError(f"[{key}] {', '.join(unset)} = None has no TOML form; use --json")
            sections.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, values in sections:
        lines += ["", f"[{key}]", *(f"{k} = {_toml_value(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, str):
        # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r} ({type(value).__name__})")


def parse_value(text: str):
    """A ``--set`` value: parsed as TOML (``3``, ``1e-3``, ``true``, ``[1, 2]``), else the bare
    string (``--set data.dataset=digits``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # bare strings: --set data.dataset=digits


def with_values(recipe: Recipe, values: dict[str, object]) -> Recipe:
    """Override fields by dotted key (``{"train.steps": 10}``); the result is re-validated."""
    doc = to_dict(recipe)
    for key, value in values.items():
        section, dot, field = key.partition(".")
        if not dot or not field:
            raise ZooError(f"expected section.field, got {key!r}")
        if section not in SECTIONS:
            raise choice_error("recipe section", section, SECTIONS)
        doc.setdefault(section, {})[field] = value
    return parse_recipe(doc, recipe.name)


def with_sets(recipe: Recipe, assignments: list[str]) -> Recipe:
    """Apply ``section.field=value`` overrides (values parsed as TOML, else as strings)."""
    values = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ZooError(f"--set expects section.field=value, got {assignment!r}")
        values[key.strip()] = parse_value(text.strip())
    return with_values(recipe, values)


def list_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in builtin_names()]
