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
import math
import os

import jax
import numpy as np

from zoo.bench.floats import K, excess, leaves, tolerance, worst

__all__ = [
    "BF16_UNIT_ROUNDOFF",
    "K",
    "assert_bitwise_equal",
    "assert_close",
    "assert_close_bf16",
    "bf16_excess",
    "excess",
    "tolerance",
]

# --- bfloat16 compute against float32 -----------------------------------------------------
# A step computed under the bfloat16 policy (zoo.precision) and the same step in float32 differ
# by more than the order of a float32 sum: every weight, activation and cotangent the bf16 step
# stores is rounded to bf16, a relative error of at most u = 2^-8 (bf16 keeps 8 significant
# bits). Its dots accumulate in float32 (XLA widens bf16 products on CPU and GPU alike), and its
# norm statistics, softmax, logits, loss, per-example norms and clipped sums are float32 (each
# checked in the compiled program), so a sum of n products x_i w_i whose operands were rounded
# is off by sum_i x_i w_i (d_i + d'_i), |d| <= u: rounding errors of distinct terms are
# independent, so the error grows like u sqrt(sum (x_i w_i)^2), which is u times the size of a
# sum of n products of random sign, and the float32 accumulation adds eps32 sqrt(n) as in the
# float rule. So every element must satisfy
#
#     |bf16 - float32| <= K * (u + eps32 * sqrt(n)) * max|float32 over the whole tree|
#
# with the float rule's n and its K (the rounding that compounds through a few layers and the
# backward pass): 3.1% of the tree's scale for the shapes of the tests, where a float32 sum of
# n terms in bf16 would allow u sqrt(n), more than the gradient itself. A float32 statistic
# computed in bf16 (the planted bug of tests/test_precision.py) is off by a whole unit of the
# input's mean and fails it.
BF16_UNIT_ROUNDOFF = 2.0**-8
_EPS32 = float(np.finfo(np.float32).eps)


def _bf16_k(n: int) -> float:
    """The float rule's allowance at n = 1 that makes its tolerance the bf16 rule's."""
    if n < 1:
        raise ValueError(f"n must be the size of a reduction (>= 1), got {n}")
    return K * (BF16_UNIT_ROUNDOFF + _EPS32 * math.sqrt(n)) / _EPS32


def bf16_excess(actual, expected, *, n: int) -> float:
    """The worst ``|actual - expected|`` over the bf16 rule's tolerance (<= 1 passes)."""
    return worst(actual, expected, 1, None, _bf16_k(n))[0]


def assert_close_bf16(actual, expected, *, n: int, what: str = "") -> None:
    """Assert a bf16-compute result ``actual`` agrees with the float32 one ``expected`` under
    the bf16 rule above (``n``: the size of the largest reduction behind the values)."""
    rule = f"bf16 rule's {{tol:.3g}} (K={K:g} x (2^-8 + eps32 x sqrt(n={n})) x tree scale)"
    _check(worst(actual, expected, 1, None, _bf16_k(n)), rule, what)


def assert_close(actual, expected, *, n: int, dtype=None, k: float = K, what: str = "") -> None:
    """Assert two pytrees (or arrays, or scalars) agree under the suite's float rule.

    ``expected`` is the reference (float64 NumPy, the other backend, plain ``jax.grad``...);
    ``n`` is the size of the largest reduction behind the values. Raises ``AssertionError``
    naming the worst element, the tolerance and their ratio.
    """
    rule = f"float rule's {{tol:.3g}} (K={k:g} x eps x sqrt(n={n}) x tree scale)"
    _check(worst(actual, expected, n, dtype, k), rule, what)


def _check(found, rule: str, what: str) -> None:
    """Log the worst ratio of ``found`` (``worst``'s answer) and raise naming it if it is > 1."""
    ratio, where, tol = found
    _log(ratio)
    if not ratio <= 1.0:
        label = f"{what}: " if what else ""
        raise AssertionError(f"{label}{where} exceeds the {rule.format(tol=tol)} by {ratio:.3g}x")


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
