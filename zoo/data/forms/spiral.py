"""``spiral``: the three-arm spiral of the JAX practice chapter's capstone, drawn offline.

Class j's points have radius r ~ U[0, 1) and angle 4j + 4r + 0.15 N(0, 1); each point is
(r sin(angle), r cos(angle)). All arms start at the origin, so the hard examples sit there.
The points come from ``jax.random`` with a fixed key: the dataset is the same on every machine
(the train/eval split still follows the recipe's seed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zoo.data.table import Source, register_builtin

SEED = 2026
PER_CLASS = 600
NUM_CLASSES = 3
NOISE = 0.15


def make_spiral(key: jax.Array, per_class: int, num_classes: int = NUM_CLASSES, noise: float = NOISE):
    """``(x [C * per_class, 2] float32, y [C * per_class] int32)``, class by class."""
    k_r, k_n = jax.random.split(key)
    r = jax.random.uniform(k_r, (num_classes, per_class))
    cls = jnp.arange(num_classes)[:, None]
    theta = 4.0 * cls + 4.0 * r + noise * jax.random.normal(k_n, (num_classes, per_class))
    x = jnp.stack([r * jnp.sin(theta), r * jnp.cos(theta)], axis=-1).reshape(-1, 2)
    y = jnp.broadcast_to(cls, (num_classes, per_class)).reshape(-1)
    return np.asarray(x, np.float32), np.asarray(y, np.int32)


@functools.cache
def _spiral() -> Source:
    import datasets

    x, y = make_spiral(jax.random.key(SEED), PER_CLASS)
    features = datasets.Features(
        {
            "x0": datasets.Value("float32"),
            "x1": datasets.Value("float32"),
            "label": datasets.ClassLabel(names=[f"arm{j}" for j in range(NUM_CLASSES)]),
        }
    )
    rows = datasets.Dataset.from_dict({"x0": x[:, 0], "x1": x[:, 1], "label": y}, features=features)
    return Source(rows, text_column="text", image_column="image", label_column="label")


register_builtin(
    "spiral",
    "classify",
    _spiral,
    description=f"three-arm spiral, {PER_CLASS} points per arm, drawn from jax.random with a fixed key",
)
