"""Checks of the ``[dp]`` section (:class:`zoo.configs.DPConfig`): its named choices, its numbers
against the number of records, and the DP-PCA budget against the ``[data]`` section. Each
failure is one :class:`zoo.errors.ZooError` line naming the value."""

from __future__ import annotations

import math

from zoo.checks import is_int, is_number
from zoo.configs import DataConfig, DPConfig
from zoo.dp.clipping import CLIPPING, clipping_method
from zoo.dp.groups import ClipStyle
from zoo.dp.noise import NOISE_PRNG_CHOICES
from zoo.dp.sampling import SAMPLERS
from zoo.errors import ZooError, choice_error

__all__ = ["ACCOUNTANTS", "check_choices", "check_pca", "check_unit", "check_units", "validate"]

ACCOUNTANTS = ("pld", "rdp")


def check_choices(cfg: DPConfig) -> None:
    """The named choices of an enabled config: sampler and clipping (rows of their tables,
    :data:`zoo.dp.sampling.SAMPLERS`, :data:`zoo.dp.clipping.CLIPPING`), accountant and noise
    PRNG. Recipes are checked with it when they are read."""
    if not cfg.enabled:
        return
    if cfg.sampler not in SAMPLERS:
        raise ZooError(
            f"DP-SGD requires a sampler the accountant models ({', '.join(SAMPLERS)}: "
            f"Poisson subsampling); got sampler={cfg.sampler!r}."
        )
    if cfg.accountant not in ACCOUNTANTS:
        raise choice_error("accountant", cfg.accountant, ACCOUNTANTS)
    _check_sampler_row(cfg, SAMPLERS[cfg.sampler])
    clipping_method(cfg.clipping)
    ClipStyle.of(cfg)  # the clipping style and its groups' spelling (zoo.dp.groups)
    if cfg.noise_prng not in NOISE_PRNG_CHOICES:
        raise choice_error("noise_prng", cfg.noise_prng, NOISE_PRNG_CHOICES)


def _check_sampler_row(cfg: DPConfig, kind) -> None:
    """The sampler row against the privacy unit and the accountant (settings only)."""
    if cfg.unit not in kind.privacy_units:
        able = ", ".join(name for name, row in SAMPLERS.items() if cfg.unit in row.privacy_units)
        raise ZooError(
            f"dp.sampler = {cfg.sampler!r} draws the units {', '.join(kind.privacy_units)}, not "
            f"dp.unit = {cfg.unit!r}; the samplers of {cfg.unit}s: {able}"
        )
    if kind.accountants is not None and cfg.accountant not in kind.accountants:
        raise ZooError(
            f"dp.accountant = {cfg.accountant!r} cannot account dp.sampler = {cfg.sampler!r}; "
            f"its accountants: {', '.join(kind.accountants)}"
        )


def check_units(num_examples: int) -> None:
    """The one refusal of a DP run with no privacy unit (no record kept, or no user), at either
    unit and before anything is drawn: ``N`` is public, and the line names only it."""
    if not is_int(num_examples) or num_examples < 1:
        raise ZooError(f"DP needs a positive number of training examples; got num_examples={num_examples!r}.")


def validate(cfg: DPConfig, num_examples: int, records_per_unit: int = 1) -> None:
    """Raise :class:`zoo.errors.ZooError` (a ``ValueError``) saying what is wrong, for
    ``num_examples`` units of ``records_per_unit`` records each drawn on its own (ELS's users:
    ``q = E / (num_examples * records_per_unit)``).

    A disabled config (``enabled=False``) is not checked: its DP fields are unused.
    """
    if not cfg.enabled:
        return
    check_units(num_examples)
    n = int(num_examples)
    check_choices(cfg)
    if cfg.noise_seed is not None and not (is_int(cfg.noise_seed) and 0 <= cfg.noise_seed < 2**32):
        raise ZooError(
            f"noise_seed must be an int in [0, 2**32) (JAX keys hold 32 bits of a seed), or unset "
            f"for 64 secret bits from the OS; got noise_seed={cfg.noise_seed!r}."
        )
    if (cfg.epsilon is None) == (cfg.noise_multiplier is None):
        raise ZooError(
            "set exactly one of epsilon (target budget; the noise multiplier is "
            "calibrated) and noise_multiplier (epsilon is then reported); got "
            f"epsilon={cfg.epsilon!r}, noise_multiplier={cfg.noise_multiplier!r}"
            " (--set dp.epsilon=none unsets a recipe's epsilon)."
        )
    if cfg.epsilon is not None and not (
        is_number(cfg.epsilon) and cfg.epsilon > 0 and math.isfinite(cfg.epsilon)
    ):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={cfg.epsilon!r}.")
    if cfg.noise_multiplier is not None and not (
        is_number(cfg.noise_multiplier) and cfg.noise_multiplier > 0 and math.isfinite(cfg.noise_multiplier)
    ):
        raise ZooError(
            f"noise_multiplier must be a finite number > 0 (0 gives no privacy); "
            f"got noise_multiplier={cfg.noise_multiplier!r}."
        )
    if not (is_number(cfg.delta) and cfg.delta > 0):
        raise ZooError(f"delta must be > 0; got delta={cfg.delta!r}.")
    if cfg.delta >= 1.0 / n:
        raise ZooError(
            f"delta={cfg.delta!r} must be < 1/num_examples = 1/{n} = {1.0 / n:.3g}; "
            "a larger delta allows releasing whole examples."
        )
    if not (is_number(cfg.clip_norm) and cfg.clip_norm > 0 and math.isfinite(cfg.clip_norm)):
        raise ZooError(f"clip_norm must be a finite number > 0; got clip_norm={cfg.clip_norm!r}.")
    if not (is_number(cfg.expected_batch_size) and cfg.expected_batch_size > 0):
        raise ZooError(
            f"expected_batch_size must be > 0; got expected_batch_size={cfg.expected_batch_size!r}."
        )
    q = cfg.expected_batch_size / (n * records_per_unit)
    if not (0.0 < q <= 1.0):
        over = f"{n}" if records_per_unit == 1 else f"({n} users x {records_per_unit} records_per_user)"
        raise ZooError(
            f"sampling rate q = expected_batch_size / num_examples = "
            f"{cfg.expected_batch_size}/{over} = {q:.6g} is outside (0, 1]; lower "
            "expected_batch_size or use more data."
        )


