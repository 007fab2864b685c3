"""The in-memory dataset every loader returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zoo.data.errors import DatasetError
from zoo.data.tokenizer import CharTokenizer

TASKS = ("classify", "lm")
TOKEN_DTYPES = (np.dtype(np.int32), np.dtype(np.uint16), np.dtype(np.uint32))


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A train/eval split held as read-only numpy arrays.

    classify: ``x_*`` float32 ``[N, F]`` (flattened features in [0, 1] for images), ``y_*`` int32
    ``[N]`` in ``[0, num_classes)``; ``feature_shape`` is the unflattened shape of one example
    (e.g. ``(8, 8)``) or None for tabular data; ``tokenizer`` is None.

    lm: ``x_*`` ``[T]`` token ids (one contiguous stream per split), ``y_*`` None,
    ``num_classes``/``feature_shape`` None, ``tokenizer`` the vocabulary that produced the ids.
    The ids are int32 in memory, or uint16/uint32 memory-mapped from a token store (``store``,
    :mod:`zoo.data.tokens`): read them by window (``zoo.data.batches``), never whole.
    """

    name: str
    task: str
    x_train: np.ndarray
    y_train: np.ndarray | None
    x_eval: np.ndarray
    y_eval: np.ndarray | None
    num_classes: int | None = None
    feature_shape: tuple[int, ...] | None = None
    tokenizer: CharTokenizer | None = None
    store: object | None = None  # the zoo.data.tokens.TokenStore the lm splits are mapped from
    notice: str | None = None  # one line a run says about its data when it starts (Source.notice)

    @classmethod
    def from_store(cls, name: str, store) -> Dataset:
        """The lm dataset whose splits are ``store`` 's memory-mapped ids."""
        return cls(name, "lm", store.train, None, store.eval, None, tokenizer=store.tokenizer, store=store)

    def __post_init__(self) -> None:
        for field in ("x_train", "y_train", "x_eval", "y_eval"):
            object.__setattr__(self, field, _frozen(getattr(self, field)))
        if self.task == "classify":
            self._check_classify()
        elif self.task == "lm":
            self._check_lm()
        else:
            raise DatasetError(f"unknown task {self.task!r}. Valid: {', '.join(TASKS)}.")

    def _check_classify(self) -> None:
        for x, y, split in ((self.x_train, self.y_train, "train"), (self.x_eval, self.y_eval, "eval")):
            if x.dtype != np.float32 or x.ndim != 2:
                raise DatasetError(f"{split} features must be float32 [N, F], got {x.dtype} {x.shape}")
            if y is None or y.dtype != np.int32 or y.shape != (x.shape[0],):
                got = None if y is None else f"{y.dtype} {y.shape}"
                raise DatasetError(f"{split} labels must be int32 [{x.shape[0]}], got {got}")
        if self.x_train.shape[1] != self.x_eval.shape[1]:
            raise DatasetError("train and eval features differ in width")
        if self.num_classes is None or self.num_classes < 1:
            raise DatasetError(f"classify needs num_classes >= 1, got {self.num_classes}")
        if self.feature_shape is not None and int(np.prod(self.feature_shape)) != self.x_train.shape[1]:
            width = self.x_train.shape[1]
            raise DatasetError(f"feature_shape {self.feature_shape} does not match {width} features")

    def _check_lm(self) -> None:
        for x, y, split in ((self.x_train, self.y_train, "train"), (self.x_eval, self.y_eval, "eval")):
            if x.dtype not in TOKEN_DTYPES or x.ndim != 1:
                raise DatasetError(
                    f"{split} tokens must be int32 (or uint16/uint32) [T], got {x.dtype} {x.shape}"
                )
            if y is not None:
                raise DatasetError(f"lm datasets have no {split} labels (targets are shifted inputs)")
        if self.tokenizer is None:
            raise DatasetError("lm datasets need a tokenizer")

    @property
    def num_train(self) -> int:
        """Training examples (classify) or training tokens (lm)."""
        return int(self.x_train.shape[0])

    @property
    def num_eval(self) -> int:
        """Eval examples (classify) or eval tokens (lm)."""
        return int(self.x_eval.shape[0])

    @property
    def num_features(self) -> int:
        """Width F of the flattened features (classify only)."""
        if self.task != "classify":
            raise DatasetError(f"{self.name!r} is an lm dataset; num_features is for classify")
        return int(self.x_train.shape[1])

    @property
    def vocab_size(self) -> int:
        """Tokenizer vocabulary size, including the reserved unknown id 0 (lm only)."""
        if self.tokenizer is None:
            raise DatasetError(f"{self.name!r} is a classify dataset; vocab_size is for lm")
        return self.tokenizer.vocab_size

    def __repr__(self) -> str:
        if self.task == "classify":
            extra = (
                f"num_classes={self.num_classes}, num_features={self.num_features}, "
                f"feature_shape={self.feature_shape}"
            )
        else:
            extra = f"vocab_size={self.vocab_size}"
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, num_train={self.num_train}, "
            f"num_eval={self.num_eval}, {extra})"
        )
