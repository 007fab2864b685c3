"""The suite's one rule for comparing floats that come from two different programs.

The rule itself (why it is scaled by the whole tree and by ``sqrt(n)``, and its allowance ``K``)
lives in :mod:`zoo.bench.floats`, so that the benchmarks compare with the same formula; this
module asserts with it. Claims that are bitwise (a resumed run, frozen leaves, the same program
twice, a split and merge) do not use this rule: they use :func:`assert_bitwise_equal`.

Set ``ZOO_NUMERICS_LOG=FILE`` to append one JSON line per comparison (test, worst error over its
tolerance): the way to see how much head-room each comparison has under an instruction-set cap.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from zoo.bench.floats import K, excess, leaves, tolerance, worst

__all__ = ["K", "assert_bitwise_equal", "assert_close", "excess", "tolerance"]


def assert_close(actual, expected, *, n: int, dtype=None, k: float = K, what: str = "") -> None:
    """Assert two pytrees (or arrays, or scalars) agree under the suite's float rule.

    ``expected`` is the reference (float64 NumPy, the other backend, plain ``jax.grad``...);
    ``n`` is the size of the largest reduction behind the values. Raises ``AssertionError``
    naming the worst element, the tolerance and their ratio.
    """
    ratio, where, tol = worst(actual, expected, n, dtype, k)
    _log(ratio)
    if not ratio <= 1.0:
        label = f"{what}: " if what else ""
        raise AssertionError(
            f"{label}{where} exceeds the float rule's {tol:.3g} "
            f"(K={k:g} x eps x sqrt(n={n}) x tree scale) by {ratio:.3g}x"
        )


def assert_bitwise_equal(actual, expected) -> None:
    """Same structure, dtypes and bits: for claims that are bitwise, never loosened."""
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for (path, a), (_, e) in zip(leaves(actual), leaves(expected), strict=True):
        assert a.dtype == e.dtype, f"{path}: dtype {a.dtype} vs {e.dtype}"
        np.testing.assert_array_equal(a, e, err_msg=path, strict=True)


def _log(worst: float) -> None:
    target = os.environ.get("ZOO_NUMERICS_LOG")
    if target:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        with open(target, "a") as f:
            f.write(
                json.dumps({"test": test, "excess": worst, "isa": os.environ.get("XLA_FLAGS", "")}) + "\n"
            )
