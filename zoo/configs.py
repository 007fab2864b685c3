"""Frozen dataclass configs. Recipes (TOML) validate into these; flags override fields."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoo.checks import require_choice, require_int, require_number, require_positive_int
from zoo.errors import ZooError
from zoo.precision import PRECISIONS

# a model's attention (zoo.models.attention.attention)
ATTENTIONS = ("auto", "dense", "chunked", "splash", "cudnn")
# Where [train] placement keeps the training state and runs its update (zoo.parallel.placement):
# on the device; the optimizer state (and the float32 params) in host memory between steps; or
# the whole state on the host's CPU device with the update run there.
STATE_PLACEMENTS = ("device", "offload-optimizer", "offload-optimizer+params", "update-on-host")
# The old spelling of the same, one release more (zoo.parallel.placement.from_old_spelling):
# [train] offload and update_on, whose 3 x 2 pairs held only the four placements above.
OFFLOADS = ("none", "optimizer", "optimizer+params")
UPDATES_ON = ("device", "host")


def add_model_flags(parser) -> None:
    """``--attention`` and ``--mlp-chunk``: the model config fields that the inspection and
    bench commands (``zoo residuals``, ``zoo bench remat``) override by flag."""
    parser.add_argument("--attention", choices=ATTENTIONS, help="override the model's attention")
    parser.add_argument(
        "--mlp-chunk",
        type=int,
        default=None,
        metavar="TOKENS",
        help="override the model's mlp_chunk: its MLP over chunks of this many tokens (0: whole)",
    )


def add_precision_flag(parser, what: str) -> None:
    """``--precision float32|bfloat16`` (:mod:`zoo.precision`); unset: the recipe's, or float32."""
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help=what)


def model_flag_overrides(args) -> dict:
    """The config overrides that :func:`add_model_flags`'s flags ask for."""
    overrides = {"attention": args.attention, "mlp_chunk": args.mlp_chunk}
    return {k: v for k, v in overrides.items() if v is not None}


def require_positive(cfg: object, *fields: str, section: str) -> None:
    """Config validation: each field is a positive int (one ZooError line naming it by the
    recipe's key, ``section.field``, as ``--set`` and the recipe's TOML write it)."""
    for field in fields:
        require_positive_int(f"{section}.{field}", getattr(cfg, field), error=ZooError)


class ByteSize(int):
    """A size in bytes (> 0). Recipes and flags write it ``"256MiB"``, ``"1.5GiB"``, ``"300MB"``
    or as a count; the recipe edge (:mod:`zoo.recipes`) parses it, once, into this int."""


# --- Recipe sections ------------------------------------------------------------------------

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "constant")
LAYOUTS = ("flat", "rows")
UNITS = ("record", "user")  # what a DP run protects (dp.unit; docs/dp.md "What is guaranteed")
DEFAULT_NOISE_PRNG = "auto"  # the fastest DP noise sampler measured on the platform (zoo.dp.noise.FASTEST)


@dataclass(frozen=True)
class ModelSection:
    """Which preset, which backend, config field overrides (e.g. ``num_layers``), and where
    the weights start: ``init_from``, a zoo run directory (fresh weights when unset). A
    fine-tune, a LoRA run (its base), ``zoo eval`` and ``zoo export`` all start from it."""

    preset: str = "mlp-s"
    backend: str = "nnx"
    overrides: tuple[tuple[str, object], ...] = ()
    init_from: str | None = None


