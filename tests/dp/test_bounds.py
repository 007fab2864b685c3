"""``zoo.dp.bounds``: the RDP accountant's "failed to converge" lines are not printed; its other
warnings are."""

from __future__ import annotations

import logging

from absl import logging as absl_logging

from zoo.dp import accounting
from zoo.dp.mechanisms import accountant as account


def test_calibrating_with_rdp_prints_no_failed_to_converge_lines(caplog):
    account.calibrate.cache_clear()  # searched afresh, not read from a cache
    account.epsilon.cache_clear()
    with caplog.at_level(logging.WARNING, logger="absl"):
        # python-docs-lm-dp's figures: the search tries multipliers whose low orders do not converge
        sigma = accounting.calibrate_noise_multiplier(
            epsilon=8.0, delta=1e-5, sampling_prob=0.017474, steps=40, accountant="rdp"
        )
        absl_logging.warning("Negative Renyi divergence of %s, probably caused by ...", -1.0)
    assert sigma > 0.3
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "failed to converge" in line]
    assert [line for line in said if "Negative Renyi divergence" in line]  # the others still pass