def check_pca(cfg: DPConfig, dp_pca: int | None) -> None:
    """An enabled config spends ``cfg.pca_epsilon`` on DP-PCA exactly when the data section
    asks for a projection (``data.dp_pca``), and less than the whole ``cfg.epsilon``. Without
    DP, ``data.dp_pca`` is plain PCA and ``pca_epsilon`` is unused."""
    if not cfg.enabled:
        return
    if dp_pca and cfg.unit == "user":
        raise ZooError(
            f"data.dp_pca = {dp_pca} under dp.unit = 'user' is not supported yet (the projection is "
            "fitted on every record, so one user moves it by as many records as it has); unset data.dp_pca"
        )
    if dp_pca and cfg.pca_epsilon is None:
        raise ZooError(
            f"data.dp_pca = {dp_pca} under DP needs its share of the budget: set dp.pca_epsilon "
            "(the epsilon the projection alone spends, at dp.delta), e.g. dp.pca_epsilon = 0.1"
        )
    if cfg.pca_epsilon is None:
        return
    if not dp_pca:
        raise ZooError(
            f"dp.pca_epsilon = {cfg.pca_epsilon!r} is set, but data.dp_pca is not: there is no "
            "projection to spend it on; set data.dp_pca = K or unset dp.pca_epsilon"
        )
    eps = cfg.pca_epsilon
    if not (is_number(eps) and eps > 0 and math.isfinite(eps)):
        raise ZooError(f"dp.pca_epsilon must be a finite number > 0; got dp.pca_epsilon={eps!r}.")
    if cfg.epsilon is not None and is_number(cfg.epsilon) and not eps < cfg.epsilon:
        raise ZooError(
            f"dp.pca_epsilon = {eps!r} must be below dp.epsilon = {cfg.epsilon!r}: it is the "
            "projection's share of the run's budget, and DP-SGD needs the rest"
        )


def check_unit(cfg: DPConfig, data: DataConfig) -> None:
    """The privacy unit against the settings that must give it, from settings only (never from
    the data, so the refusal releases nothing): ``data.user_column`` is read only by a DP run,
    from a dataset form that reads users (:class:`zoo.data.table.DatasetForm`'s ``users``);
    ``dp.unit = "user"`` needs a ``data.user_column`` and, where the sampler draws a user as
    one unit (ULS), a clipping method that clips it as one (ELS clips each record)."""
    if data.user_column is not None:
        if not cfg.enabled:
            raise ZooError(
                f"data.user_column = {data.user_column!r} is read only under DP for now (dp.enabled = "
                "true, with dp.unit = 'user' to protect users); unset it to train without DP"
            )
        _check_form_gives_users(data)
    if cfg.unit != "user" or not cfg.enabled:
        return
    if data.user_column is None:
        raise ZooError(
            "dp.unit = 'user' needs the column that names each record's user: set data.user_column "
            "(or dp.unit = 'record' to protect single records)"
        )
    method = clipping_method(cfg.clipping)
    if not SAMPLERS[cfg.sampler].users.per_record and not method.clips_users:  # ELS clips records
        able = ", ".join(name for name, m in CLIPPING.items() if m.clips_users)
        per_record = ", ".join(name for name, row in SAMPLERS.items() if row.users and row.users.per_record)
        raise ZooError(
            f"dp.clipping = {cfg.clipping!r} under dp.unit = 'user' is not supported yet; the "
            f"clipping methods that clip a user as one unit: {able} (or dp.sampler = {per_record}, "
            "which clips each record)"
        )


def _check_form_gives_users(data: DataConfig) -> None:
    from zoo.data.table import forms, lookup

    form, _ = lookup(data.dataset.strip())
    fixed = form.user_column
    if form.users and (fixed is None or data.user_column == fixed):
        return
    if form.users:
        raise ZooError(
            f"data.user_column = {data.user_column!r}: {form.usage} names its users by "
            f"data.user_column = {fixed!r} only"
        )
    readers = ", ".join(
        f.usage + (f" (data.user_column = {f.user_column!r})" if f.user_column else "")
        for f in forms()
        if f.users
    )
    raise ZooError(
        f"data.user_column = {data.user_column!r}: {data.dataset!r} cannot give users yet; users "
        f"are read from {readers}"
    )
