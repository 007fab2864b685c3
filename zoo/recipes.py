"""Recipes: TOML files validated into frozen dataclasses; :func:`override` replaces fields.

A recipe has a name, a description, optionally the ``device_memory`` of the accelerator it is
sized for, and sections ``model``, ``data``, ``optim``, ``train``,
``dp``, ``freeze``, ``lora`` and ``mesh`` (the last two left out of the resolved form while
they are off). Unknown sections or keys, and values of the wrong type, are errors. The
command line's flags and ``--set`` values reach a recipe through :func:`override`, as
``{section: {field: value}}`` (``zoo.commands.settings`` parses them).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from zoo import microbatch
from zoo.checks import is_number, require_choice
from zoo.configs import (
    ByteSize,
    DataConfig,
    DPConfig,
    FreezeConfig,
    LoraConfig,
    MeshConfig,
    ModelSection,
    OptimConfig,
    TrainConfig,
)
from zoo.dp import check_choices, check_pca
from zoo.dp.validate import check_unit
from zoo.errors import ZooError, choice_error
from zoo.models.registry import check_backend, get_config
from zoo.parallel.placement import from_old_spelling, placement_named
from zoo.remat import parse_bytes


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
    # The memory of the one accelerator the recipe is sized for, in bytes (``device_memory =
    # "15.75GiB"``: a TPU v5e chip's): its shipped shapes must fit it
    # (tests/e2e/test_accelerator_recipes.py, benchmarks/device/recipe_fits.py). None: any device.
    device_memory: int | None = None

    def __post_init__(self) -> None:
        check_choices(self.dp)  # clipping and sampler name rows of zoo.dp's tables
        check_pca(self.dp, self.data.dp_pca)  # dp.pca_epsilon exactly with data.dp_pca
        check_unit(self.dp, self.data)  # dp.unit = "user" only where the settings give users
        try:  # the placement's own checks (zoo.parallel.placement), from the settings
            placement_named(self.train.placement).check(mesh=self.mesh, remat=self.train.remat)
        except ValueError as error:
            raise ZooError(f"train.{error}") from None
        # The one knob: a non-private step's batch must split into it; a DP step's padded
        # Poisson batch is padded to a multiple of it (zoo.dp.plan), so only the size is checked.
        rows = None if self.dp.enabled else self.train.batch_size
        try:
            microbatch.count(rows, self.train.microbatch_size)
        except ValueError as error:
            raise ZooError(str(error)) from None

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


NONE = "none"
DEVICE_MEMORY = "device_memory"  # a top-level key, beside name and description


def _coerce(value, hint, where: str):
    """Check ``value`` against a dataclass field's type hint; ints are accepted as floats."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if (value is None or value == NONE) and type(None) in options:
            return None  # TOML has no null: `--set dp.epsilon=none` unsets an optional field
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
    if hint is float and is_number(value):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    if hint is object:
        return value
    if hint is ByteSize:  # "256MiB", "1.5GiB", "300MB" or a count: parsed here, once
        return ByteSize(parse_bytes(value))
    name = getattr(hint, "__name__", str(hint))
    raise ZooError(f"{where} must be {name}, got {value!r} ({type(value).__name__})")


def _section(base, values: Mapping[str, object], where: str):
    """``base`` (a section) with ``values`` replaced, each checked against its field's type
    (a key that moved is refused, or read in its new spelling: :func:`_moved`)."""
    values = _moved(base, values, where)
    cls = type(base)
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        require_choice(f"key in [{where}]", key, fields)
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    return dataclasses.replace(base, **kwargs)


def _moved(base, values: Mapping[str, object], where: str) -> Mapping[str, object]:
    """``values`` with the keys that moved dealt with: ``dp.microbatch_size`` is
    ``train.microbatch_size`` (one knob for every step), refused in one line naming it;
    ``train.offload`` and ``train.update_on`` are read, one release more, as the
    ``train.placement`` they spell (:func:`_old_placement`)."""
    if where == "train" and ("offload" in values or "update_on" in values):
        return _old_placement(base, values)
    if where == "dp" and "microbatch_size" in values:
        raise ZooError(
            f"dp.microbatch_size = {values['microbatch_size']!r} is now train.microbatch_size, the one "
            "microbatch setting of every step (under DP the clipped sums accumulate over it, the noise "
            "is drawn once): set train.microbatch_size (--set train.microbatch_size=K, or --microbatch-size K)"
        )
    return values


