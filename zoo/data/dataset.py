"""The in-memory dataset every loader returns, and the tasks it serves, as types: labelled
arrays (``classify``) and a token stream (``lm``).

A task type owns what differs between the two on the data side: the arrays a dataset of it
holds, how a random batch, an eval pass and a training record by index are read
(:mod:`zoo.data.batches` holds the readers), the records DP counts, the labels' shape, the
sizes a model is fitted to, and how the eval sums become the reported metrics. Both tasks
share one loss (:func:`zoo.losses.per_example_loss`, a mean over the label positions: one for
a classifier, ``seq_len`` for an LM) and one set of eval sums (``zoo.train.engine.evaluate``).

Callers ask the type (``ds.task_type``, ``cfg.task_type``, :func:`task_type`), never compare
task names; :data:`TASKS` is the table, by name.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from zoo.data import batches, windows
from zoo.data.errors import DatasetError
from zoo.data.tokenizer import CharTokenizer

TOKEN_DTYPES = (np.dtype(np.int32), np.dtype(np.uint16), np.dtype(np.uint32))
MakeBatch = Callable[[np.ndarray, int], dict]  # (row indices, real rows) -> an eval batch


class TaskType:
    """The protocol of a task; :class:`Classify` and :class:`LanguageModel` implement it."""

    name: ClassVar[str] = ""
    tokenized: ClassVar[bool] = False  # inputs are token ids read through a tokenizer
    options: ClassVar[tuple[str, ...]] = ()  # the load_dataset arguments only this task takes
    label_rank: ClassVar[int] = 1  # labels [B] (1) or [B, T] (2)

    def check(self, ds: Dataset) -> None:
        """Raise ``DatasetError`` when ``ds``'s arrays are not this task's shapes."""
        raise NotImplementedError

    def describe(self, ds: Dataset) -> str:
        """The sizes ``repr(ds)`` shows."""
        raise NotImplementedError

    def seq_len(self, requested: int | None) -> int | None:
        """The training window for a ``requested`` length (None: the task has no windows)."""
        return None

    def sample(self, ds: Dataset, split: str, batch_size: int, rng, seq_len, rows: slice) -> dict:
        """One random batch of ``split`` (:func:`zoo.data.batches.sample_batch`)."""
        raise NotImplementedError

    def eval_source(self, ds: Dataset, seq_len: int | None) -> tuple[int, MakeBatch]:
        """``(rows, make)``: the eval pass's rows and the batch of given rows, padding masked."""
        raise NotImplementedError

    def eval_cap(self, max_batches: int) -> int | None:
        """How many eval batches a run reads (None: the whole eval split)."""
        return None

    def num_records(self, ds: Dataset, seq_len: int | None) -> int:
        """Training records: what Poisson sampling draws and DP counts."""
        return ds.num_train

    def record_users(self, ds: Dataset, seq_len: int | None) -> np.ndarray | None:
        """The user of each training record, in record order (``data.user_column``), or None
        when the data name no users."""
        return ds.users_train

    def examples(self, ds: Dataset, indices: np.ndarray, mask: np.ndarray, seq_len) -> dict:
        """Training records by index (a Poisson-sampled DP batch)."""
        raise NotImplementedError

    def fit_sizes(self, ds: Dataset) -> dict[str, int]:
        """``num_features``, ``num_classes`` and ``vocab_size`` a model is fitted to (0: unused)."""
        raise NotImplementedError

    def metrics(self, ds: Dataset, sums: dict, seq_len: int | None) -> dict:
        """The reported eval metrics from ``zoo.train.engine.evaluate``'s ``eval_loss``,
        ``eval_accuracy`` and ``eval_count``: the loss and this task's own measure."""
        raise NotImplementedError

    def uniform_examples(self, ds: Dataset, rng: np.random.Generator, num: int, seq_len) -> dict:
        """``num`` examples drawn uniformly over the input domain (the audit's canaries)."""
        raise NotImplementedError


def _without(sums: dict, *keys: str) -> dict:
    return {k: v for k, v in sums.items() if k not in keys}


