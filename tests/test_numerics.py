"""The float rule itself (tests/numerics.py): it passes rounding and fails bugs."""

import math

import ml_dtypes
import numpy as np
import pytest

from tests.numerics import K, assert_bitwise_equal, assert_close, excess, tolerance

pytestmark = pytest.mark.numerics  # every test here compares floats from two programs

EPS = float(np.finfo(np.float32).eps)


def test_tolerance_is_k_eps_sqrt_n_times_the_tree_scale():
    tree = {"a": np.array([0.5, -6.0], np.float32), "b": np.array([0.01], np.float32)}
    assert tolerance(tree, 16) == pytest.approx(K * EPS * 4 * 6.0)
    assert tolerance(tree, 16, dtype=np.float64) == pytest.approx(K * np.finfo(np.float64).eps * 4 * 6.0)
    with pytest.raises(ValueError, match="got 0"):
        tolerance(tree, 0)


def test_another_summation_order_passes():
    rng = np.random.default_rng(0)
    terms = rng.standard_normal((64, 4096)).astype(np.float32)
    pairwise = terms.sum(axis=1)  # numpy's blocked pairwise sum
    sequential = np.zeros(64, np.float32)
    for column in terms.T:  # one term at a time, in float32
        sequential += column
    assert not np.array_equal(pairwise, sequential)  # the orders do round differently
    assert_close(sequential, pairwise, n=4096)


def test_small_entries_carry_the_error_of_the_tree():
    # An entry of -0.036 in a tree that reaches 6, off by a few float32 ulps of 6: rounding.
    expected = {"big": np.float32([6.0, 2.0]), "small": np.float32([-0.036])}
    actual = {"big": expected["big"], "small": expected["small"] + np.float32(4 * EPS * 6)}
    assert_close(actual, expected, n=8)


@pytest.mark.parametrize("bug, relative", [("1e-4 of the largest entry", 1e-4), ("1%", 1e-2)])
def test_a_real_difference_fails(bug, relative):
    expected = {"w": np.linspace(-3, 3, 101, dtype=np.float32), "b": np.float32([0.5])}
    actual = {"w": expected["w"].copy(), "b": expected["b"]}
    actual["w"][17] += relative * 3
    assert excess(actual, expected, n=1024) > 1, bug
    with pytest.raises(AssertionError, match=r"\['w'\]"):
        assert_close(actual, expected, n=1024, what=bug)


def test_zero_reference_must_be_matched_exactly():
    assert_close(np.zeros(3, np.float32), np.zeros(3), n=100)
    with pytest.raises(AssertionError):
        assert_close(np.float32([0, 1e-30, 0]), np.zeros(3), n=100)


@pytest.mark.parametrize(
    "actual",
    [
        np.float32([1.0, np.nan]),  # a NaN where the reference is finite
        np.float32([1.0, 2.0, 3.0]),  # another shape
        {"w": np.float32([1.0, 2.0])},  # another tree
    ],
)
def test_structure_shape_and_non_finite_must_match(actual):
    assert excess(actual, np.float32([1.0, 2.0]), n=4) == math.inf
    with pytest.raises(AssertionError):
        assert_close(actual, np.float32([1.0, 2.0]), n=4)


def test_matching_non_finite_values_pass():
    ref = np.float32([1.0, np.inf, np.nan])
    assert_close(ref.copy(), ref, n=4)
    with pytest.raises(AssertionError):
        assert_close(np.float32([1.0, -np.inf, np.nan]), ref, n=4)


def test_bitwise_is_bitwise():
    a = {"w": np.float32([1.0, 2.0])}
    assert_bitwise_equal(a, {"w": np.float32([1.0, 2.0])})
    with pytest.raises(AssertionError):
        assert_bitwise_equal(a, {"w": np.nextafter(np.float32([1.0, 2.0]), np.float32(3))})
    with pytest.raises(AssertionError):
        assert_bitwise_equal(a, {"w": np.float64([1.0, 2.0])})


def test_the_bf16_rule_passes_bf16_rounding_and_fails_a_real_difference():
    from tests.numerics import BF16_UNIT_ROUNDOFF, assert_close_bf16, bf16_excess

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal((256, 32)).astype(np.float32) / 16
    exact = x.astype(np.float64) @ w.astype(np.float64)
    rounded = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    assert_close_bf16(rounded(x) @ rounded(w), exact, n=256)  # operands stored in bf16, a float32 sum
    scale = float(np.abs(exact).max())
    assert bf16_excess(exact + 0.05 * scale, exact, n=256) > 1  # 5% of the scale: a bug
    assert bf16_excess(exact + 4 * BF16_UNIT_ROUNDOFF * scale, exact, n=256) < 1
