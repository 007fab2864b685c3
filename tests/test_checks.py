"""zoo.checks: the one place argument checks are written."""

import numpy as np
import pytest

from zoo.checks import is_int, is_number, require_choice, require_int, require_number, require_positive_int
from zoo.errors import ZooError


def test_bools_are_not_numbers_or_ints():
    assert not is_int(True) and not is_number(False)
    assert is_int(np.int64(3)) and is_number(np.float32(0.5)) and is_number(2)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "2", None])
def test_positive_int_refuses_and_names_the_value(value):
    with pytest.raises(ValueError, match=rf"^train\.steps must be a positive int; got {value!r}\.$"):
        require_positive_int("train.steps", value)


def test_int_range_and_error_type():
    assert require_int("seed", np.int32(7), lo=0, hi=9) == 7
    with pytest.raises(ZooError, match=r"seed must be an int in \[0, 9\]; got 10"):
        require_int("seed", 10, lo=0, hi=9, error=ZooError)


@pytest.mark.parametrize("value", [0.0, -1, float("nan"), True])
def test_positive_number_refuses(value):
    with pytest.raises(ValueError, match="clip_norm must be a positive number"):
        require_number("clip_norm", value, positive=True)


def test_finite_refuses_inf_but_positive_alone_takes_it():
    assert require_number("c", float("inf"), positive=True) == float("inf")
    with pytest.raises(ValueError, match="a positive finite number"):
        require_number("c", float("inf"), positive=True, finite=True)
    assert require_number("q", 1, lo=0, hi=1) == 1.0


def test_choice_lists_the_valid_ones():
    assert require_choice("sampler", "poisson", ["poisson"]) == "poisson"
    with pytest.raises(
        ZooError, match=r"unknown clipping 'gost'\. Did you mean 'ghost'\?.*Valid: ghost, vmap"
    ):
        require_choice("clipping", "gost", ["vmap", "ghost"])