class Classify(TaskType):
    """Labelled arrays: ``x_*`` float32 ``[N, F]`` (flattened features), ``y_*`` int32 ``[N]``
    in ``[0, num_classes)``; ``feature_shape`` the unflattened shape of one example, or None."""

    name = "classify"
    options = ("classes",)

    def check(self, ds: Dataset) -> None:
        for x, y, split in ((ds.x_train, ds.y_train, "train"), (ds.x_eval, ds.y_eval, "eval")):
            if x.dtype != np.float32 or x.ndim != 2:
                raise DatasetError(f"{split} features must be float32 [N, F], got {x.dtype} {x.shape}")
            if y is None or y.dtype != np.int32 or y.shape != (x.shape[0],):
                got = None if y is None else f"{y.dtype} {y.shape}"
                raise DatasetError(f"{split} labels must be int32 [{x.shape[0]}], got {got}")
        if ds.x_train.shape[1] != ds.x_eval.shape[1]:
            raise DatasetError("train and eval features differ in width")
        if ds.num_classes is None or ds.num_classes < 1:
            raise DatasetError(f"classify needs num_classes >= 1, got {ds.num_classes}")
        if ds.feature_shape is not None and int(np.prod(ds.feature_shape)) != ds.x_train.shape[1]:
            width = ds.x_train.shape[1]
            raise DatasetError(f"feature_shape {ds.feature_shape} does not match {width} features")
        if ds.segments_train is not None:
            raise DatasetError("classify datasets have no segments: a row is a record")
        if ds.users_train is not None and ds.users_train.shape != (ds.num_train,):
            raise DatasetError(f"users_train must be [{ds.num_train}], one user per training row")

    def describe(self, ds: Dataset) -> str:
        return (
            f"num_classes={ds.num_classes}, num_features={ds.num_features}, feature_shape={ds.feature_shape}"
        )

    def sample(self, ds, split, batch_size, rng, seq_len, rows):
        return batches.sample_rows(ds, split, batch_size, rng, rows)

    def eval_source(self, ds, seq_len):
        return batches.eval_rows(ds)

    def examples(self, ds, indices, mask, seq_len):
        return {"x": ds.x_train[indices], "y": ds.y_train[indices], "mask": mask}

    def fit_sizes(self, ds):
        return {"num_features": ds.num_features, "num_classes": ds.num_classes, "vocab_size": 0}

    def metrics(self, ds, sums, seq_len):
        return {**_without(sums, "eval_accuracy", "eval_count"), "eval_accuracy": sums["eval_accuracy"]}

    def uniform_examples(self, ds, rng, num, seq_len):
        """A point from the box of the training features' ranges, with a label drawn
        uniformly from the classes: far from the data and wrongly labelled."""
        features = ds.x_train.reshape(ds.x_train.shape[0], -1)
        low, high = features.min(axis=0), features.max(axis=0)
        x = rng.uniform(low, high, (num, features.shape[1])).astype(ds.x_train.dtype)
        return {"x": x, "y": rng.integers(0, ds.num_classes, num).astype(ds.y_train.dtype)}


class LanguageModel(TaskType):
    """A token stream: ``x_*`` ``[T]`` ids (one stream per split; int32 in memory, or
    uint16/uint32 mapped from a token store), no labels (targets are the next tokens), and the
    ``tokenizer`` that made the ids. A record is a window of ``seq_len + 1`` tokens."""

    name = "lm"
    tokenized = True
    options = ("tokenizer",)
    label_rank = 2

    def check(self, ds: Dataset) -> None:
        for x, y, split in ((ds.x_train, ds.y_train, "train"), (ds.x_eval, ds.y_eval, "eval")):
            if x.dtype not in TOKEN_DTYPES or x.ndim != 1:
                raise DatasetError(
                    f"{split} tokens must be int32 (or uint16/uint32) [T], got {x.dtype} {x.shape}"
                )
            if y is not None:
                raise DatasetError(f"lm datasets have no {split} labels (targets are shifted inputs)")
        if ds.tokenizer is None:
            raise DatasetError("lm datasets need a tokenizer")
        if (ds.users_train is None) != (ds.segments_train is None):
            raise DatasetError("an lm dataset's users_train and segments_train come together")
        if ds.segments_train is not None:
            problem = windows.check_bounds(ds.segments_train, ds.num_train)
            segments = ds.segments_train.shape[0] - 1
            if problem is None and ds.users_train.shape != (segments,):
                problem = f"users_train must be [{segments}], one user per segment"
            if problem is not None:
                raise DatasetError(problem)

    def describe(self, ds: Dataset) -> str:
        return f"vocab_size={ds.vocab_size}"

    def seq_len(self, requested):
        return requested

    def sample(self, ds, split, batch_size, rng, seq_len, rows):
        return batches.sample_windows(ds, split, batch_size, rng, seq_len, rows)

    def eval_source(self, ds, seq_len):
        return batches.eval_windows(ds, seq_len)

    def eval_cap(self, max_batches):
        return max_batches  # an LM's eval split may be a corpus: a run reads a fixed prefix

    def num_records(self, ds, seq_len):
        if ds.segments_train is not None:  # by user: the windows of each (zoo.data.windows)
            return int(windows.window_counts(ds.segments_train, seq_len).sum())
        return (ds.x_train.shape[0] - 1) // seq_len  # non-overlapping windows

    def record_users(self, ds, seq_len):
        if ds.segments_train is None:
            return None
        return windows.window_owners(ds.segments_train, ds.users_train, seq_len)

    def examples(self, ds, indices, mask, seq_len):
        """Record ``i`` is the window of ``seq_len + 1`` tokens from ``i * seq_len``; with
        users, the ``i``-th of the windows cut from each user's segment in turn."""
        if ds.segments_train is not None:
            starts = windows.window_starts(ds.segments_train, seq_len, indices)
        else:
            starts = indices.astype(np.int64) * seq_len
        window = batches.read_windows(
            ds.x_train, starts, seq_len + 1, ds.vocab_size, batches.refusal(ds, "train")
        )
        return {"x": window[:, :-1], "y": window[:, 1:], "mask": mask}

    def fit_sizes(self, ds):
        return {"num_features": 0, "num_classes": 0, "vocab_size": ds.vocab_size}

    def metrics(self, ds, sums, seq_len):
        """Bits per character of the eval text: the summed loss of the windows over the
        characters they predict (not per token)."""
        windows = int(sums["eval_count"])
        bits = sums["eval_loss"] * windows * seq_len / math.log(2)
        chars = eval_chars(ds, seq_len, windows)
        return {**_without(sums, "eval_accuracy", "eval_count"), "eval_bits_per_char": bits / max(chars, 1)}

    def uniform_examples(self, ds, rng, num, seq_len):
        """Windows of tokens drawn uniformly from the vocabulary."""
        window = rng.integers(0, ds.vocab_size, (num, seq_len + 1)).astype(ds.x_train.dtype)
        return {"x": window[:, :-1], "y": window[:, 1:]}