@dataclass(frozen=True)
class DataConfig:
    """``dataset`` is a spec understood by :func:`zoo.data.load_dataset`.

    ``layout="rows"`` feeds a classifier's 8x8 (or HxW) image to a transformer as H row
    tokens of W features. ``classes`` keeps and remaps a subset of labels (5..9 -> 0..4).
    ``seq_len`` is the LM context (default: the model's ``max_len``). ``vocabulary = "bytes"``
    is a fixed byte-level vocabulary (unset: every character of the text, refused under DP).
    ``image_max`` is the value images are divided by (unset: the format's own range).
    ``dp_pca = K`` projects a classifier's features onto K principal directions fitted before
    training (``zoo.dp.pca_fit``: with DP, from part of the budget, ``dp.pca_epsilon``).
    """

    dataset: str = "digits"
    layout: str = "flat"
    classes: tuple[int | str, ...] | None = None  # label ids, or the names of string labels
    eval_fraction: float = 0.2
    seq_len: int | None = None
    text_column: str = "text"
    label_column: str = "label"
    vocabulary: str | None = None
    image_max: float | None = None
    dp_pca: int | None = None
    # The column naming each record's user (dp.unit = "user"): read as text, never a feature.
    user_column: str | None = None

    def __post_init__(self) -> None:
        require_choice("data.layout", self.layout, LAYOUTS)
        if self.user_column is not None and not (isinstance(self.user_column, str) and self.user_column):
            raise ZooError(f"data.user_column must be a column name; got {self.user_column!r}")
        if self.image_max is not None:
            require_number("data.image_max", self.image_max, positive=True, finite=True, error=ZooError)
        if self.dp_pca is not None:
            require_positive_int("data.dp_pca", self.dp_pca, error=ZooError)
        if self.vocabulary is not None and not self.vocabulary.startswith(("hf:", "char:", "ids:")):
            # hf:SRC a tokenizer.json, char:FILE its characters, ids:N ids with no text (zoo.data.vocabulary)
            require_choice("data.vocabulary", self.vocabulary, ("bytes", "hf:SRC", "char:FILE", "ids:N"))
        below_one = math.nextafter(1.0, 0.0)
        require_number(
            "data.eval_fraction",
            self.eval_fraction,
            positive=True,
            hi=below_one,
            what="in (0, 1)",
            error=ZooError,
        )
        if self.seq_len is not None:
            require_positive_int("data.seq_len", self.seq_len, error=ZooError)


@dataclass(frozen=True)
class OptimConfig:
    """optax optimizer: adamw or sgd with momentum, warmup + cosine decay, global-norm clip."""

    name: str = "adamw"
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup_steps: int = 0
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    grad_clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        require_choice("optim.name", self.name, OPTIMIZERS)
        require_choice("optim.schedule", self.schedule, SCHEDULES)
        require_number(
            "optim.lr", self.lr, positive=True, finite=True, what="a finite number > 0", error=ZooError
        )
        require_int("optim.warmup_steps", self.warmup_steps, lo=0, what=">= 0", error=ZooError)
        # By meaning: a negative end ratio drives the rate negative (the loss climbs), a
        # momentum of 1 or more never forgets a gradient, a negative decay grows the weights.
        require_number(
            "optim.end_lr_ratio",
            self.end_lr_ratio,
            lo=0.0,
            hi=1.0,
            what="in [0, 1] (the final rate as a fraction of optim.lr)",
            error=ZooError,
        )
        below_one = math.nextafter(1.0, 0.0)
        require_number(
            "optim.momentum", self.momentum, lo=0.0, hi=below_one, what="in [0, 1)", error=ZooError
        )
        require_number("optim.weight_decay", self.weight_decay, lo=0.0, what=">= 0", error=ZooError)
        if self.grad_clip_norm is not None:
            require_number(
                "optim.grad_clip_norm",
                self.grad_clip_norm,
                positive=True,
                what="> 0 or unset",
                error=ZooError,
            )


MAX_STEPS = 2**31 - 1  # the step counter of the training state is an int32
MAX_SEED = 2**32 - 1  # the largest seed the train/eval split (numpy's legacy seeding) takes


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 64
    eval_every: int = 200
    eval_batches: int = 50
    log_every: int = 10
    checkpoint_every: int = 200
    seed: int = 0
    remat: str = "none"  # a policy name, or "auto" with memory_budget
    memory_budget: ByteSize | None = None  # what --remat auto must fit, in bytes (None: the device's)
    precision: str = "float32"  # compute dtype over float32 params (zoo.precision.PRECISIONS)
    placement: str = "device"  # where the state lives and the update runs (STATE_PLACEMENTS)
    # A step takes its batch this many rows at a time (zoo.microbatch): a non-private step adds
    # up the gradients, a DP step its clipped sums (the noise is drawn once); None: the whole
    # batch at once. The one knob: checked against the batch by the recipe (zoo.recipes).
    microbatch_size: int | None = None
    tensorboard: bool = True  # write RUN/tb/ event files beside metrics.jsonl (zoo.train.tracking)

    def __post_init__(self) -> None:
        require_choice("train.precision", self.precision, PRECISIONS)
        require_choice("train.placement", self.placement, STATE_PLACEMENTS)
        if not isinstance(self.tensorboard, bool):
            raise ZooError(f"train.tensorboard must be true or false, got {self.tensorboard!r}")
        require_positive(
            self,
            "steps",
            "batch_size",
            "eval_every",
            "eval_batches",
            "log_every",
            "checkpoint_every",
            section="train",
        )
        if self.steps > MAX_STEPS:
            raise ZooError(
                f"train.steps must be at most {MAX_STEPS:,} (an int32 step counter), got {self.steps}"
            )
        require_int("train.seed", self.seed, lo=0, hi=MAX_SEED, error=ZooError)
        if self.memory_budget is not None:
            require_positive_int("train.memory_budget (bytes)", self.memory_budget, error=ZooError)
        from zoo.remat import AUTO, CUSTOM_PREFIX, get_policy

        if self.remat == AUTO:  # without a budget, the device's memory (zoo.train.auto_remat)
            return
        if self.memory_budget is not None:
            raise ZooError(
                f"--memory-budget {self.memory_budget:,} bytes only applies with --remat auto (the budget its "
                f"choice must fit); train.remat is {self.remat!r}. Add --remat auto, or drop the budget "
                "(--set train.memory_budget=none)"
            )
        try:
            get_policy(self.remat)  # unknown names fail here, with the valid list
        except ZooError as error:
            if self.remat.startswith(CUSTOM_PREFIX):  # a custom spec's error is about its items
                raise
            raise ZooError(f"{str(error).rstrip('.')}; or {AUTO} (with --memory-budget)") from None


