"""The one rule for comparing floats that come from two different programs (the test suite's,
through ``tests/numerics.py``, and the benchmarks').

Why one rule. XLA's CPU code generator picks its vector width from the machine (SSE4.2, AVX,
AVX2, AVX-512), and the width decides the order in which float32 sums are accumulated; fused
multiply-adds and the other instruction choices differ with it too. Two programs that are equal in
exact arithmetic (vmap vs a loop, NNX vs Equinox, remat vs none, ghost norms vs per-example
gradients), and even one program on two machines, therefore differ by rounding. Summing n float32
terms in another order moves the result by about ``eps * sqrt(n)`` times the size of the terms
(``n * eps`` in the worst case), and a value computed from large terms that cancel inherits the
absolute error of those terms, not a relative error of its own size: an entry of -0.036 in a
gradient whose entries reach 6 carries errors of size ``eps * 6``, not ``eps * 0.036``. So the
scale is the magnitude of the whole tree, never of each element, and every element must satisfy

    |actual - expected| <= K * eps(dtype) * sqrt(n) * max|expected over the whole tree|

with ``n`` the size of the largest reduction behind the values (say batch x tokens x hidden
width for a weight gradient) and ``K`` a small allowance for the rounding that compounds through a
few layers. For float32 this is 1e-6 to 1e-4 of the tree's scale: orders of magnitude below a real
bug (a clip bound at 1.01 C, a dropped mask, a missing 1/B, two layers swapped), which each
family's negative test shows is still caught.

Claims that are bitwise (a resumed run, frozen leaves, the same program twice, a split and merge)
do not use this rule (the suite's ``assert_bitwise_equal``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["K", "excess", "leaves", "tolerance", "worst"]

# Calibrated under --xla_cpu_max_isa=SSE4_2, AVX, AVX2 and the default on AVX-512: the largest
# error seen in the suite was well under half of this allowance (ZOO_NUMERICS_LOG shows each one).
K = 8.0


def leaves(tree) -> list[tuple[str, np.ndarray]]:
    """``(path, array)`` for every leaf of ``tree``."""
    flat = jax.tree_util.tree_leaves_with_path(tree)
    return [(jax.tree_util.keystr(path) or "<root>", np.asarray(leaf)) for path, leaf in flat]


def tolerance(expected, n: int, *, dtype=None, k: float = K) -> float:
    """The absolute tolerance for every element of ``expected`` (a pytree or an array).

    Args:
      expected: the reference values; their largest magnitude sets the scale.
      n: size of the largest reduction behind the values (>= 1).
      dtype: the precision of the computation (default float32, also when the reference is a
        float64 NumPy loop: the float32 side sets the error).
      k: the allowance; keep the default unless a comment says why.
    """
    if n < 1:
        raise ValueError(f"n must be the size of a reduction (>= 1), got {n}")
    named = leaves(expected)
    scale = max((float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0)) for _, x in named), default=0.0)
    eps = float(jnp.finfo(np.float32 if dtype is None else dtype).eps)  # jnp: bfloat16 too
    return k * eps * math.sqrt(n) * scale


def excess(actual, expected, n: int, *, dtype=None, k: float = K) -> float:
    """The worst ``|actual - expected|`` over the tolerance (<= 1 passes). Same arguments as
    :func:`tolerance`; structures, shapes and non-finite positions must match (else ``inf``)."""
    return worst(actual, expected, n, dtype, k)[0]


def worst(actual, expected, n, dtype=None, k=K):
    """``(excess, where, tolerance)``: :func:`excess` with the element it was found at."""
    a_leaves, e_leaves = leaves(actual), leaves(expected)
    if jax.tree_util.tree_structure(actual) != jax.tree_util.tree_structure(expected):
        return math.inf, "tree structures differ", 0.0
    tol = tolerance(expected, n, dtype=dtype, k=k)
    worst, where = 0.0, ""
    for (path, a), (_, e) in zip(a_leaves, e_leaves, strict=True):
        if a.shape != e.shape:
            return math.inf, f"{path}: shape {a.shape} vs {e.shape}", tol
        a, e = a.astype(np.float64), e.astype(np.float64)
        finite = np.isfinite(e)
        if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(
            a[~finite], e[~finite], equal_nan=True
        ):
            return math.inf, f"{path}: non-finite values differ", tol
        if not finite.any():
            continue
        diff = np.abs(a[finite] - e[finite])
        i = int(np.argmax(diff))
        ratio = diff[i] / tol if tol > 0 else (math.inf if diff[i] > 0 else 0.0)
        if ratio > worst or not where:
            worst = ratio
            where = f"{path}: |{a[finite][i]:.9g} - {e[finite][i]:.9g}| = {diff[i]:.3g}"
    return worst, where, tol