def eval_chars(ds: Dataset, seq_len: int, windows: int) -> int:
    """Characters of the eval text that the first ``windows`` eval windows predict: their
    targets are one span of tokens. A byte vocabulary counts the bytes that begin a UTF-8
    character; other tokenizers decode the span (a character vocabulary: one per token)."""
    ids = np.array(ds.x_eval[1 : 1 + windows * seq_len], np.int64)  # a copy
    tokenizer = ds.tokenizer
    ids[ids >= tokenizer.vocab_size] = 0  # as the batches read them (zoo.data.batches.read_windows)
    if not getattr(tokenizer, "has_text", True):  # ids:N: one character per token
        return int(ids.size)
    if getattr(tokenizer, "byte_level", False):  # id = byte + 1; 0 (<unk>) counts as one
        return int((((ids - 1) & 0xC0) != 0x80).sum())
    return len(tokenizer.decode(ids))


TASKS: dict[str, TaskType] = {t.name: t for t in (Classify(), LanguageModel())}


def task_type(name: str) -> TaskType:
    """The task called ``name``; an unknown one is refused, naming the valid ones."""
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(str(name), TASKS, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DatasetError(f"unknown task {name!r}.{hint} Valid: {', '.join(TASKS)}.")


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A train/eval split held as read-only numpy arrays, of one task: ``task`` names its
    type (``task_type``), which checks the arrays and reads them; one class keeps every
    loader's and test's constructor, and the fields one task leaves unused are None.

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
    # Under data.user_column (zoo.data.users), users int32 in 0..U-1. classify: each training
    # row's user [N]. lm: the user of each segment [S] of the train stream, whose bounds are
    # segments_train int64 [S + 1]; a window never crosses a bound (zoo.data.windows).
    users_train: np.ndarray | None = None
    segments_train: np.ndarray | None = None

    @classmethod
    def from_store(cls, name: str, store, segments: np.ndarray | None = None) -> Dataset:
        """The lm dataset whose splits are ``store`` 's memory-mapped ids; ``segments``: the
        bounds of its train documents, each one user (``zoo.data.tokens.store.file_segments``)."""
        users = None if segments is None else np.arange(len(segments) - 1, dtype=np.int32)
        return cls(
            name,
            LanguageModel.name,
            store.train,
            None,
            store.eval,
            None,
            tokenizer=store.tokenizer,
            store=store,
            users_train=users,
            segments_train=segments,
        )

    def __post_init__(self) -> None:
        for field in ("x_train", "y_train", "x_eval", "y_eval", "users_train", "segments_train"):
            object.__setattr__(self, field, _frozen(getattr(self, field)))
        self.task_type.check(self)

    @property
    def task_type(self) -> TaskType:
        """The task this dataset serves, as a type (:data:`TASKS`)."""
        return task_type(self.task)

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
        if self.task_type.tokenized:
            raise DatasetError(f"{self.name!r} is an lm dataset; num_features is for classify")
        return int(self.x_train.shape[1])

    @property
    def vocab_size(self) -> int:
        """Tokenizer vocabulary size, including the reserved unknown id 0 (lm only)."""
        if self.tokenizer is None:
            raise DatasetError(f"{self.name!r} is a classify dataset; vocab_size is for lm")
        return self.tokenizer.vocab_size

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, num_train={self.num_train}, "
            f"num_eval={self.num_eval}, {self.task_type.describe(self)})"
        )