@dataclass(frozen=True)
class FreezeConfig:
    """Freeze the canonical paths matching ``patterns`` (of the weights ``model.init_from``
    starts from, or of fresh ones)."""

    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on a frozen base (``zoo.lora``); ``rank = 0`` means none.

    ``targets`` are patterns over canonical dense paths, as in ``freeze.patterns``: ``attn.q``
    (inside the stack), ``blocks[2:4].mlp.*``, ``head``. The base comes from ``model.init_from``.
    """

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require_int("lora.rank", self.rank, lo=0, what="an int >= 0 (0: no adapters)", error=ZooError)
        require_number("lora.alpha", self.alpha, positive=True, what="> 0", error=ZooError)
        if self.rank and not self.targets:
            raise ZooError("lora.targets is empty: name the dense layers to adapt, e.g. attn.q|attn.v")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class DPConfig:
    """DP-SGD settings (``[dp]``; checked by :func:`zoo.dp.validate`).  Set exactly one of
    ``epsilon`` and ``noise_multiplier``.

    ``epsilon`` is a target budget from which the noise multiplier is
    calibrated; with ``noise_multiplier`` given directly, epsilon is reported.
    ``expected_batch_size / num_examples`` is the Poisson sampling rate q.
    """

    enabled: bool = False
    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    clip_norm: float = 1.0
    expected_batch_size: int = 256
    accountant: str = "pld"
    clipping: str = "ghost"  # a row of zoo.dp.clipping.CLIPPING; "vmap" is the general path
    sampler: str = "poisson"  # a row of zoo.dp.sampling.SAMPLERS
    noise_prng: str = DEFAULT_NOISE_PRNG  # JAX PRNG implementation that draws the noise
    # None: the noise keys come from 64 bits of OS entropy, kept only in the checkpoint's
    # state. An int makes the run repeatable, and the noise only as secret as that int.
    noise_seed: int | None = None
    pca_epsilon: float | None = None  # with data.dp_pca: what the projection alone spends, at delta
    # The privacy unit: a record, or a user (all the records of one data.user_column value).
    # Under "user", a user gives at most records_per_user records; expected_batch_size counts
    # users (ULS, sampler "poisson": zoo.dp.users) or records (ELS, sampler "els": zoo.dp.els_sampler).
    unit: str = "record"
    records_per_user: int = 4
    # Which parameters share one clip factor (zoo.dp.groups; docs/dp-mechanisms.md "Clipping
    # styles"): "all-layer" (flat), "layer-wise" (each op of each layer), "block-wise" (the
    # named groups of clip_groups, "name = pattern|pattern", relative thresholds
    # clip_group_weights). clip_norm stays the sensitivity: the thresholds are its shares.
    clipping_style: str = "all-layer"
    clip_groups: tuple[str, ...] = ()
    clip_group_weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        require_choice("dp.unit", self.unit, UNITS)
        require_positive_int("dp.records_per_user", self.records_per_user, error=ZooError)


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh (``zoo.parallel``): ``data`` (or ``"auto"``: every device left over),
    ``fsdp`` and ``tensor`` sizes, multiplying to the device count. The default is one device."""

    data: int | str = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        if self.data != "auto":
            require_int("mesh.data", self.data, lo=1, what="a positive int or 'auto'", error=ZooError)
        require_positive(self, "fsdp", "tensor", section="mesh")

    @property
    def is_default(self) -> bool:
        return self == MeshConfig()
