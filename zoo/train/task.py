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

    def train_batch(self, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, step])
        batch = sample_batch(self.data, "train", batch_size, rng, seq_len=self.seq_len)
        return {**batch, "x": self.shape_x(batch["x"])}

    def examples(self, indices: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Training examples by index (for Poisson-sampled DP batches)."""
        if self.is_lm:
            starts = indices.astype(np.int64) * self.seq_len
            window = self.data.x_train[starts[:, None] + np.arange(self.seq_len + 1)]
            return {"x": window[:, :-1], "y": window[:, 1:], "mask": mask}
        return {"x": self.shape_x(self.data.x_train[indices]), "y": self.data.y_train[indices], "mask": mask}

    def eval_batches(self, batch_size: int, max_batches: int) -> Iterator[dict[str, np.ndarray]]:
        limit = max_batches if self.is_lm else None
        for batch in eval_batches(self.data, batch_size, seq_len=self.seq_len, max_batches=limit):
            yield {**batch, "x": self.shape_x(batch["x"])}


def load_task(
    config: DataConfig,
    kind: str,
    seed: int,
    tokenizer: CharTokenizer | None = None,
    max_len: int | None = None,
) -> Task:
    data = load_dataset(
        config.dataset,
        task=kind,
        seed=seed,
        eval_fraction=config.eval_fraction,
        classes=config.classes,
        text_column=config.text_column,
        label_column=config.label_column,
        tokenizer=declared_tokenizer(config.vocabulary, tokenizer) if kind == "lm" else tokenizer,
    )
    seq_len = (config.seq_len or max_len) if data.task == "lm" else None
    row_shape = None
    if config.layout == "rows":
        if data.task == "lm" or not data.feature_shape or len(data.feature_shape) != 2:
            raise ZooError(
                f"data.layout='rows' needs 2-D image features; {config.dataset!r} has "
                f"feature shape {data.feature_shape}"
            )
        row_shape = tuple(data.feature_shape)
    return Task(data=data, config=config, seq_len=seq_len, row_shape=row_shape)


def fit_model_to_task(cfg: ModelConfig, task: Task, preset: str, overrides: dict) -> ModelConfig:
    """``cfg`` (``preset`` with ``overrides`` applied: ``Recipe.model_config``) with the sizes
    the data dictates (vocab, classes, input width); explicit overrides are kept or refused."""
    lm = task.is_lm
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
