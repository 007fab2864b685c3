"""The data side of a run: a loaded dataset shaped for one model, batches by step number.

Batches depend only on (seed, step), so a resumed run sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zoo.configs import DataConfig
from zoo.data import CharTokenizer, Dataset, eval_batches, load_dataset, sample_batch
from zoo.data.dataset import TaskType, eval_chars, task_type
from zoo.data.public import declared_tokenizer
from zoo.data.users import dense_ids, group_rows
from zoo.errors import ZooError
from zoo.models.registry import DataFit, ModelConfig, get_config


@dataclass(frozen=True)
class Task:
    """A dataset plus the few facts needed to feed it to a model. What differs between a
    classifier and a language model is asked of the data's task type (``type``:
    :mod:`zoo.data.dataset`'s ``Classify`` or ``LanguageModel``), never of its name."""

    data: Dataset
    config: DataConfig
    seq_len: int | None  # LM context; None for classifiers
    row_shape: tuple[int, int] | None  # layout="rows": each example becomes [H, W]

    @property
    def type(self) -> TaskType:
        """The task's type: its batching, records, eval and metrics."""
        return self.data.task_type

    @property
    def num_train(self) -> int:
        """Examples for Poisson sampling: rows, or non-overlapping LM windows."""
        return self.type.num_records(self.data, self.seq_len)

    @property
    def row_bytes(self) -> int:
        """Bytes of one batch row's input: an LM's window of ``seq_len + 1`` tokens, or a
        classifier's features (their declared shape, never a count of records)."""
        x = self.data.x_train
        if self.seq_len is not None:
            return (self.seq_len + 1) * x.dtype.itemsize
        return int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize

    def user_groups(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(offsets, rows)`` of the training records by user (``data.user_column``;
        :func:`zoo.data.users.group_rows`), or None when the records name no users. A user
        with no record (an LM's text shorter than one window) is not among them."""
        users = self.type.record_users(self.data, self.seq_len)
        return None if users is None else group_rows(dense_ids(users))

    def shape_x(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(x.shape[0], *self.row_shape) if self.row_shape else x

    def train_batch(
        self, step: int, batch_size: int, seed: int, rows: slice = slice(None)
    ) -> dict[str, np.ndarray]:
        """The batch of ``step`` (its ``rows`` only: one process's share), a function of
        ``(seed, step)``. An LM reads ``batch_size`` windows at uniform random offsets."""
        rng = np.random.default_rng([seed, step])
        batch = sample_batch(self.data, "train", batch_size, rng, seq_len=self.seq_len, rows=rows)
        return {**batch, "x": self.shape_x(batch["x"])}

    def examples(self, indices: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Training examples by index (for Poisson-sampled DP batches). An LM's example ``i``
        is the window of ``seq_len + 1`` tokens from ``i * seq_len``: the record DP counts."""
        batch = self.type.examples(self.data, indices, mask, self.seq_len)
        return {**batch, "x": self.shape_x(batch["x"])}

    def eval_chars(self, windows: int) -> int:
        """Characters of the eval text the first ``windows`` eval windows predict (LM)."""
        return eval_chars(self.data, self.seq_len, windows)

    def eval_batches(self, batch_size: int, max_batches: int) -> Iterator[dict[str, np.ndarray]]:
        """The eval pass: a classifier's whole eval split, an LM's first ``max_batches``."""
        limit = self.type.eval_cap(max_batches)
        for batch in eval_batches(self.data, batch_size, seq_len=self.seq_len, max_batches=limit):
            yield {**batch, "x": self.shape_x(batch["x"])}

    def metrics(self, sums: dict) -> dict:
        """The reported eval metrics from ``zoo.train.engine.evaluate``'s sums: the loss and
        accuracy (classifier) or bits per character of the eval text (LM)."""
        return self.type.metrics(self.data, sums, self.seq_len)


def load_task(
    data: DataConfig,
    *,
    task: str,
    seed: int,
    tokenizer: CharTokenizer | None = None,
    max_len: int | None = None,
    private: bool = False,
) -> Task:
    """The ``[data]`` section's dataset loaded for ``task`` ("classify" or "lm": the model's
    ``cfg.task``) and shaped for it. ``seed`` shuffles a classifier's train/eval split;
    ``tokenizer`` is a checkpoint's (an LM keeps its vocabulary); ``max_len`` is the model's
    context, the LM window when ``data.seq_len`` is unset. ``private``: a DP run's load, which
    reads nothing off the records that shapes the model or what is printed (zoo.data.declared)."""
    dataset = load_dataset(
        data.dataset,
        task=task,
        seed=seed,
        eval_fraction=data.eval_fraction,
        classes=data.classes,
        text_column=data.text_column,
        label_column=data.label_column,
        tokenizer=declared_tokenizer(data.vocabulary, tokenizer) if task_type(task).tokenized else tokenizer,
        image_max=data.image_max,
        private=private,
        user_column=data.user_column,
    )
    seq_len = dataset.task_type.seq_len(data.seq_len or max_len)
    if seq_len is not None:
        _check_windows(data.dataset, seq_len, dataset, private)
    row_shape = None
    if data.layout == "rows":
        if not dataset.feature_shape or len(dataset.feature_shape) != 2:  # an LM has none
            raise ZooError(
                f"data.layout='rows' needs 2-D image features; {data.dataset!r} has "
                f"feature shape {dataset.feature_shape}"
            )
        row_shape = tuple(dataset.feature_shape)
    return Task(data=dataset, config=data, seq_len=seq_len, row_shape=row_shape)


def _check_windows(dataset: str, seq_len: int, data: Dataset, private: bool = False) -> None:
    """A window is ``seq_len + 1`` tokens; both splits must hold one (before any model exists).

    Under DP (``private``) the count of training tokens is not released: it includes users too
    short to give one window, so one such user would change it. A train split of no window is
    refused by the plan, by the public number of units alone (:func:`zoo.dp.validate.check_units`),
    and a short eval split here without its count."""
    if private:
        if seq_len + 1 > data.num_eval:
            raise ZooError(
                f"data.seq_len={seq_len} is longer than the eval split of {dataset!r}: it holds no "
                "window of seq_len + 1 tokens; lower data.seq_len or raise data.eval_fraction"
            )
        return
    shortest = min(data.num_train, data.num_eval)
    if seq_len + 1 <= shortest:
        return
    held = f"{dataset!r} has {data.num_train:,} train and {data.num_eval:,} eval tokens"
    if shortest >= 2:
        raise ZooError(
            f"data.seq_len={seq_len} is longer than the data: {held}, and a window takes seq_len + 1; "
            f"use data.seq_len <= {shortest - 1:,}"
        )
    split = "train" if data.num_train < 2 else "eval"
    more = (
        "write the store again with more text or another zoo tokenize --eval-fraction / --split"
        if data.store is not None
        else "give it more text, or change data.eval_fraction"
    )
    raise ZooError(
        f"the {split} split is too short for any window: {held}, and the shortest window "
        f"(data.seq_len=1) takes 2; {more}"
    )


def fit_model_to_task(cfg: ModelConfig, task: Task, preset: str, overrides: dict) -> ModelConfig:
    """``cfg`` (``preset`` with ``overrides`` applied: ``Recipe.model_config``) with the sizes
    the data dictates (vocab, classes, input width); explicit overrides are kept or refused.
    A ``data.seq_len`` longer than the model's context is refused unless ``model.max_len``
    is set too: attention's memory grows with its square."""
    if task.type is not cfg.task_type:  # a caller's mismatch: run.py loads the data for cfg.task
        raise ZooError(
            f"model {preset!r} is a {cfg.task!r} model; {task.config.dataset!r} was loaded as {task.data.task!r}"
        )
    context = getattr(cfg, "max_len", None)
    if task.seq_len and context and task.seq_len > context and "max_len" not in overrides:
        raise ZooError(
            f"data.seq_len={task.seq_len} is longer than the context of {preset!r} (max_len={context}); "
            f"lower data.seq_len, or set model.max_len={task.seq_len} too (attention's memory "
            "grows with its square)"
        )
    fit = DataFit(
        task=task.data.task,
        dataset=task.config.dataset,
        **task.type.fit_sizes(task.data),
        seq_len=task.seq_len,
        row_shape=task.row_shape,
    )
    try:
        fitted = cfg.fit_to_data(fit)
    except ZooError as err:
        raise ZooError(f"model {preset!r}: {err}") from None
    fitted = _respect_explicit(preset, overrides, fitted)
    return get_config(cfg, **{k: v for k, v in fitted.items() if getattr(cfg, k) != v})


# Sizes that may be larger than the data needs: a longer context or a larger vocabulary
# than the data uses is a valid model, a smaller one is not.
_AT_LEAST = ("max_len", "vocab_size")


def _respect_explicit(preset: str, overrides: dict, fitted: dict) -> dict:
    """``fitted`` sizes, except those the recipe set explicitly: those are kept when they fit
    the data and refused when they do not. An explicit value is never silently replaced."""
    out = dict(fitted)
    for key, needed in fitted.items():
        if key not in overrides:
            continue
        value = overrides[key]
        if key in _AT_LEAST and value >= needed:
            out[key] = value
        elif value != needed:
            need = f"at least {needed}" if key in _AT_LEAST else str(needed)
            raise ZooError(
                f"model.{key}={value} was set explicitly, but the data needs {key} = {need} for "
                f"{preset!r}; drop the override or set model.{key} to {need}"
                + (" (or lower data.seq_len)" if key == "max_len" else "")
            )
    return out
