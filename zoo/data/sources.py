"""`load_dataset`: a spec, read through its row of the dataset table (``zoo.data.table``), to
numpy train/eval splits.

Every source is first read into a `datasets.Dataset` holding the rows to train on; one path then
turns it into numpy arrays and a deterministic train/eval split.
"""

from __future__ import annotations

import numpy as np

from zoo.checks import is_number, require_int
from zoo.data.arrays import (
    classify_features,
    classify_labels,
    join_text,
    keep_classes,
    label_names,
    lm_cut,
    split_indices,
)
from zoo.data.dataset import TASKS, Classify, Dataset, LanguageModel, task_type
from zoo.data.declared import classify_declared
from zoo.data.errors import DatasetError
from zoo.data.table import Columns, Source, lookup
from zoo.data.tokenizer import CharTokenizer
from zoo.data.tokens.store import TokenSource, file_segments, private_rule
from zoo.data.users import lm_by_user

MAX_SEED = 2**32 - 1  # the largest seed `datasets`' train_test_split (numpy's legacy seeding) takes


def _check_args(task: str, seed: object, eval_fraction: float, classes: object, tokenizer: object) -> None:
    kind = task_type(task)
    require_int(
        "seed",
        seed,
        lo=0,
        hi=MAX_SEED,
        what=f"an int in [0, {MAX_SEED}] (it shuffles the split)",
        error=DatasetError,
    )
    if not (is_number(eval_fraction) and 0.0 < eval_fraction < 1.0):
        raise DatasetError(f"eval_fraction must be a number in (0, 1); got {eval_fraction!r}.")
    for option, value in (("classes", classes), ("tokenizer", tokenizer)):
        if value is not None and option not in kind.options:
            owner = next(t.name for t in TASKS.values() if option in t.options)
            raise DatasetError(f"{option}= only applies to task={owner!r}, not {task!r}")
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
            f"Check data.label_column = {label_column!r}"
        )


def _classify(
    spec: str,
    src: Source,
    seed: int,
    eval_fraction: float,
    classes: tuple[int, ...] | None,
    image_max: float | None = None,
) -> Dataset:
    parts = [src.rows] if src.eval_rows is None else [src.rows, src.eval_rows]
    arrays, counts = [], []
    for rows in parts:
        y, num_classes = classify_labels(rows, source=spec, label_column=src.label_column)
        x, feature_shape = classify_features(
            rows,
            source=spec,
            image_column=src.image_column,
            label_column=src.label_column,
            image_max=image_max,
        )
        if classes is not None:  # a named dataset's labels are documented: a subset is no surprise
            named = not lookup(spec)[0].is_scheme
            names = label_names(rows, src.label_column)
            x, y = keep_classes(x, y, tuple(classes), spec, names, say_left_out=not named)
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
        task=Classify.name,
        x_train=x_train,
        y_train=y_train.astype(np.int32),
        x_eval=x_eval,
        y_eval=y_eval.astype(np.int32),
        num_classes=num_classes,
        feature_shape=feature_shape,
    )


def _lm(
    spec: str, src: Source, eval_fraction: float, tokenizer: CharTokenizer | None, private: bool = False
) -> Dataset:
    text = join_text(
        src.rows, source=spec, text_column=src.text_column, separator=src.separator, private=private
    )
    tok = tokenizer if tokenizer is not None else CharTokenizer.fit(text)
    ids = tok.encode(text)
    cut = lm_cut(len(ids), eval_fraction, spec)
    return Dataset(
        name=spec,
        task=LanguageModel.name,
        x_train=ids[:cut],
        y_train=None,
        x_eval=ids[cut:],
        y_eval=None,
        tokenizer=tok,
        notice=src.notice,
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
    image_max: float | None = None,
    private: bool = False,
    user_column: str | None = None,
) -> Dataset:
    """Load ``spec`` (a form of :func:`zoo.data.table.dataset_kinds`) for ``task`` ("classify" or "lm").

    classify: rows are split with `datasets`' ``train_test_split(test_size=eval_fraction, seed=seed)``;
    ``classes`` keeps only those original labels and renumbers them 0..len(classes)-1 in order.
    ``image_max`` divides images (default: their format's range). ``private`` (a DP run):
    nothing that sets the model's shape, the printed text or whether the load succeeds is read
    off the records (:mod:`zoo.data.declared`). ``user_column`` (a DP run): the column naming
    each row's user (``"file"`` for ``text:``: each file one user); the eval split holds out
    whole users, ``eval_fraction`` of them by ``seed`` (:mod:`zoo.data.users`).
    lm: the text is joined, tokenized per character (``tokenizer`` if given, else one fitted on the
    whole text) and the last ``eval_fraction`` of the tokens is the eval split (``seed`` is unused);
    with users, each train user's text is a segment of its own (:func:`zoo.data.users.lm_by_user`).
    """
    if not isinstance(spec, str):
        raise DatasetError(f"dataset spec must be a string, got {type(spec).__name__}")
    _check_args(task, seed, eval_fraction, classes, tokenizer)
    if user_column is not None and not private:  # read by the DP loaders only (zoo.data.users)
        raise DatasetError(f"user_column={user_column!r} is read only under DP (private=True)")
    spec = spec.strip()
    form, rest = lookup(spec)
    if task not in form.tasks:
        only = form.tasks[0] if len(form.tasks) == 1 else form.tasks
        raise DatasetError(f"{spec!r} supports only task={only!r}, not {task!r}")
    if user_column is not None and not (form.users and form.user_column in (None, user_column)):
        named = f"; it names users by user_column={form.user_column!r}" if form.users else ""
        raise DatasetError(f"{spec!r} cannot give users by user_column={user_column!r}{named}")
    src = form.read(spec, rest, Columns(text_column, image_column, label_column, private, user_column))
    if isinstance(src, TokenSource):  # ids on disk, read by index (zoo.data.tokens)
        store = src.open(tokenizer, eval_fraction)
        segments = None if user_column is None else file_segments(store, spec)  # each file a user
        return Dataset.from_store(spec, private_rule(store) if private else store, segments)
    read = _READERS[task]
    return read(spec, src, seed, eval_fraction, classes, tokenizer, image_max, private)


def _read_classify(spec, src, seed, eval_fraction, classes, tokenizer, image_max, private) -> Dataset:
    classify = classify_declared if private else _classify
    return classify(spec, src, seed, eval_fraction, classes, image_max)


def _read_lm(spec, src, seed, eval_fraction, classes, tokenizer, image_max, private) -> Dataset:
    if src.user_column is not None:  # a segment per user, whole users held out (zoo.data.users)
        return lm_by_user(spec, src, seed, eval_fraction, tokenizer, private)
    return _lm(spec, src, eval_fraction, tokenizer, private)


# Each task's reader of a form's rows, by task name (zoo.data.dataset.TASKS); one signature.
_READERS = {Classify.name: _read_classify, LanguageModel.name: _read_lm}
