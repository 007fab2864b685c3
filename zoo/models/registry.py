"""The model-kind registry: every model family is declared here once, and found here.

A kind is a config class (a frozen dataclass deriving :class:`ModelConfig`) plus its NNX and
Equinox classes and its presets. The config class answers everything the rest of zoo asks of a
model -- task, inputs and labels, how data sizes fit it, the init rule and the logical axes of
each canonical leaf -- so remat, freezing, DP, the inspector, benches and tests ask the config
and never test its type. Each kind lives in its own folder, ``zoo/models/<kind>/``, whose
``config.py`` calls :func:`register` once; ``zoo.models.discover`` imports every such folder,
so this module imports no kind.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import ClassVar

import jax
import jax.numpy as jnp

from zoo.checks import require_choice
from zoo.data.dataset import TaskType, task_type
from zoo.errors import ZooError, choice_error
from zoo.models import extensions

BACKENDS = ("nnx", "eqx")
STACK = "blocks"  # the canonical subtree of scanned blocks (leading layer axis)


@dataclass(frozen=True)
class DataFit:
    """What the data says about the model it needs (built by ``zoo.train.task``).

    ``task`` names the data's task (``zoo.data.dataset.TASKS``), always the model's own; ``row_shape`` is set when a classifier's images are
    fed as rows of features (``data.layout="rows"``).
    """

    task: str
    dataset: str
    num_features: int = 0
    num_classes: int = 0
    vocab_size: int = 0
    seq_len: int | None = None
    row_shape: tuple[int, int] | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Base of every model config. Subclasses are frozen dataclasses registered with
    :func:`register`; they override what differs from these defaults.

    Every kind has a ``num_layers`` field (the scanned stack's depth). Canonical leaves
    (``zoo.models.canonical``) follow one naming rule: dense weights ``w``
    [in, out], biases ``b``, norm gains ``scale``, tables ``w`` [rows, D]; the scanned stack
    is ``blocks`` with a leading layer axis.
    """

    kind: ClassVar[str] = ""
    activation_names: ClassVar[tuple[str, ...]] = ()  # the zoo.names this model tags
    # Low-rank adapters on some dense layers: a spec opaque here (zoo.models.extensions; a
    # zoo.lora.LoraSpec). Keyword-only, after each kind's own fields. Set by `zoo train --lora`,
    # not by model overrides.
    lora: extensions.Spec | None = field(default=None, kw_only=True)

    # --- task and inputs ---------------------------------------------------------------------
    @property
    def task(self) -> str:
        """The name of the model's task (``zoo.data.dataset.TASKS``): ``"classify"`` (labels
        [B]) or ``"lm"`` (labels [B, T], next-token)."""
        return "classify"

    @property
    def task_type(self) -> TaskType:
        """The model's task as a type: what its labels and data are (``zoo.data.dataset``)."""
        return task_type(self.task)

    @property
    def max_len(self) -> int | None:  # pragma: no cover - overridden by sequence models
        """Longest input sequence, or ``None`` for models without a position axis."""
        return None

    def seq_or_default(self, seq: int | None) -> int | None:
        """``seq`` checked against ``max_len`` (default ``max_len``); ``None`` for models
        without a position axis."""
        if self.max_len is None:
            return None
        seq = seq or self.max_len
        if seq > self.max_len:
            raise ZooError(f"seq={seq} is longer than the model's max_len={self.max_len}")
        return seq

    def input_spec(self, batch: int, seq: int | None = None) -> jax.ShapeDtypeStruct:
        """Shape and dtype of a model input of ``batch`` examples (``seq`` positions)."""
        raise NotImplementedError

    def example_input(self, key: jax.Array, batch: int, seq: int | None = None) -> jax.Array:
        """A valid random input; floats uniform in [0, 1)."""
        spec = self.input_spec(batch, seq)
        return jax.random.uniform(key, spec.shape, spec.dtype)

    def labels_spec(self, batch: int, seq: int | None = None) -> jax.ShapeDtypeStruct:
        shape = (batch, self.seq_or_default(seq))[: self.task_type.label_rank]
        return jax.ShapeDtypeStruct(shape, jnp.int32)

    @property
    def num_outputs(self) -> int:
        """Classes of a classifier, vocabulary of a language model."""
        raise NotImplementedError

    def example_labels(self, key: jax.Array, x: jax.Array) -> jax.Array:
        """Random valid labels for input ``x``."""
        shape = tuple(x.shape[: self.task_type.label_rank])
        return jax.random.randint(key, shape, 0, self.num_outputs)

    def block_input_shape(self, batch: int, seq: int | None = None) -> tuple[int, ...]:
        """Shape of the scan carry (``layer_input``) for a batch."""
        raise NotImplementedError

    def check_input(self, x: jax.Array) -> None:
        """Raise ValueError/TypeError when ``x`` is not an input this model reads (shapes at
        trace time, values only when concrete)."""

    def check_input_values(self, x: jax.Array) -> None:
        """``checkify`` checks of input values that must also hold under ``jit``."""

    # --- data ------------------------------------------------------------------------------
    def fit_to_data(self, data: DataFit) -> dict:
        """Field values the data dictates (input width, classes, vocabulary...)."""
        raise NotImplementedError

    # --- parameters --------------------------------------------------------------------------
    def init_leaf(self, path: tuple[str, ...], shape: tuple[int, ...], key: jax.Array) -> jax.Array:
        """Initial value of one canonical leaf: gains 1, biases 0, dense weights LeCun normal,
        tables (``is_table``) GPT-2 style N(0, 0.02)."""
        leaf = path[-1]
        if leaf == "scale":
            return jnp.ones(shape, jnp.float32)
        if leaf == "b":
            return jnp.zeros(shape, jnp.float32)
        std = 0.02 if self.is_table(path) else shape[-2] ** -0.5
        return std * jax.random.normal(key, shape, jnp.float32)

    def is_table(self, path: tuple[str, ...]) -> bool:
        """True for lookup tables (embeddings), whose rows are not a fan-in."""
        return False

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        """Logical axis names of a canonical leaf, for sharding rules: ``layers`` on the
        stack axis, then per-leaf names (``embed``, ``mlp``, ``heads``, ``vocab``...)."""
        raise NotImplementedError

    # --- a fixed input projection (data.dp_pca) -------------------------------------------------
    @property
    def input_projection(self) -> tuple[str, ...] | None:
        """Canonical path of the model's fixed input projection: a leaf fitted before training
        (``zoo.dp.pca_fit``) and never trained; None when it has none."""
        return None

    def with_input_projection(self, width: int) -> ModelConfig:
        """This config reading its input through a fixed ``[d_in, width]`` projection (its
        leaf at :attr:`input_projection`). ValueError for a kind that has none."""
        raise ValueError(f"a {self.kind} model has no fixed input projection (`zoo models` lists the kinds)")

    # --- fine-tuning -------------------------------------------------------------------------
    def frozen_prefix(self) -> tuple[str, ...]:
        """Freeze patterns (``zoo.freeze``) of a frozen prefix, what ``zoo bench finetune``
        freezes by default: the first half of the stack (at least one block). A kind puts its
        input layers (embeddings, input projection) in front."""
        return (f"{STACK}[0:{max(1, self.num_layers // 2)}]",)


