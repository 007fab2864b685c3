"""digits: offline loading, deterministic splits and the classes filter, checked against sklearn."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.datasets import load_digits

from zoo.data import Dataset, DatasetError, dataset_kinds, load_dataset


@pytest.fixture(scope="module")
def sk():
    bunch = load_digits()
    return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int64)


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", task="classify", seed=0)


def _sorted_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    table = np.concatenate([x.astype(np.float64), y[:, None].astype(np.float64)], axis=1)
    return table[np.lexsort(table.T[::-1])]


def test_shapes_dtypes_and_range(digits, sk):
    x, _ = sk
    n = len(x)
    assert digits.name == "digits" and digits.task == "classify"
    assert digits.num_train + digits.num_eval == n
    assert digits.num_eval == math.ceil(0.1 * n)
    assert digits.x_train.dtype == np.float32 and digits.x_train.shape == (digits.num_train, 64)
    assert digits.y_train.dtype == np.int32 and digits.y_eval.shape == (digits.num_eval,)
    assert digits.num_features == 64 and digits.feature_shape == (8, 8) and digits.num_classes == 10
    both = np.concatenate([digits.x_train, digits.x_eval])
    assert both.min() >= 0.0 and both.max() <= 1.0 and both.max() == 1.0
    assert digits.tokenizer is None


def test_rows_and_labels_are_sklearns(digits, sk):
    x, y = sk
    rows = np.concatenate([digits.x_train, digits.x_eval])
    ours = _sorted_rows(rows, np.concatenate([digits.y_train, digits.y_eval]))
    np.testing.assert_array_equal(ours, _sorted_rows(x, y))


def test_split_is_deterministic_per_seed(digits):
    again = load_dataset("digits", task="classify", seed=0)
    np.testing.assert_array_equal(again.x_train, digits.x_train)
    np.testing.assert_array_equal(again.y_eval, digits.y_eval)
    other = load_dataset("digits", task="classify", seed=1)
    assert other.num_eval == digits.num_eval
    assert not np.array_equal(other.x_eval, digits.x_eval)


def test_eval_fraction_changes_split_size(sk):
    ds = load_dataset("digits", task="classify", eval_fraction=0.25)
    assert ds.num_eval == math.ceil(0.25 * len(sk[0]))


def test_arrays_are_read_only(digits):
    with pytest.raises(ValueError):
        digits.x_train[0, 0] = 0.5


def test_classes_filter_and_remap(sk):
    x, y = sk
    classes = (5, 6, 7, 8, 9)
    ds = load_dataset("digits", task="classify", classes=classes)
    assert ds.num_classes == 5
    assert ds.num_train + ds.num_eval == int(np.isin(y, classes).sum())
    labels = np.concatenate([ds.y_train, ds.y_eval])
    assert set(labels.tolist()) == {0, 1, 2, 3, 4}
    original = np.asarray(classes)[labels]
    rows = np.concatenate([ds.x_train, ds.x_eval])
    keep = np.isin(y, classes)
    np.testing.assert_array_equal(_sorted_rows(rows, original), _sorted_rows(x[keep], y[keep]))


def test_classes_order_defines_new_labels(sk):
    x, y = sk
    ds = load_dataset("digits", task="classify", classes=(3, 1))
    assert ds.num_classes == 2
    original = np.asarray([3, 1])[ds.y_train]
    keep = np.isin(y, (1, 3))
    sk_rows = {(r.tobytes(), int(lab)) for r, lab in zip(x[keep], y[keep], strict=True)}
    assert all((r.tobytes(), int(lab)) in sk_rows for r, lab in zip(ds.x_train, original, strict=True))


def test_missing_class_is_an_error():
    with pytest.raises(DatasetError, match="42"):
        load_dataset("digits", task="classify", classes=(3, 42))


def test_digits_is_classify_only():
    with pytest.raises(DatasetError, match="classify"):
        load_dataset("digits", task="lm")


def test_unknown_task_names_value_and_choices():
    with pytest.raises(DatasetError) as err:
        load_dataset("digits", task="regress")
    assert "regress" in str(err.value) and "classify" in str(err.value) and "lm" in str(err.value)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 2])
def test_bad_eval_fraction(fraction):
    with pytest.raises(DatasetError, match="eval_fraction"):
        load_dataset("digits", task="classify", eval_fraction=fraction)


def test_unknown_spec_suggests_close_match():
    with pytest.raises(DatasetError) as err:
        load_dataset("digts", task="classify")
    msg = str(err.value)
    assert "'digts'" in msg and "Did you mean 'digits'" in msg
    assert all(kind in msg for kind in dataset_kinds())


def test_unknown_scheme_suggests_close_scheme():
    with pytest.raises(DatasetError, match="csv:data.csv"):
        load_dataset("cvs:data.csv", task="classify")


def test_a_user_column_is_never_ignored(tmp_path):
    """Read under DP only, from a form that gives users, by the column it names them by; else
    refused before anything is read. Planted: a guard left out loads the rows without users."""
    path = tmp_path / "notes.txt"
    path.write_text("a line of notes\n" * 20)
    with pytest.raises(DatasetError, match="read only under DP"):
        load_dataset(f"text:{path}", task="lm", user_column="file")
    with pytest.raises(DatasetError, match="'python-docs' cannot give users"):
        load_dataset("python-docs", task="lm", user_column="file", private=True)
    with pytest.raises(DatasetError, match="it names users by user_column='file'"):
        load_dataset(f"text:{path}", task="lm", user_column="user", private=True)


def test_a_subset_of_a_shipped_datasets_classes_is_no_warning_but_a_files_is(tmp_path):
    import warnings

    from zoo.data.errors import DataDependentWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", DataDependentWarning)  # digits-mlp-pretrain's classes
        ds = load_dataset("digits", task="classify", classes=(0, 1, 2, 3, 4))
    assert ds.num_classes == 5 and ds.y_train.max() == 4
    path = tmp_path / "three.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(30)))
    with pytest.warns(DataDependentWarning, match="leaves out 10 of 30 rows"):
        load_dataset(f"csv:{path}", task="classify", classes=(0, 1))
