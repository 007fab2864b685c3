"""``zoo.generate.sampling``: a temperature past float32's range draws as the hottest one it
holds, without NumPy's overflow warning, and top-k still keeps k tokens."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from zoo.generate.sampling import Sampling, choose, filtered


def test_a_temperature_past_float32_keeps_the_order_of_the_logits_without_a_warning():
    logits = jnp.asarray([[3.0, -1.0, 2.0, 0.5, 7.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's "overflow encountered in cast" fails the test
        x = np.asarray(filtered(logits, Sampling(temperature=1e300, top_k=2)))
        token = choose(logits, jax.random.split(jax.random.key(0), 1), Sampling(temperature=1e300, top_k=2))
    assert np.isfinite(x).sum() == 2 and set(np.flatnonzero(np.isfinite(x))) == {0, 4}
    assert int(token[0]) in (0, 4)