def axes_from_table(table: dict[str, tuple[str, ...]], path: tuple[str, ...], ndim: int):
    """Logical axes of a leaf from ``{dotted path without 'blocks.': axes}``; stacked leaves
    (under ``blocks``) get ``layers`` first; an extension's leaves (LoRA's adapters) take
    theirs from the layer they extend."""
    extended = extensions.leaf_axes(path, lambda base: axes_from_table(table, base, ndim))
    if extended is not None:
        return extended
    stacked = path[0] == STACK
    axes = table[".".join(path[1:] if stacked else path)]
    axes = ("layers", *axes) if stacked else axes
    if len(axes) != ndim:
        raise ValueError(f"logical axes {axes} of {'.'.join(path)} do not match its rank {ndim}")
    return axes


@dataclass(frozen=True)
class ModelKind:
    """One registered model family."""

    name: str
    config: type
    nnx: str | type  # the class, or "module:Class" to import on first use
    eqx: str | type
    presets: dict
    descriptions: dict
    small: ModelConfig  # a tiny member of the kind: what the tests generated from the registry use
    order: int = 100  # where listings (`zoo models`, error messages) put the kind; then by name
    hf: str | None = None  # module of its Hugging Face mapping (zoo.models.hf_io), if any
    cache: str | None = None  # "module:NAME" of its decode cache (zoo.models.decode), if any

    def hf_mapping(self):
        """The kind's Hugging Face mapping module, or None."""
        return importlib.import_module(self.hf) if self.hf else None

    def module_class(self, backend: str):
        cls = self.nnx if check_backend(backend) == "nnx" else self.eqx
        if isinstance(cls, str):
            module, name = cls.split(":")
            cls = getattr(importlib.import_module(module), name)
        return cls


_KINDS: dict[str, ModelKind] = {}
_BY_CONFIG: dict[type, ModelKind] = {}
PRESETS: dict[str, ModelConfig] = {}
DESCRIPTIONS: dict[str, str] = {}


