"""`load_dataset` and its specs: the builtins (``digits``, ``python-docs``, ``spiral``, ``mnist``...;
more via :func:`register_builtin`), ``hf:``, ``text:``, ``csv:``, ``parquet:``, ``idx:``.

Every source is first read into a `datasets.Dataset` holding the rows to train on; one path then
turns it into numpy arrays and a deterministic train/eval split.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import datasets
import numpy as np

from zoo.data.arrays import (
    classify_features,
    classify_labels,
    join_text,
    keep_classes,
    lm_cut,
    split_indices,
)
from zoo.data.dataset import TASKS, Dataset
from zoo.data.errors import DatasetError
from zoo.data.files import load_local, local_paths
from zoo.data.hub import load_hub
from zoo.data.idx import image_rows, read_split_dir
from zoo.data.tokenizer import CharTokenizer

SCHEME_FORMS = ("hf:NAME[:CONFIG]", "text:PATH[,PATH...]", "csv:PATH", "parquet:PATH", "idx:DIR")
_SCHEMES = ("hf", "text", "csv", "parquet", "idx")
_ONLY_TASK = {"text": "lm", "idx": "classify"}
DOCUMENT_SEPARATOR = "\n\n"  # between python-docs topics
ROW_SEPARATOR = "\n"  # between rows of text files, csv/parquet and hf text columns


@dataclass(frozen=True)
class Source:
    """What a spec reads: the rows plus the column names to use for them."""

    rows: datasets.Dataset
    text_column: str
    image_column: str
    label_column: str
    separator: str = ROW_SEPARATOR
    eval_rows: datasets.Dataset | None = None  # an official test split: eval there, not on a slice of rows


@dataclass(frozen=True)
class Builtin:
    """An offline dataset known by name: the one task it serves and how to read its rows."""

    task: str
    read: Callable[[], Source]


BUILTINS: dict[str, Builtin] = {}


def register_builtin(name: str, task: str, read: Callable[[], Source]) -> None:
    """Make ``name`` a dataset spec: ``read()`` returns its rows (cache it; it is called on every
    load), ``task`` is the only task it serves."""
    if name in BUILTINS or ":" in name or task not in TASKS:
        raise ValueError(f"builtin dataset {name!r} is taken, has a ':' or an unknown task {task!r}")
    BUILTINS[name] = Builtin(task, read)


def dataset_kinds() -> tuple[str, ...]:
    """Every spec form: the builtin names, then the schemes."""
    return (*BUILTINS, *SCHEME_FORMS)


def _valid_forms() -> str:
    return ", ".join(dataset_kinds())


def _unknown_spec(spec: str) -> DatasetError:
    if ":" in spec:
        scheme, rest = spec.split(":", 1)
        close = [f"{s}:{rest}" for s in difflib.get_close_matches(scheme, _SCHEMES, n=2, cutoff=0.5)]
    else:
        close = difflib.get_close_matches(spec, list(BUILTINS), n=2, cutoff=0.6)
        if not close and spec.strip() and " " not in spec:
            close = [f"hf:{spec}"]
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return DatasetError(f"unknown dataset {spec!r}.{hint} Valid forms: {_valid_forms()}.")


def _train_rows(loaded: datasets.Dataset | datasets.DatasetDict, spec: str) -> datasets.Dataset:
    if isinstance(loaded, datasets.Dataset):
        return loaded
    if "train" in loaded:
        return loaded["train"]
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    raise DatasetError(f"{spec!r} has no 'train' split. Splits: {', '.join(loaded)}.")


@functools.cache
def _digits() -> Source:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    features = datasets.Features(
        {
            "image": datasets.Array2D(shape=(8, 8), dtype="float32"),
            "label": datasets.ClassLabel(names=[str(d) for d in range(10)]),
        }
    )
    images = (bunch.images / 16.0).astype(np.float32)
    rows = datasets.Dataset.from_dict({"image": images, "label": bunch.target}, features=features)
    return Source(rows, text_column="text", image_column="image", label_column="label")


@functools.cache
def _python_docs() -> Source:
    from pydoc_data.topics import topics

    rows = datasets.Dataset.from_dict({"text": [topics[k] for k in sorted(topics)]})
    return Source(rows, "text", "image", "label", separator=DOCUMENT_SEPARATOR)


register_builtin("digits", "classify", _digits)
register_builtin("python-docs", "lm", _python_docs)


def _kind(spec: str) -> str:
    """The builtin name or scheme of ``spec``; DatasetError if it is neither."""
    if spec in BUILTINS:
        return spec
    scheme, sep, _ = spec.partition(":")
    if not sep or scheme not in _SCHEMES:
        raise _unknown_spec(spec)
    return scheme


def _read(spec: str, text_column: str, image_column: str, label_column: str) -> Source:
    """The rows ``spec`` names, with the column names to read them by."""
    if spec in BUILTINS:
        return BUILTINS[spec].read()
    scheme, _, rest = spec.partition(":")
    columns = {"text_column": text_column, "image_column": image_column, "label_column": label_column}
    if scheme == "hf":
        name, _, config = rest.partition(":")
        if not name.strip():
            raise DatasetError(f"{spec!r} names no dataset; use hf:NAME[:CONFIG], e.g. hf:mnist")
        rows = _train_rows(load_hub(spec, name.strip(), config.strip() or None), spec)
        return Source(rows, **columns)
    if scheme == "idx":  # the four MNIST-style idx files of a directory: official train/test
        train_x, train_y, test_x, test_y = read_split_dir(os.path.abspath(os.path.expanduser(rest.strip())))
        return Source(
            image_rows(train_x, train_y), "text", "image", "label", eval_rows=image_rows(test_x, test_y)
        )
    paths = local_paths(spec, rest, many=scheme == "text", forms=_valid_forms())
    if scheme == "text":
        rows = _train_rows(load_local(spec, "text", paths, sample_by="document"), spec)
        return Source(rows, "text", image_column, label_column)
    return Source(_train_rows(load_local(spec, scheme, paths), spec), **columns)


MAX_SEED = 2**32 - 1  # the largest seed `datasets`' train_test_split (numpy's legacy seeding) takes


def _check_args(task: str, seed: object, eval_fraction: float, classes: object, tokenizer: object) -> None:
    if task not in TASKS:
        close = difflib.get_close_matches(str(task), TASKS, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise DatasetError(f"unknown task {task!r}.{hint} Valid: {', '.join(TASKS)}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise DatasetError(f"seed must be an int in [0, {MAX_SEED}] (it shuffles the split), got {seed!r}")
    if not isinstance(eval_fraction, (int, float)) or not 0.0 < eval_fraction < 1.0:
        raise DatasetError(f"eval_fraction must be a number in (0, 1), got {eval_fraction!r}")
    if classes is not None and task != "classify":
        raise DatasetError(f"classes= only applies to task='classify', not {task!r}")
    if tokenizer is not None and task != "lm":
        raise DatasetError(f"tokenizer= only applies to task='lm', not {task!r}")
    if tokenizer is not None and not hasattr(tokenizer, "encode"):  # CharTokenizer, HFTokenizer
        raise DatasetError(
            f"tokenizer must be a CharTokenizer or HFTokenizer, got {type(tokenizer).__name__}"
        )


def _check_two_classes(spec: str, y: np.ndarray, label_column: str) -> None:
    present = np.unique(y)
    if len(present) < 2:  # a classifier of one class scores accuracy 1.0 and learns nothing
        held = f"all of class {present[0]}" if len(present) else "no rows"
        raise DatasetError(
            f"{spec!r} has {len(y)} rows, {held}: a classifier needs at least 2 classes. "
            f"Check label_column={label_column!r}"
        )


def _classify(
    spec: str, src: Source, seed: int, eval_fraction: float, classes: tuple[int, ...] | None
) -> Dataset:
    parts = [src.rows] if src.eval_rows is None else [src.rows, src.eval_rows]
    arrays, counts = [], []
    for rows in parts:
        y, num_classes = classify_labels(rows, source=spec, label_column=src.label_column)
        x, feature_shape = classify_features(
            rows, source=spec, image_column=src.image_column, label_column=src.label_column
        )
        if classes is not None:
            x, y = keep_classes(x, y, tuple(classes), spec)
            num_classes = len(classes)
        arrays.append((x, y))
        counts.append(num_classes)
    _check_two_classes(spec, arrays[0][1], src.label_column)
    if src.eval_rows is None:
        x, y = arrays[0]
        train, held = split_indices(len(y), eval_fraction, seed, spec)
        arrays = [(x[train], y[train]), (x[held], y[held])]
    num_classes = max(counts)  # with an official test split: the classes of either split
    (x_train, y_train), (x_eval, y_eval) = arrays
    return Dataset(
        name=spec,
        task="classify",
        x_train=x_train,
        y_train=y_train.astype(np.int32),
        x_eval=x_eval,
        y_eval=y_eval.astype(np.int32),
        num_classes=num_classes,
        feature_shape=feature_shape,
    )


def _lm(spec: str, src: Source, eval_fraction: float, tokenizer: CharTokenizer | None) -> Dataset:
    text = join_text(src.rows, source=spec, text_column=src.text_column, separator=src.separator)
    tok = tokenizer if tokenizer is not None else CharTokenizer.fit(text)
    ids = tok.encode(text)
    cut = lm_cut(len(ids), eval_fraction, spec)
    return Dataset(
        name=spec, task="lm", x_train=ids[:cut], y_train=None, x_eval=ids[cut:], y_eval=None, tokenizer=tok
    )


def load_dataset(
    spec: str,
    *,
    task: str,
    seed: int = 0,
    eval_fraction: float = 0.1,
    classes: tuple[int, ...] | None = None,
    text_column: str = "text",
    image_column: str = "image",
    label_column: str = "label",
    tokenizer: CharTokenizer | None = None,
) -> Dataset:
    """Load ``spec`` (one of :func:`dataset_kinds`) for ``task`` ("classify" or "lm").

    classify: rows are split with `datasets`' ``train_test_split(test_size=eval_fraction, seed=seed)``;
    ``classes`` keeps only those original labels and renumbers them 0..len(classes)-1 in order.
    lm: the text is joined, tokenized per character (``tokenizer`` if given, else one fitted on the
    whole text) and the last ``eval_fraction`` of the tokens is the eval split (``seed`` is unused).
    """
    if not isinstance(spec, str):
        raise DatasetError(f"dataset spec must be a string, got {type(spec).__name__}")
    _check_args(task, seed, eval_fraction, classes, tokenizer)
    spec = spec.strip()
    kind = _kind(spec)
    only = BUILTINS[kind].task if kind in BUILTINS else _ONLY_TASK.get(kind)
    if only is not None and only != task:
        raise DatasetError(f"{spec!r} supports only task={only!r}, not {task!r}")
    src = _read(spec, text_column, image_column, label_column)
    if task == "classify":
        return _classify(spec, src, seed, eval_fraction, classes)
    return _lm(spec, src, eval_fraction, tokenizer)
