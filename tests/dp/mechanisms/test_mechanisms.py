"""zoo.dp.mechanisms: the one table. A mechanism added there (here a test-local one: full-batch
DP-GD, every record in every step) gets a working plan, sampler, noise and epsilon through the
normal path, make_plan, with nothing else touched."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from tests.dp.mechanisms.sections import RECORD, RECORDS, STEPS, plan
from zoo.dp.mechanisms import (
    MECHANISMS,
    Mechanism,
    MechanismRow,
    register_mechanism,
    unregister_mechanism,
)
from zoo.dp.sampling import PoissonSampler


@dataclass(frozen=True)
class FullBatch(Mechanism):
    """DP-GD: every record in every step, so a step is the Gaussian mechanism alone."""

    name: ClassVar[str] = "full-batch"

    @property
    def sampling_prob(self) -> float:
        return 1.0

    def step_event(self):
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def sampler(self, data, seed, truncation_prob, pad_multiple):
        draw = PoissonSampler.for_expected_batch  # padded for the neighbour with one more record
        return draw(data, data, seed, truncation_prob, pad_to_multiple=pad_multiple, neighbours=True)


@pytest.fixture
def full_batch():
    """The toy row, registered for one test: it claims record-level sections of one noise seed."""
    row = MechanismRow(
        "full-batch",
        "DP-GD over all records each step",
        lambda dp: dp.unit == "record" and dp.noise_seed == 77,
        lambda dp, units: FullBatch(dp.noise_multiplier, dp.clip_norm, units, units),
    )
    register_mechanism(row)
    yield dataclasses.replace(RECORD, noise_seed=77)
    unregister_mechanism(row.name)


def gaussian_epsilon(sigma: float, steps: int, delta: float) -> float:
    accountant = PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), steps)
    return accountant.get_epsilon(delta)


def test_a_registered_mechanism_makes_the_plan_of_the_sections_it_claims(full_batch):
    """Planted: a table that asks its first row that claims a section (DP-SGD) instead of the
    latest never reaches the toy, and fails."""
    made = plan(full_batch)
    assert isinstance(made.mechanism, FullBatch)
    assert made.epsilon == gaussian_epsilon(RECORD.noise_multiplier, STEPS, RECORD.delta)
    assert made.epsilon_at(5) == gaussian_epsilon(RECORD.noise_multiplier, 5, RECORD.delta)
    assert made.expected_batch_size == RECORDS  # the normaliser: every record, public
    indices, mask, realised = made.sampler.batch_indices(0)
    assert realised == RECORDS and np.sort(np.asarray(indices)[np.asarray(mask, bool)]).tolist() == list(
        range(RECORDS)
    )
    assert made.privacy_at(STEPS)["delta_truncation"] == 0.0
    assert not isinstance(plan(RECORD).mechanism, FullBatch)  # the sections it does not claim


def test_a_registered_mechanism_is_calibrated_through_its_own_event(full_batch):
    made = plan(dataclasses.replace(full_batch, noise_multiplier=None, epsilon=2.0))
    assert made.epsilon <= 2.0
    assert gaussian_epsilon(0.999 * made.noise_multiplier, STEPS, RECORD.delta) > 2.0  # the smallest, to 0.1%


def test_the_table_is_where_the_mechanisms_are():
    assert {"dpsgd", "uls", "els", "dp-pca"} <= set(MECHANISMS)
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism(MECHANISMS["dpsgd"])
