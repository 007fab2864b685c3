"""DP-SGD building blocks as pure functions on parameter pytrees.

Per step: draw a Poisson batch (:class:`PoissonSampler`), compute the clipped
per-example gradient sum (:func:`clipped_grad_sum`), add Gaussian noise and
divide by the expected batch size (:func:`privatize`); account for the privacy
spent with :func:`epsilon_spent` / :func:`calibrate_noise_multiplier`.

Clipping methods and samplers are tables (:data:`CLIPPING`, :data:`SAMPLERS`): a new one is
one registration.
"""

from zoo.configs import DPConfig

# ghost registers its clipping method in the table on import, els_sampler its sampler (ELS),
# users the poisson row's draws of users (ULS)
from zoo.dp import els_sampler, ghost, users  # noqa: E402, I001
from zoo.dp.accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    check_choices,
    check_pca,
    epsilon_spent,
    max_steps_within_budget,
    resolve_noise_multiplier,
    validate,
)
from zoo.dp.clipping import (
    CLIPPING,
    ClipModel,
    ClippingMethod,
    ClipRequest,
    clipped_grad_sum,
    clipping_method,
    clipping_names,
    register_clipping,
    unregister_clipping,
)
from zoo.dp.noise import add_gaussian_noise, privatize
from zoo.dp.sampling import (
    SAMPLERS,
    PoissonSampler,
    SamplerKind,
    make_sampler,
    padded_size_for,
    register_sampler,
)

__all__ = [
    "ACCOUNTANTS",
    "CLIPPING",
    "SAMPLERS",
    "ClipModel",
    "ClipRequest",
    "ClippingMethod",
    "DPConfig",
    "PoissonSampler",
    "SamplerKind",
    "add_gaussian_noise",
    "calibrate_noise_multiplier",
    "check_choices",
    "check_pca",
    "clipped_grad_sum",
    "clipping_method",
    "clipping_names",
    "els_sampler",
    "ghost",
    "users",
    "make_sampler",
    "register_clipping",
    "register_sampler",
    "unregister_clipping",
    "epsilon_spent",
    "max_steps_within_budget",
    "padded_size_for",
    "privatize",
    "resolve_noise_multiplier",
    "validate",
]