def register(
    config: type,
    *,
    nnx: str | type,
    eqx: str | type,
    presets: dict[str, tuple[ModelConfig, str]],
    small: ModelConfig | None = None,
    order: int = 100,
    hf: str | None = None,
    cache: str | None = None,
) -> ModelKind:
    """Register a model kind: its config class, its two backend classes, its presets
    (``name -> (config, one-line description)``), a ``small`` config for tests (default: the
    first preset, or the class defaults), its place in listings (``order``, then name) and the
    module of its Hugging Face checkpoint mapping (``hf``, "zoo.models.<kind>.hf") and its decode
    cache (``cache``, "zoo.models.<kind>.cache:CACHE", a ``zoo.models.decode.DecodeCache``)."""
    name = config.kind
    if not name or name in _KINDS:
        raise ValueError(f"model kind {name!r} is empty or already registered")
    if not (dataclasses.is_dataclass(config) and issubclass(config, ModelConfig)):
        raise TypeError(f"{config.__name__} must be a frozen dataclass deriving ModelConfig")
    for preset, (cfg, _) in presets.items():
        if type(cfg) is not config or preset in PRESETS:
            raise ValueError(f"preset {preset!r} is not a {config.__name__} or is already taken")
    if small is None:
        small = next(iter(presets.values()))[0] if presets else config()
    kind = ModelKind(
        name,
        config,
        nnx,
        eqx,
        {k: c for k, (c, _) in presets.items()},
        {k: d for k, (_, d) in presets.items()},
        small,
        order,
        hf,
        cache,
    )
    _KINDS[name] = kind
    _BY_CONFIG[config] = kind
    _sort()
    return kind


def _sort() -> None:
    """Kinds, presets and descriptions in listing order, whatever order the kinds were imported
    in (in place: other modules hold these dicts)."""
    ordered = sorted(_KINDS.values(), key=lambda k: (k.order, k.name))
    _KINDS.clear()
    _KINDS.update((k.name, k) for k in ordered)
    PRESETS.clear()
    DESCRIPTIONS.clear()
    for k in ordered:
        PRESETS.update(k.presets)
        DESCRIPTIONS.update(k.descriptions)


def unregister(name: str) -> None:
    """Remove a kind and its presets (for tests that register a throwaway kind)."""
    kind = _KINDS.pop(name)
    del _BY_CONFIG[kind.config]
    for preset in kind.presets:
        del PRESETS[preset], DESCRIPTIONS[preset]


def kinds() -> tuple[ModelKind, ...]:
    return tuple(_KINDS.values())


def get_kind(name: str) -> ModelKind:
    if name not in _KINDS:
        raise choice_error("model kind", name, _KINDS)
    return _KINDS[name]


def kind_of(cfg: object) -> ModelKind:
    """The registered kind of a config. Exact type: an unregistered subclass may build a
    different model, so it is not taken for its parent."""
    kind = _BY_CONFIG.get(type(cfg))
    if kind is None:
        raise ZooError(f"not a registered model config: {cfg!r}; registered kinds: {', '.join(_KINDS)}")
    return kind


def is_config(obj: object) -> bool:
    return type(obj) in _BY_CONFIG


def config_from_dict(kind: str, fields: dict) -> ModelConfig:
    """A config of kind ``kind`` from its ``dataclasses.asdict`` form (checkpoint metadata)."""
    fields = dict(fields)
    if isinstance(fields.get("lora"), dict):
        fields["lora"] = extensions.decode("lora", fields["lora"])
    return get_kind(kind).config(**fields)


def get_config(name: str | ModelConfig, **overrides) -> ModelConfig:
    """Preset config by name, with field overrides (``num_layers=8``, ``d_model=256``...)."""
    if is_config(name):
        cfg = name
    elif isinstance(name, str) and name in PRESETS:
        cfg = PRESETS[name]
    else:
        raise choice_error("model preset", name, PRESETS)
    return replace_checked(cfg, **overrides) if overrides else cfg


def replace_checked(cfg, **overrides):
    """`dataclasses.replace` that names an unknown field and lists the valid ones."""
    valid = [f.name for f in dataclasses.fields(cfg)]
    for key in overrides:
        require_choice(f"override for {type(cfg).__name__}", key, valid)
    return dataclasses.replace(cfg, **overrides)


def check_backend(backend: str) -> str:
    return require_choice("backend", backend, BACKENDS)


def module_class(cfg: ModelConfig, backend: str):
    """The NNX or Equinox class implementing ``cfg``."""
    return kind_of(cfg).module_class(backend)
