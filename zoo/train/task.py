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
from zoo.data.batches import read_windows
from zoo.data.public import declared_tokenizer
from zoo.errors import ZooError
from zoo.models.registry import DataFit, ModelConfig, get_config


@dataclass(frozen=True)
class Task:
    """A dataset plus the few facts needed to feed it to a model."""

    data: Dataset
    config: DataConfig
    seq_len: int | None  # LM context; None for classifiers
    row_shape: tuple[int, int] | None  # layout="rows": each example becomes [H, W]

    @property
    def is_lm(self) -> bool:
        return self.data.task == "lm"

    @property
    def num_train(self) -> int:
        """Examples for Poisson sampling: rows, or non-overlapping LM windows."""
        if self.is_lm:
            return (self.data.x_train.shape[0] - 1) // self.seq_len
        return self.data.num_train

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
        if self.is_lm:
            starts = indices.astype(np.int64) * self.seq_len
            window = read_windows(self.data.x_train, starts, self.seq_len + 1, self.data.vocab_size)
            return {"x": window[:, :-1], "y": window[:, 1:], "mask": mask}
        return {"x": self.shape_x(self.data.x_train[indices]), "y": self.data.y_train[indices], "mask": mask}

    def eval_chars(self, windows: int) -> int:
        """Characters of the eval text that the first ``windows`` eval windows predict: their
        targets are one span of tokens. A byte vocabulary counts the bytes that begin a UTF-8
        character; other tokenizers decode the span (a character vocabulary: one per token)."""
        ids = np.array(self.data.x_eval[1 : 1 + windows * self.seq_len], np.int64)  # a copy
        tokenizer = self.data.tokenizer
        ids[ids >= tokenizer.vocab_size] = 0  # as the batches read them (zoo.data.batches.read_windows)
        if not getattr(tokenizer, "has_text", True):  # ids:N: one character per token
            return int(ids.size)
        if getattr(tokenizer, "byte_level", False):  # id = byte + 1; 0 (<unk>) counts as one
            return int((((ids - 1) & 0xC0) != 0x80).sum())
        return len(tokenizer.decode(ids))

    def eval_batches(self, batch_size: int, max_batches: int) -> Iterator[dict[str, np.ndarray]]:
        limit = max_batches if self.is_lm else None
        for batch in eval_batches(self.data, batch_size, seq_len=self.seq_len, max_batches=limit):
            yield {**batch, "x": self.shape_x(batch["x"])}


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
        tokenizer=declared_tokenizer(data.vocabulary, tokenizer) if task == "lm" else tokenizer,
        image_max=data.image_max,
        private=private,
    )
    seq_len = (data.seq_len or max_len) if dataset.task == "lm" else None
    if seq_len is not None:
        _check_windows(data.dataset, seq_len, dataset)
    row_shape = None
    if data.layout == "rows":
        if dataset.task == "lm" or not dataset.feature_shape or len(dataset.feature_shape) != 2:
            raise ZooError(
                f"data.layout='rows' needs 2-D image features; {data.dataset!r} has "
                f"feature shape {dataset.feature_shape}"
            )
        row_shape = tuple(dataset.feature_shape)
    return Task(data=dataset, config=data, seq_len=seq_len, row_shape=row_shape)


def _check_windows(dataset: str, seq_len: int, data: Dataset) -> None:
    """A window is ``seq_len + 1`` tokens; both splits must hold one (before any model exists)."""
    shortest = min(data.num_train, data.num_eval)
    if seq_len + 1 > shortest:
        raise ZooError(
            f"data.seq_len={seq_len} is longer than the data: {dataset!r} has {data.num_train:,} "
            f"train and {data.num_eval:,} eval tokens, and a window takes seq_len + 1; use "
            f"data.seq_len <= {shortest - 1:,}"
        )


def fit_model_to_task(cfg: ModelConfig, task: Task, preset: str, overrides: dict) -> ModelConfig:
    """``cfg`` (``preset`` with ``overrides`` applied: ``Recipe.model_config``) with the sizes
    the data dictates (vocab, classes, input width); explicit overrides are kept or refused.
    A ``data.seq_len`` longer than the model's context is refused unless ``model.max_len``
    is set too: attention's memory grows with its square."""
    lm = task.is_lm
    context = getattr(cfg, "max_len", None)
    if lm and context and task.seq_len > context and "max_len" not in overrides:
        raise ZooError(
            f"data.seq_len={task.seq_len} is longer than the context of {preset!r} (max_len={context}); "
            f"lower data.seq_len, or set model.max_len={task.seq_len} too (attention's memory "
            "grows with its square)"
        )
    fit = DataFit(
        task=task.data.task,
        dataset=task.config.dataset,
        num_features=0 if lm else task.data.num_features,
        num_classes=0 if lm else task.data.num_classes,
        vocab_size=task.data.vocab_size if lm else 0,
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
