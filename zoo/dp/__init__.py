"""DP-SGD building blocks as pure functions on parameter pytrees.

Per step: draw a Poisson batch (:class:`PoissonSampler`), compute the clipped
per-example gradient sum (:func:`clipped_grad_sum`), add Gaussian noise and
divide by the expected batch size (:func:`privatize`); account for the privacy
spent with :func:`epsilon_spent` / :func:`calibrate_noise_multiplier`.
"""

from zoo.dp.accounting import (
    ACCOUNTANTS,
    DPConfig,
    calibrate_noise_multiplier,
    epsilon_spent,
    max_steps_within_budget,
    resolve_noise_multiplier,
    validate,
)
from zoo.dp.clipping import clipped_grad_sum
from zoo.dp.noise import add_gaussian_noise, privatize
from zoo.dp.sampling import PoissonSampler, padded_size_for

__all__ = [
    "ACCOUNTANTS",
    "DPConfig",
    "PoissonSampler",
    "add_gaussian_noise",
    "calibrate_noise_multiplier",
    "clipped_grad_sum",
    "epsilon_spent",
    "max_steps_within_budget",
    "padded_size_for",
    "privatize",
    "resolve_noise_multiplier",
    "validate",
]
