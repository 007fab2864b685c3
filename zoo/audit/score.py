"""Scores of the canaries, and the lower bound on epsilon they support.

White-box, from the projections ``x[t, j]`` of each step's release onto canary ``j``'s
direction (in units of the clip norm; about 1 in a step that sampled the canary, plus noise):

* ``sum``: ``sum_t x[t, j]``, the canary's share of the whole training run. The test that
  matches a correct DP-SGD step: in-canaries gain about ``q * T``, against noise of
  ``sigma * sqrt(T)``.
* ``spread``: ``sum_t (x[t, j] - mean_t x[t, j])^2``, how much the canary's share moves from
  step to step. Noise that repeats (the same key every step) is a constant per canary and
  drops out of it, while the in-canaries still move by 1 between steps that do and do not
  sample them; the ``sum`` score cannot see that bug, this one sees nothing else better.

Black-box: ``loss_drop``, the canary's loss at the initial params minus at the final ones.

The bound is Steinke, Nasr and Jagielski's one-run audit as ``jax_privacy.auditing``
implements it (``CanaryScoreAuditor.epsilon_one_run``). With two scores each one is audited
at half the significance (Bonferroni), so the larger of the two bounds holds at the asked
confidence.
"""

from __future__ import annotations

import numpy as np

from zoo.errors import ZooError

METHOD = "epsilon_one_run"  # jax_privacy.auditing.CanaryScoreAuditor, Bonferroni over scores


def whitebox_scores(projections: np.ndarray) -> dict[str, np.ndarray]:
    x = np.asarray(projections, np.float64)
    return {"sum": x.sum(axis=0), "spread": np.square(x - x.mean(axis=0)).sum(axis=0)}


def blackbox_scores(loss_before: np.ndarray, loss_after: np.ndarray) -> dict[str, np.ndarray]:
    return {"loss_drop": np.asarray(loss_before, np.float64) - np.asarray(loss_after, np.float64)}


def lower_bounds(
    scores: dict[str, np.ndarray], included: np.ndarray, confidence: float, delta: float
) -> dict[str, float]:
    """Epsilon lower bound per score, each at significance ``(1 - confidence) / len(scores)``."""
    from jax_privacy.auditing import CanaryScoreAuditor

    included = np.asarray(included, bool)
    if included.all() or not included.any():
        raise ZooError("an audit needs canaries both in and out of the training set")
    for name, values in scores.items():
        bad = int(np.sum(~np.isfinite(values)))
        if bad:  # jax_privacy ranks NaN scores arbitrarily: that could show a false leak
            raise ZooError(
                f"{bad} of {values.size} canary '{name}' scores are not finite (did training diverge?)"
            )
    significance = (1.0 - confidence) / len(scores)
    return {
        name: float(
            CanaryScoreAuditor(values[included], values[~included]).epsilon_one_run(significance, delta)
        )
        for name, values in scores.items()
    }
