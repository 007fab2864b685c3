"""DP mechanisms, one frozen config each, and the one table that maps a ``[dp]`` section to one.

A mechanism (:class:`zoo.dp.mechanisms.base.Mechanism`) holds what decides the privacy: noise
multiplier, clip norm, expected batch, the units counted and how they are drawn. Its
``make(performance, ...)`` returns the sampler, the clipped aggregation, the stateful noise
transform and its ``dp_event``; the accountant (:mod:`zoo.dp.mechanisms.accountant`) composes
that event. How the step is computed (:class:`Performance`) lives apart and cannot change epsilon.

:data:`MECHANISMS` is the table: a row names a mechanism, says which ``[dp]`` sections it
``claims`` and ``build``s it for ``units`` privacy units. The latest registered row that claims
a section makes it, so a new mechanism is its module plus one :func:`register_mechanism`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from zoo.configs import DPConfig
from zoo.dp.groups import ClipStyle
from zoo.dp.mechanisms.base import (
    Canaries,
    GaussianNoise,
    Made,
    Mechanism,
    NoiseState,
    Performance,
    clipped_aggregation,
)
from zoo.dp.mechanisms.dpsgd import DPSGD, UserDPSGD
from zoo.dp.mechanisms.els import ELS
from zoo.dp.mechanisms.pca import DPPCA
from zoo.dp.sampling import SAMPLERS

__all__ = [
    "Canaries",
    "DPPCA",
    "DPSGD",
    "ELS",
    "MECHANISMS",
    "GaussianNoise",
    "Made",
    "Mechanism",
    "MechanismRow",
    "NoiseState",
    "Performance",
    "UserDPSGD",
    "clipped_aggregation",
    "mechanism_for",
    "register_mechanism",
    "unregister_mechanism",
]


@dataclass(frozen=True)
class MechanismRow:
    """A row of :data:`MECHANISMS`: ``claims(dp)`` says whether the row makes the mechanism of
    the ``[dp]`` section ``dp``; ``build(dp, units)`` makes it over ``units`` privacy units, with
    ``dp.noise_multiplier`` (None: the plan calibrates it to ``dp.epsilon``)."""

    name: str
    description: str
    claims: Callable[[DPConfig], bool]
    build: Callable[[DPConfig, int], Mechanism]


MECHANISMS: dict[str, MechanismRow] = {}


def register_mechanism(row: MechanismRow) -> MechanismRow:
    if row.name in MECHANISMS:
        raise ValueError(f"mechanism {row.name!r} is already registered")
    MECHANISMS[row.name] = row
    return row


def unregister_mechanism(name: str) -> None:
    MECHANISMS.pop(name)


def mechanism_for(dp: DPConfig, units: int) -> Mechanism:
    """The mechanism of an enabled ``[dp]`` section over ``units`` privacy units: the latest
    registered row that claims it builds it."""
    for row in reversed(MECHANISMS.values()):
        if row.claims(dp):
            return row.build(dp, units)
    raise ValueError(f"no mechanism claims this [dp] section; the mechanisms: {', '.join(MECHANISMS)}")


def _settings(dp: DPConfig, units: int) -> dict:
    return {
        "noise_multiplier": dp.noise_multiplier,
        "clip_norm": dp.clip_norm,
        "expected_batch_size": dp.expected_batch_size,
        "units": units,
        "sampler_name": dp.sampler,
        "clip_style": ClipStyle.of(dp),
    }


def _per_record(dp: DPConfig) -> bool:
    """Whether the sampler row draws a user's records each on its own (ELS)."""
    return dp.unit == "user" and SAMPLERS[dp.sampler].users.per_record


def _with_pca(dp: DPConfig, units: int) -> DPPCA:
    """The section's DP-SGD mechanism after DP-PCA's release, its noise calibrated here, the one
    place, for its share ``dp.pca_epsilon``."""
    from zoo.dp.mechanisms.accountant import calibrate_gaussian

    without = dataclasses.replace(dp, pca_epsilon=None)
    sigma = calibrate_gaussian(epsilon=dp.pca_epsilon, delta=dp.delta, accountant=dp.accountant)
    return DPPCA(mechanism_for(without, units), sigma)


for _row in (
    MechanismRow(
        "dpsgd",
        "DP-SGD over records: Poisson-sampled, clipped, Gaussian noise",
        lambda dp: dp.unit == "record",
        lambda dp, units: DPSGD(**_settings(dp, units)),
    ),
    MechanismRow(
        "uls",
        "DP-SGD over users (ULS): a user drawn and clipped as one unit of records_per_user slots",
        lambda dp: dp.unit == "user" and not _per_record(dp),
        lambda dp, units: UserDPSGD(**_settings(dp, units), slots=dp.records_per_user),
    ),
    MechanismRow(
        "els",
        "ELS: a user's records (at most records_per_user) drawn and clipped each on its own",
        lambda dp: _per_record(dp),
        lambda dp, units: ELS(**_settings(dp, units), k=dp.records_per_user),
    ),
    MechanismRow(
        "dp-pca",
        "DP-PCA's Gaussian release (dp.pca_epsilon), then the section's DP-SGD mechanism",
        lambda dp: dp.pca_epsilon is not None,
        _with_pca,
    ),
):
    register_mechanism(_row)
