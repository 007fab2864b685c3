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


def test_the_data_digest_covers_where_each_users_text_lies():
    """A language model's users own segments of the train stream: the same tokens cut into
    users at other bounds are other data."""
    tokens = np.arange(40, dtype=np.int32) % 7
    from zoo.data.tokenizer import CharTokenizer

    def lm(bounds):
        return Dataset(
            "t", "lm", tokens, None, tokens[:10], None, tokenizer=CharTokenizer.fit("abcdef"),
            users_train=np.array([0, 1], np.int64), segments_train=np.array(bounds, np.int64),
        )  # fmt: skip

    assert dataset_digest(lm([0, 20, 40])) != dataset_digest(lm([0, 24, 40]))
    assert dataset_digest(lm([0, 20, 40])) == dataset_digest(lm([0, 20, 40]))
