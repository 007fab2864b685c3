"""The task types of zoo.data.dataset, each alone: what a classifier's labelled arrays and an
LM's token stream hold, read, count and report (batch sampling itself: test_batches.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zoo.data import CharTokenizer, Dataset, DatasetError, eval_batches
from zoo.data.dataset import TASKS, Classify, LanguageModel, task_type

SEQ = 8


def _classify(n_train: int = 30, n_eval: int = 11, rows: int = 2, cols: int = 3) -> Dataset:
    rng = np.random.default_rng(0)
    return Dataset(
        name="toy",
        task="classify",
        x_train=rng.uniform(-1, 2, size=(n_train, rows * cols)).astype(np.float32),
        y_train=rng.integers(0, 4, size=n_train).astype(np.int32),
        x_eval=rng.uniform(size=(n_eval, rows * cols)).astype(np.float32),
        y_eval=rng.integers(0, 4, size=n_eval).astype(np.int32),
        num_classes=4,
        feature_shape=(rows, cols),
    )


def _lm(n_train: int = 85, n_eval: int = 43) -> Dataset:
    """Distinct tokens, so a token's value says where in the stream it stands."""
    text = "".join(chr(0x100 + i) for i in range(n_train + n_eval))
    tok = CharTokenizer.fit(text)
    ids = tok.encode(text)
    return Dataset("toy-lm", "lm", ids[:n_train], None, ids[n_train:], None, tokenizer=tok)


def test_the_table_names_each_task_once_and_datasets_find_theirs():
    assert list(TASKS) == ["classify", "lm"]
    assert all(task_type(name).name == name for name in TASKS)
    assert _classify().task_type is TASKS["classify"] and isinstance(_classify().task_type, Classify)
    assert _lm().task_type is TASKS["lm"] and isinstance(_lm().task_type, LanguageModel)
    assert [t.name for t in TASKS.values() if t.tokenized] == ["lm"]


@pytest.mark.parametrize("name", ["clasify", "regression", 3, None])
def test_an_unknown_task_is_refused_naming_the_valid_ones(name):
    with pytest.raises(DatasetError, match=r"unknown task .* Valid: classify, lm\.") as err:
        task_type(name)
    assert ("Did you mean 'classify'?" in str(err.value)) == (name == "clasify")


def test_each_task_checks_its_own_arrays():
    ds = _classify()
    with pytest.raises(DatasetError, match="labels must be int32"):
        Dataset("bad", "classify", ds.x_train, ds.y_train.astype(np.int64), ds.x_eval, ds.y_eval, 4)
    with pytest.raises(DatasetError, match="lm datasets have no train labels"):
        Dataset(
            "bad", "lm", _lm().x_train, np.zeros(3, np.int32), _lm().x_eval, None, tokenizer=_lm().tokenizer
        )
    with pytest.raises(DatasetError, match="tokens must be int32"):
        Dataset("bad", "lm", ds.x_train, None, ds.x_eval, None, tokenizer=_lm().tokenizer)
    assert "num_classes=4, num_features=6, feature_shape=(2, 3)" in repr(ds)
    assert repr(_lm()).endswith(f"vocab_size={_lm().vocab_size})")


def test_a_classifier_counts_rows_and_reads_them_by_index():
    ds, kind = _classify(), TASKS["classify"]
    assert kind.num_records(ds, None) == 30 and kind.seq_len(SEQ) is None and kind.label_rank == 1
    idx, mask = np.array([4, 0, 29, 4]), np.array([1, 1, 1, 0], np.float32)
    ex = kind.examples(ds, idx, mask, None)
    np.testing.assert_array_equal(ex["x"], np.stack([ds.x_train[i] for i in idx.tolist()]))
    np.testing.assert_array_equal(ex["y"], [ds.y_train[i] for i in idx.tolist()])
    assert ex["mask"] is mask
    assert kind.fit_sizes(ds) == {"num_features": 6, "num_classes": 4, "vocab_size": 0}


