"""Issue 33, DP: the noise calibration is bounded in range and in time, and says why it
gives up, in one line; the hang of an epsilon of 1e6 is tested under a time limit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.clikit import refused
from zoo.dp import bounds
from zoo.dp.accounting import SEARCH_PLD_DISCRETIZATION, calibrate_noise_multiplier, epsilon_spent
from zoo.dp.mechanisms import accountant
from zoo.errors import ZooError

LIMIT_S = 120  # the calibration hung past 180 s before; a refusal takes seconds


@pytest.mark.xdist_group("cli-inputs-subprocess")
def test_a_huge_epsilon_is_refused_within_a_time_limit(tmp_path):
    argv = [
        "train",
        "digits-mlp-dp",
        "--steps",
        "20",
        "--set",
        "dp.epsilon=1e6",
        "--out",
        str(tmp_path / "r"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "zoo.cli", *argv], capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: noise calibration"), done.stderr
    assert f"noise multiplier {bounds.SIGMA_MIN:g}" in lines[0] and "dp.noise_multiplier" in lines[0]


@pytest.mark.parametrize("delta", ["1e-300", "5e-324"])
def test_a_delta_below_what_the_accountant_resolves_says_so(capsys, tmp_path, delta):
    argv = [
        "train",
        "digits-mlp-dp",
        "--steps",
        "20",
        "--set",
        f"dp.delta={delta}",
        "--out",
        str(tmp_path / "r"),
    ]
    refused(capsys, argv, "no noise multiplier up to 1000", "below what it resolves")


def test_a_budget_no_multiplier_in_range_meets_names_the_epsilon_it_reaches():
    with pytest.raises(ZooError, match=r"up to 1000 meets epsilon=0\.0001 .*\(it spends epsilon=") as err:
        calibrate_noise_multiplier(epsilon=1e-4, delta=1e-5, sampling_prob=0.5, steps=20)
    # The figure it names is the accountant's own, at the top of the range, on the search grid.
    top = epsilon_spent(
        noise_multiplier=bounds.SIGMA_MAX,
        delta=1e-5,
        sampling_prob=0.5,
        steps=20,
        pld_discretization=SEARCH_PLD_DISCRETIZATION,
    )
    assert f"epsilon={top:.3g};" in str(err.value) and top > 1e-4


def test_the_search_gives_up_after_its_time_and_says_so(monkeypatch):
    monkeypatch.setattr(bounds, "CALIBRATION_SECONDS", 0.0)
    accountant.calibrate.cache_clear()  # the search's cache (calibrate_noise_multiplier wraps it)
    with pytest.raises(ZooError, match=r"gave up after 0 s and 0 tries.*dp\.noise_multiplier"):
        calibrate_noise_multiplier(epsilon=2.5, delta=1e-5, sampling_prob=0.25, steps=7)


def test_a_calibrated_multiplier_inside_the_range_is_unchanged_by_the_bounds():
    sigma = calibrate_noise_multiplier(epsilon=3.0, delta=1e-5, sampling_prob=0.5, steps=30)
    assert bounds.SIGMA_MIN < sigma < bounds.SIGMA_MAX
    assert epsilon_spent(noise_multiplier=sigma, delta=1e-5, sampling_prob=0.5, steps=30) <= 3.0
