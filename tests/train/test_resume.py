"""zoo.train.resume: what a resumed run must find unchanged."""

import numpy as np

from zoo.data.dataset import Dataset
from zoo.train.resume import dataset_digest


def table(users=None) -> Dataset:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array([0, 1, 0, 1, 0, 1], np.int32)
    return Dataset("t", "classify", x, y, x[:2], y[:2], num_classes=2, users_train=users)


def test_the_data_digest_covers_each_rows_user():
    """The same rows grouped into other users are other data for a user-level run: a resume
    across them is refused. Without users the digest is the arrays' alone, as before."""
    one = table(np.array([0, 0, 1, 1, 2, 2], np.int32))
    other = table(np.array([0, 1, 1, 1, 2, 2], np.int32))
    assert dataset_digest(one) != dataset_digest(other)
    assert dataset_digest(one) == dataset_digest(table(np.array([0, 0, 1, 1, 2, 2], np.int32)))
    assert dataset_digest(table()) not in (dataset_digest(one), dataset_digest(other))
    key = b"k" * 32
    assert dataset_digest(one, key) != dataset_digest(other, key)
