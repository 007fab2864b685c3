"""sample_batch and eval_batches: shapes, dtypes, targets and coverage."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.data import CharTokenizer, Dataset, DatasetError, load_dataset, sample_batch
from zoo.data.batches import eval_batches


def _toy_classify(n_train: int = 50, n_eval: int = 23, features: int = 5) -> Dataset:
    rng = np.random.default_rng(0)
    return Dataset(
        name="toy",
        task="classify",
        x_train=rng.uniform(size=(n_train, features)).astype(np.float32),
        y_train=rng.integers(0, 3, size=n_train).astype(np.int32),
        x_eval=rng.uniform(size=(n_eval, features)).astype(np.float32),
        y_eval=rng.integers(0, 3, size=n_eval).astype(np.int32),
        num_classes=3,
    )


def _toy_lm(n_train: int = 200, n_eval: int = 57) -> Dataset:
    """Token streams whose values are distinct, so a window's first token reveals its offset."""
    text = "".join(chr(0x100 + i) for i in range(n_train + n_eval))
    tok = CharTokenizer.fit(text)
    ids = tok.encode(text)
    return Dataset(
        name="toy-lm",
        task="lm",
        x_train=ids[:n_train],
        y_train=None,
        x_eval=ids[n_train:],
        y_eval=None,
        tokenizer=tok,
    )


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", task="classify")


def test_classify_sample_shapes_and_rows(digits):
    rng = np.random.default_rng(0)
    batch = sample_batch(digits, "train", 32, rng)
    assert set(batch) == {"x", "y", "mask"}
    assert batch["x"].shape == (32, 64) and batch["x"].dtype == np.float32
    assert batch["y"].shape == (32,) and batch["y"].dtype == np.int32
    assert batch["mask"].dtype == np.float32 and (batch["mask"] == 1).all()
    pairs = {(r.tobytes(), int(lab)) for r, lab in zip(digits.x_train, digits.y_train, strict=True)}
    assert all((r.tobytes(), int(lab)) in pairs for r, lab in zip(batch["x"], batch["y"], strict=True))


def test_classify_sample_has_no_repeats_within_a_batch():
    ds = _toy_classify()
    batch = sample_batch(ds, "train", ds.num_train, np.random.default_rng(1))
    rows = {r.tobytes() for r in batch["x"]}
    assert rows == {r.tobytes() for r in ds.x_train}


def test_classify_sample_larger_than_split_and_eval_split():
    ds = _toy_classify()
    batch = sample_batch(ds, "eval", ds.num_eval + 10, np.random.default_rng(2))
    assert batch["x"].shape == (ds.num_eval + 10, 5)
    evals = {r.tobytes() for r in ds.x_eval}
    assert all(r.tobytes() in evals for r in batch["x"])


def test_sampling_is_reproducible_from_rng(digits):
    a = sample_batch(digits, "train", 16, np.random.default_rng(5))
    b = sample_batch(digits, "train", 16, np.random.default_rng(5))
    np.testing.assert_array_equal(a["x"], b["x"])


def test_lm_targets_are_next_tokens():
    ds = _toy_lm()
    batch = sample_batch(ds, "train", 8, np.random.default_rng(0), seq_len=16)
    assert batch["x"].shape == (8, 16) and batch["x"].dtype == np.int32
    assert batch["y"].shape == (8, 16) and batch["y"].dtype == np.int32
    assert batch["mask"].shape == (8,) and (batch["mask"] == 1).all()
    for x, y in zip(batch["x"], batch["y"], strict=True):
        start = int(np.flatnonzero(ds.x_train == x[0])[0])
        np.testing.assert_array_equal(x, ds.x_train[start : start + 16])
        np.testing.assert_array_equal(y, ds.x_train[start + 1 : start + 17])


def test_lm_windows_can_reach_the_last_token():
    ds = _toy_lm(n_train=6, n_eval=3)
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(50):
        seen.update(sample_batch(ds, "train", 4, rng, seq_len=5)["y"][:, -1].tolist())
    assert seen == {int(ds.x_train[-1])}


def test_lm_on_real_text_windows_come_from_the_corpus():
    ds = load_dataset("python-docs", task="lm")
    batch = sample_batch(ds, "eval", 4, np.random.default_rng(3), seq_len=24)
    windows = np.lib.stride_tricks.sliding_window_view(ds.x_eval, 25)
    for x, y in zip(batch["x"], batch["y"], strict=True):
        assert (windows == np.concatenate([x, y[-1:]])).all(axis=1).any()
        np.testing.assert_array_equal(x[1:], y[:-1])


def test_lm_needs_seq_len_and_enough_tokens():
    ds = _toy_lm(n_train=10, n_eval=4)
    with pytest.raises(DatasetError, match="seq_len"):
        sample_batch(ds, "train", 2, np.random.default_rng(0))
    with pytest.raises(DatasetError, match="4 tokens"):
        sample_batch(ds, "eval", 2, np.random.default_rng(0), seq_len=4)
    sample_batch(ds, "eval", 2, np.random.default_rng(0), seq_len=3)


def test_bad_split_and_batch_size(digits):
    with pytest.raises(DatasetError, match="'test'"):
        sample_batch(digits, "test", 4, np.random.default_rng(0))
    with pytest.raises(DatasetError, match="batch_size"):
        sample_batch(digits, "train", 0, np.random.default_rng(0))


@pytest.mark.parametrize("batch_size", [1, 7, 23, 64])
def test_classify_eval_batches_cover_eval_once(batch_size):
    ds = _toy_classify()
    batches = list(eval_batches(ds, batch_size))
    assert len(batches) == -(-ds.num_eval // batch_size)
    assert all(b["x"].shape == (batch_size, 5) and b["y"].shape == (batch_size,) for b in batches)
    masks = np.concatenate([b["mask"] for b in batches])
    assert masks.dtype == np.float32 and masks.sum() == ds.num_eval
    real = masks == 1
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches])[real], ds.x_eval)
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in batches])[real], ds.y_eval)


def test_classify_eval_batches_on_digits(digits):
    batches = list(eval_batches(digits, 50))
    assert sum(float(b["mask"].sum()) for b in batches) == digits.num_eval
    assert len(list(eval_batches(digits, 50, max_batches=2))) == 2


def test_lm_eval_batches_are_consecutive_windows():
    ds = _toy_lm(n_eval=57)
    seq_len, batch_size = 5, 4
    batches = list(eval_batches(ds, batch_size, seq_len=seq_len))
    windows = (ds.num_eval - 1) // seq_len
    masks = np.concatenate([b["mask"] for b in batches])
    assert masks.sum() == windows and all(b["x"].shape == (batch_size, seq_len) for b in batches)
    assert all(b["mask"].all() for b in batches[:-1])
    real = masks == 1
    xs = np.concatenate([b["x"] for b in batches])[real].reshape(-1)
    ys = np.concatenate([b["y"] for b in batches])[real].reshape(-1)
    np.testing.assert_array_equal(xs, ds.x_eval[: windows * seq_len])
    np.testing.assert_array_equal(ys, ds.x_eval[1 : windows * seq_len + 1])
    assert len(list(eval_batches(ds, batch_size, seq_len=seq_len, max_batches=1))) == 1
    with pytest.raises(DatasetError, match="seq_len"):
        list(eval_batches(ds, batch_size))