def test_an_lm_counts_non_overlapping_windows_and_reads_window_i_from_i_times_seq():
    ds, kind = _lm(), TASKS["lm"]
    stream = np.asarray(ds.x_train)
    assert kind.num_records(ds, SEQ) == len(range(0, len(stream) - SEQ, SEQ)) == 10
    assert kind.seq_len(SEQ) == SEQ and kind.label_rank == 2
    ex = kind.examples(ds, np.array([0, 9, 3]), np.ones(3, np.float32), SEQ)
    for row, i in enumerate([0, 9, 3]):
        np.testing.assert_array_equal(ex["x"][row], stream[i * SEQ : i * SEQ + SEQ])
        np.testing.assert_array_equal(ex["y"][row], stream[i * SEQ + 1 : i * SEQ + SEQ + 1])
    assert kind.fit_sizes(ds) == {"num_features": 0, "num_classes": 0, "vocab_size": ds.vocab_size}


def test_a_classifier_eval_pass_is_every_eval_row_once_and_is_never_capped():
    ds, kind = _classify(), TASKS["classify"]
    assert kind.eval_cap(2) is None
    got = list(eval_batches(ds, 4))
    masks = np.concatenate([b["mask"] for b in got])
    assert masks.sum() == ds.num_eval and len(got) == math.ceil(ds.num_eval / 4)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in got])[masks > 0], ds.x_eval)
    assert (got[-1]["x"][got[-1]["mask"] == 0] == 0).all() and (got[-1]["y"][got[-1]["mask"] == 0] == 0).all()


def test_an_lm_eval_pass_reads_consecutive_windows_and_is_capped():
    ds, kind = _lm(), TASKS["lm"]
    assert kind.eval_cap(2) == 2
    got = list(eval_batches(ds, 2, seq_len=SEQ))
    windows = (ds.num_eval - 1) // SEQ
    masks = np.concatenate([b["mask"] for b in got])
    assert masks.sum() == windows
    targets = np.concatenate([b["y"] for b in got])[masks > 0].reshape(-1)
    np.testing.assert_array_equal(targets, np.asarray(ds.x_eval)[1 : 1 + windows * SEQ])


def test_a_classifier_reports_its_accuracy_and_an_lm_its_bits_per_character():
    sums = {"eval_loss": 1.5, "eval_accuracy": 0.25, "eval_count": 3.0}
    assert TASKS["classify"].metrics(_classify(), sums, None) == {"eval_loss": 1.5, "eval_accuracy": 0.25}
    ds = _lm()
    got = TASKS["lm"].metrics(ds, sums, SEQ)
    # 3 windows predict 3 * SEQ characters (one per token of a character vocabulary)
    assert list(got) == ["eval_loss", "eval_bits_per_char"]
    assert got["eval_bits_per_char"] == pytest.approx(1.5 * 3 * SEQ / math.log(2) / (3 * SEQ), rel=1e-12)


def test_uniform_examples_are_inside_each_tasks_domain():
    rng = np.random.default_rng(0)
    ds = _classify()
    ex = TASKS["classify"].uniform_examples(ds, rng, 50, None)
    assert ex["x"].shape == (50, 6) and ex["y"].shape == (50,)
    assert (ex["x"] >= ds.x_train.min(0)).all() and (ex["x"] <= ds.x_train.max(0)).all()
    assert set(ex["y"].tolist()) <= set(range(4)) and ex["y"].dtype == np.int32
    lm = _lm()
    ex = TASKS["lm"].uniform_examples(lm, rng, 50, SEQ)
    assert ex["x"].shape == ex["y"].shape == (50, SEQ)
    np.testing.assert_array_equal(ex["x"][:, 1:], ex["y"][:, :-1])
    assert 0 <= ex["x"].min() and ex["y"].max() < lm.vocab_size


def test_only_a_classifier_has_features_and_only_an_lm_a_vocabulary():
    with pytest.raises(DatasetError, match="num_features is for classify"):
        _ = _lm().num_features
    with pytest.raises(DatasetError, match="vocab_size is for lm"):
        _ = _classify().vocab_size
