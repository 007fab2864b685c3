"""Fixed-shape Poisson batches and delta: a draw larger than the padded batch is truncated.

That event is not part of the accounted mechanism (:mod:`zoo.dp.accounting`); the padding is
sized so that it adds at most :data:`TRUNCATION_SHARE` of delta over the run, and the delta a
run reports includes what it does add (:func:`zoo.dp.accounting.guaranteed_privacy`).
"""

from __future__ import annotations

import math

from zoo.checks import is_int, is_number
from zoo.errors import ZooError

__all__ = ["TRUNCATION_SHARE", "check_steps", "truncation_budget", "truncation_delta"]


def check_steps(steps: int) -> int:
    if not is_int(steps) or steps < 0:
        raise ZooError(f"steps must be a non-negative int; got steps={steps!r}.")
    return int(steps)


TRUNCATION_SHARE = 1e-3  # of delta: what truncation may add over a run


def truncation_budget(*, delta: float, epsilon: float, steps: int, share: float = TRUNCATION_SHARE) -> float:
    """Per-step truncation probability ``p`` whose cost ``(1 + e^epsilon) * steps * p`` on delta
    (:func:`truncation_delta`) is ``share * delta``."""
    if not (is_number(epsilon) and epsilon >= 0):
        raise ZooError(f"epsilon must be a number >= 0; got epsilon={epsilon!r}.")
    steps = max(check_steps(steps), 1)
    return 0.0 if not epsilon < 700 else share * delta / (steps * (1.0 + math.exp(epsilon)))


def truncation_delta(
    *,
    num_examples: int,
    sampling_prob: float,
    padded_batch_size: int,
    steps: int,
    epsilon: float,
    records_per_unit: int = 1,
) -> float:
    """What truncating Poisson draws to ``padded_batch_size`` adds to delta over ``steps`` steps.

    The truncated mechanism M' and the accounted one M differ only when a draw exceeds the
    padding: per step with probability at most ``p = P(Binomial(N + m, q) > P)`` on either
    neighbour (the larger has the ``m = records_per_unit`` records of one more unit), so M'(D),
    M(D) are within ``steps * p`` in total variation and M' is
    ``(eps, delta + (1 + e^eps) * steps * p)``-DP. Returns at most 1.
    """
    steps, n = check_steps(steps), int(num_examples) + int(records_per_unit)
    if steps == 0 or padded_batch_size >= n:
        return 0.0
    from scipy import stats  # on first use: scipy.stats takes most of a second to import

    p = float(stats.binom.sf(int(padded_batch_size), n, float(sampling_prob)))
    if p == 0.0:
        return 0.0
    return 1.0 if not epsilon < 700 else min(1.0, (1.0 + math.exp(epsilon)) * steps * p)
