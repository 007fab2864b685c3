"""zoo.train.task: a loaded task asks its type (zoo.data.dataset) for batches, records, eval
and metrics; each task's loss against a float64 NumPy reference; the model is fitted to it."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.numerics import assert_close
from zoo import recipes
from zoo.data import CharTokenizer, Dataset
from zoo.errors import ZooError
from zoo.losses import masked_mean, per_example_loss
from zoo.train.task import Task, fit_model_to_task, load_task

SEQ = 8


def _classify_task(row_shape=(2, 3)) -> Task:
    rng = np.random.default_rng(0)
    ds = Dataset(
        "toy",
        "classify",
        rng.uniform(size=(30, 6)).astype(np.float32),
        rng.integers(0, 5, 30).astype(np.int32),
        rng.uniform(size=(9, 6)).astype(np.float32),
        rng.integers(0, 5, 9).astype(np.int32),
        num_classes=5,
        feature_shape=(2, 3),
    )
    config = recipes.load_recipe("digits-mlp").data
    return Task(data=ds, config=config, seq_len=None, row_shape=row_shape)


def _lm_task() -> Task:
    text = "".join(chr(0x100 + i) for i in range(140))
    tok = CharTokenizer.fit(text)
    ids = tok.encode(text)
    ds = Dataset("toy-lm", "lm", ids[:100], None, ids[100:], None, tokenizer=tok)
    return Task(data=ds, config=recipes.load_recipe("python-docs-lm").data, seq_len=SEQ, row_shape=None)


def _ce64(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """float64 cross-entropy per example, averaged over its label positions."""
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    ce = -logp[np.arange(z.shape[0]), labels.reshape(-1)]
    return ce.reshape(labels.shape[0], -1).mean(axis=1)


@pytest.mark.numerics
@pytest.mark.parametrize("make", [_classify_task, _lm_task], ids=["classify", "lm"])
def test_each_tasks_loss_on_its_batches_matches_float64_numpy(make):
    task = make()
    batch = task.train_batch(3, 6, seed=1)
    classes = task.data.num_classes if not task.type.tokenized else task.data.vocab_size
    logits = np.random.default_rng(2).normal(0, 3, (*batch["y"].shape, classes)).astype(np.float32)
    assert batch["y"].ndim == task.type.label_rank
    losses = np.asarray(per_example_loss(jnp.asarray(logits), jnp.asarray(batch["y"])))
    expected = _ce64(logits, batch["y"])
    assert_close(losses, expected, n=classes, what=f"{task.data.task} per-example loss")
    mask = np.array([1, 0, 1, 1, 0, 1], np.float32)
    mean = float(masked_mean(jnp.asarray(losses), jnp.asarray(mask)))
    assert_close(mean, (expected * mask).sum() / mask.sum(), n=classes * 6, what="masked mean")


def test_a_classifier_task_shapes_its_rows_and_reads_its_whole_eval_split():
    task = _classify_task()
    assert task.num_train == 30 and not task.type.tokenized
    batch = task.train_batch(0, 4, seed=0)
    assert batch["x"].shape == (4, 2, 3)
    ex = task.examples(np.array([2, 7]), np.ones(2, np.float32))
    np.testing.assert_array_equal(ex["x"], task.data.x_train[[2, 7]].reshape(2, 2, 3))
    got = list(task.eval_batches(batch_size=2, max_batches=1))  # max_batches is an LM's cap
    assert len(got) == 5 and sum(b["mask"].sum() for b in got) == 9 and got[0]["x"].shape == (2, 2, 3)
    sums = {"eval_loss": 0.5, "eval_accuracy": 0.75, "eval_count": 9.0}
    assert task.metrics(sums) == {"eval_loss": 0.5, "eval_accuracy": 0.75}


def test_an_lm_task_reads_windows_and_reports_bits_per_character():
    task = _lm_task()
    assert task.num_train == 99 // SEQ and task.type.tokenized
    ex = task.examples(np.array([1]), np.ones(1, np.float32))
    np.testing.assert_array_equal(ex["x"][0], np.asarray(task.data.x_train)[SEQ : 2 * SEQ])
    got = list(task.eval_batches(batch_size=1, max_batches=2))
    assert len(got) == 2 and got[0]["x"].shape == (1, SEQ)
    sums = {"eval_loss": 2.0, "eval_accuracy": 0.1, "eval_count": 2.0}
    # 2 windows predict 2 * SEQ characters (one per token here): bits = loss * tokens / ln 2
    assert task.metrics(sums) == {"eval_loss": 2.0, "eval_bits_per_char": pytest.approx(2.0 / np.log(2))}
    assert task.eval_chars(2) == 2 * SEQ


def test_an_lm_tasks_users_own_the_windows_of_their_segments():
    """Users of 20, 5 and 30 tokens give 2, 0 and 3 windows of SEQ + 1: the groups are the two
    users with windows (the one shorter than a window is not a user), each holding its own.
    Planted: grouping the window owners without renumbering leaves an empty user in the count."""
    base = _lm_task().data
    ids = np.arange(55, dtype=np.int32) % base.vocab_size
    bounds = np.array([0, 20, 25, 55])
    users = np.array([0, 1, 2], np.int32)
    ds = Dataset(
        "toy-lm",
        "lm",
        ids,
        None,
        base.x_eval,
        None,
        tokenizer=base.tokenizer,
        users_train=users,
        segments_train=bounds,
    )
    task = Task(data=ds, config=recipes.load_recipe("python-docs-lm").data, seq_len=SEQ, row_shape=None)
    assert task.num_train == 5
    offsets, rows = task.user_groups()
    assert offsets.tolist() == [0, 2, 5] and rows.tolist() == [0, 1, 2, 3, 4]
    ex = task.examples(np.array([1, 2]), np.ones(2, np.float32))
    np.testing.assert_array_equal(ex["x"], np.stack([ids[SEQ : 2 * SEQ], ids[25 : 25 + SEQ]]))


def test_the_model_is_fitted_to_its_tasks_sizes():
    digits = load_task(recipes.load_recipe("digits-mlp").data, task="classify", seed=0)
    cfg = fit_model_to_task(zoo.get_config("mlp-s"), digits, "mlp-s", {})
    assert (cfg.d_in, cfg.num_classes) == (64, 10)
    lm = _lm_task()
    preset = next(n for n, c in zoo.PRESETS.items() if c.task_type.tokenized)
    cfg = fit_model_to_task(zoo.get_config(preset), lm, preset, {})
    assert cfg.vocab_size == lm.data.vocab_size


def test_a_model_of_another_task_is_refused():
    lm_preset = next(n for n, c in zoo.PRESETS.items() if c.task_type.tokenized)
    with pytest.raises(ZooError, match=r"is a 'lm' model; 'digits' was loaded as 'classify'"):
        fit_model_to_task(zoo.get_config(lm_preset), _classify_task(row_shape=None), lm_preset, {})
    lm = dataclasses.replace(_lm_task())
    with pytest.raises(ZooError, match=r"is a 'classify' model; .* was loaded as 'lm'"):
        fit_model_to_task(zoo.get_config("mlp-s"), lm, "mlp-s", {})


def test_a_split_too_short_for_any_window_is_refused_without_a_seq_len_hint(tmp_path):
    from zoo.data.tokens.build import tokenize

    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("x")  # the first document: the eval split, 1 token
    (tmp_path / "text" / "b.txt").write_text("hello world " * 50)
    tokenize(f"text:{tmp_path / 'text'}", tmp_path / "store", "bytes", eval_fraction=0.5, split="documents")
    data = dataclasses.replace(
        recipes.load_recipe("python-docs-lm").data, dataset=f"tokens:{tmp_path / 'store'}"
    )
    with pytest.raises(ZooError) as refused:
        load_task(data, task="lm", seed=0, max_len=16)
    said = str(refused.value)
    assert "the eval split is too short for any window" in said and "600 train and 1 eval tokens" in said
    assert "seq_len <=" not in said and "zoo tokenize --eval-fraction" in said


def test_under_dp_a_short_lm_is_refused_without_a_token_count():
    """Issue 60, item 3: the refusal printed the training tokens, which count users too short
    for one window; under DP a train split of no window is left to the plan's N = 0 line, and
    a short eval split is refused without its count. Outside DP both counts help, and stay."""
    from types import SimpleNamespace

    from zoo.errors import ZooError
    from zoo.train.task import _check_windows

    short = SimpleNamespace(num_train=60, num_eval=5_061)
    _check_windows("text:DIR", 64, short, private=True)  # not refused here: N = 0 is the plan's
    with pytest.raises(ZooError, match="60 train and 5,061 eval tokens"):
        _check_windows("text:DIR", 64, short, private=False)
    with pytest.raises(ZooError, match="eval split") as refusal:
        _check_windows("text:DIR", 64, SimpleNamespace(num_train=91, num_eval=43), private=True)
    assert not any(count in str(refusal.value) for count in ("91", "43"))
