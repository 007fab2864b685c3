"""Bounds on the noise calibration, in range and in time, and why it gives up.

The calibration searches noise multipliers in ``[SIGMA_MIN, SIGMA_MAX]``. Below ``SIGMA_MIN``
a PLD composition's privacy-loss range grows without bound and one evaluation takes minutes
(an epsilon of 1e6 asks for that); above ``SIGMA_MAX`` the noise drowns any gradient, and a
budget no multiplier in range meets (a delta of 1e-300, below what the accountant resolves)
has no answer to find. Both ends are checked before the search, and the search itself stops
after ``CALIBRATION_SECONDS``. The RDP accountant's lines for a series that does not
converge at a small multiplier are dropped (:func:`quiet_rdp`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from zoo.errors import ZooError

SIGMA_MIN = 0.3
SIGMA_MAX = 1000.0
CALIBRATION_SECONDS = 120.0


def check_in_range(epsilon: float, delta: float, steps: int, spent: Callable[[float], float]) -> None:
    """ZooError, saying why, unless the multiplier that meets ``epsilon`` lies in the searched
    range. ``spent(sigma)`` is the epsilon a multiplier spends over ``steps`` at ``delta``."""
    budget = f"epsilon={epsilon:g} at delta={delta:g} over {steps} steps"
    low = spent(SIGMA_MIN)
    if low <= epsilon:
        raise ZooError(
            f"noise calibration: {budget} is met already by noise multiplier {SIGMA_MIN:g} (it "
            f"spends epsilon={low:.3g}), the smallest it searches: below it the accountant takes "
            "minutes per try. To train with less noise, set it directly: "
            "--set dp.epsilon=none --set dp.noise_multiplier=SIGMA"
        )
    high = spent(SIGMA_MAX)
    if not high <= epsilon:
        why = (
            f"the accountant gives epsilon=inf even there: delta={delta:g} is below what it resolves; "
            "raise delta"
            if math.isinf(high)
            else f"it spends epsilon={high:.3g}; raise epsilon or delta, or train fewer steps"
        )
        raise ZooError(f"noise calibration: no noise multiplier up to {SIGMA_MAX:g} meets {budget} ({why})")


def with_deadline(make_accountant: Callable, seconds: float | None = None) -> Callable:
    """``make_accountant`` that raises a ZooError once ``seconds`` (default
    ``CALIBRATION_SECONDS``) have passed since this call: the search builds one accountant
    per multiplier it tries."""
    seconds = CALIBRATION_SECONDS if seconds is None else seconds
    deadline, tries = time.monotonic() + seconds, [0]

    def make():
        if time.monotonic() > deadline:
            raise ZooError(
                f"noise calibration gave up after {seconds:g} s and {tries[0]} tries; set the "
                "noise directly (--set dp.epsilon=none --set dp.noise_multiplier=SIGMA) or use "
                "--set dp.accountant=rdp, which is faster"
            )
        tries[0] += 1
        return make_accountant()

    return make


def _not_converged(record: logging.LogRecord) -> bool:
    """False for dp_accounting's "failed to converge ... Excluding this order" line: an RDP order
    whose series does not converge counts as an infinite divergence, so epsilon is the minimum
    over the other orders, still an upper bound. Nothing for a user to act on, and printed once
    per order and multiplier tried (22 lines for python-docs-lm-dp). Its other warnings pass."""
    return "failed to converge" not in str(record.msg)


def quiet_rdp() -> None:
    """Drop :func:`_not_converged` lines from absl's logger (once; called with the accountant)."""
    from absl import logging as absl_logging

    logger = absl_logging.get_absl_logger()
    if _not_converged not in logger.filters:
        logger.addFilter(_not_converged)