def _old_placement(base, values: Mapping[str, object]) -> dict[str, object]:
    """``values`` with ``offload``/``update_on`` replaced by the ``placement`` they ask for, over
    the section's (or ``values``') placement. One printed line names the new spelling, unless
    the old keys ask for the default (every run saved before ``placement`` wrote both)."""
    values = dict(values)
    offload, update_on = values.pop("offload", None), values.pop("update_on", None)
    current = values.get("placement", base.placement)
    try:
        placement = from_old_spelling(current, offload, update_on)
    except ValueError as error:
        raise ZooError(str(error)) from None
    if offload not in (None, "none") or update_on not in (None, "device"):
        given = [f"train.{k} = {v!r}" for k, v in (("offload", offload), ("update_on", update_on)) if v]
        warnings.warn(
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} spelled train.placement = "
            f"{placement!r} now (--placement {placement}); the old keys (--offload, --update-on) go "
            "in the next release",
            FutureWarning,
            stacklevel=2,
        )
    values["placement"] = placement
    return values


def model_section(values: Mapping[str, object], base: ModelSection | None = None) -> ModelSection:
    """``base`` (default: the default section) with ``values`` replaced: ``preset``,
    ``backend``, ``init_from``, and any other key a model config field override (added to
    ``base``'s)."""
    base = base or ModelSection()
    values = dict(values)
    preset = _coerce(values.pop("preset", base.preset), str, "model.preset")
    backend = check_backend(values.pop("backend", base.backend))
    init_from = _coerce(values.pop("init_from", base.init_from), str | None, "model.init_from")
    if "lora" in values:
        raise ZooError("model.lora is set by the [lora] section (or --lora), not as a model override")
    overrides = {**dict(base.overrides), **values}
    get_config(preset, **overrides)  # validates preset and override names
    return ModelSection(preset, backend, tuple(sorted(overrides.items())), init_from)


def parse_recipe(doc: Mapping[str, object], default_name: str = "recipe") -> Recipe:
    """A recipe document (a TOML file's, or a run's ``recipe.json``) as a :class:`Recipe`."""
    doc = dict(doc)
    name = doc.pop("name", default_name)
    description = doc.pop("description", "")
    memory = _coerce(doc.pop(DEVICE_MEMORY, None), ByteSize | None, DEVICE_MEMORY)
    for key in doc:
        require_choice("recipe section", key, [*SECTIONS, "name", "description", DEVICE_MEMORY])
    sections = {"model": model_section(doc.get("model", {}))}
    for key, cls in SECTIONS.items():
        if key != "model":
            sections[key] = _section(cls(), doc.get(key, {}), key)
    return Recipe(name=name, description=description, device_memory=memory, **sections)


def override(recipe: Recipe, changes: Mapping[str, Mapping[str, object]]) -> Recipe:
    """``recipe`` with the fields in ``changes`` (``{"train": {"steps": 2}}``) replaced.

    Values are checked as a recipe file's are (TOML types; ``"none"`` unsets an optional
    field; a byte size may be written ``"256MiB"``), and each changed section is made with
    :func:`dataclasses.replace`, so that its own checks see all of its new fields at once."""
    sections = {}
    for key, values in changes.items():
        require_choice("recipe section", key, SECTIONS)
        if key == "model":
            sections[key] = model_section(values, recipe.model)
        else:
            sections[key] = _section(getattr(recipe, key), values, key)
    return dataclasses.replace(recipe, **sections)


def _builtin_dir():
    return resources.files("zoo") / "recipes"


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A built-in recipe by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        text, default = _read_recipe_file(path), path.stem
    elif name_or_path in builtin_names():
        text, default = (_builtin_dir() / f"{name_or_path}.toml").read_text(), name_or_path
    else:
        raise choice_error("recipe (name or path to a .toml file)", name_or_path, builtin_names())
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ZooError(f"recipe {name_or_path!r} is not valid TOML: {error}") from None
    recipe = parse_recipe(doc, default)  # unknown keys and bad values first
    if "model" not in doc:  # every field has a default: an empty file would train mlp-s on digits
        what = "is empty" if not doc else "has no [model] section"
        raise ZooError(
            f"recipe {name_or_path!r} {what}: name the model to train, e.g. [model] preset = "
            f'"mlp-s" (presets: `zoo models`; whole recipes to start from: `zoo recipes`)'
        )
    return recipe


def _read_recipe_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ZooError(f"recipe {str(path)!r} is a directory, not a .toml file") from None
    except UnicodeDecodeError as error:
        raise ZooError(
            f"recipe {str(path)!r} is not text (not UTF-8 at byte {error.start}): a recipe is a TOML file"
        ) from None
    except OSError as error:
        raise ZooError(f"recipe {str(path)!r} cannot be read: {error.strerror or error}") from None


def to_dict(recipe: Recipe) -> dict:
    """The resolved recipe as plain data (TOML/JSON-ready); model overrides are inlined."""
    out = {"name": recipe.name, "description": recipe.description}
    if recipe.device_memory is not None:
        out[DEVICE_MEMORY] = recipe.device_memory
    for key in SECTIONS:
        section = getattr(recipe, key)
        if (key == "lora" and not section.enabled) or (key == "mesh" and section.is_default):
            continue  # off: the resolved form shows only the sections a run uses
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


def list_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in builtin_names()]
