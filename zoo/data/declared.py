"""A classifier's rows read the way a DP run must read them: every fact the model's shape, the
printed text or the exit status depends on comes from the recipe or the dataset's schema,
never from the records (docs/dp-data.md, "What a DP run reads off its records").

The rules, one per fact, each the same for every record:

- **classes**: ``data.classes``, declared. A row's label matches a class by value: an int is a
  ``ClassLabel`` id, a number equal to it, or a text of that number ("1", "1.0"); a string is a ``ClassLabel``
  name or the same text. A row whose label matches no class (another label, an unlabelled -1,
  1.5, a missing value) is dropped, silently. A declared class that no row has is a class like
  any other: the head has its output, and nothing says it is empty.
- **malformed CSV records** (a field too many or too few, a byte that is not UTF-8): a row of
  missing values in its place (:mod:`zoo.data.records`), dropped by the rules here.
- **features**: an image column's shape and dtype are the schema's (``Array2D``/``Array3D``: a
  column decoded per record, such as ``Image``, is refused before any row is read). Images are
  divided by ``data.image_max``, or by the dtype's own range: 255 for uint8, as they are for
  floats. A table's features are the header's columns other than the label, each value read
  as a number; a row with a value that is not a finite number is dropped. (Images are scaled
  by the same rule without DP: :func:`zoo.data.arrays.image_scale`.)

The number of rows kept, ``N``, is treated as public, as DP-SGD's sampling rate ``q = B / N``
already publishes it.
"""

from __future__ import annotations

import datasets
import numpy as np

from zoo.data.arrays import image_scale, require_column, split_indices
from zoo.data.dataset import Dataset
from zoo.data.errors import DatasetError
from zoo.data.table import Source
from zoo.data.users import dense_ids, split_users, user_values

_UNMATCHED = -1


def _text(value) -> str | None:
    """A label's text form: strings as they are, integral numbers in decimal, else None."""
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, (bool, np.bool_)) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return str(int(number)) if np.isfinite(number) and number == round(number) else None


def _number_text(value) -> str | None:
    """A text label that is an integral number, in decimal ("1.0", "007": "1", "7"), else None:
    a CSV under DP reads every value as text (``zoo.data.records``)."""
    if not isinstance(value, (str, np.str_)):
        return None
    try:
        return _text(float(value))
    except ValueError:
        return None


def declared_labels(ds: datasets.Dataset, source: str, label_column: str, classes: tuple) -> np.ndarray:
    """int64 [N]: each row's index in ``classes`` (module docstring), or -1 for no class."""
    require_column(ds, label_column, source, "label")
    feature = ds.features[label_column]
    raw = ds.with_format("numpy", columns=[label_column])[:][label_column]
    if isinstance(feature, datasets.ClassLabel):
        by_id = {}
        for index, cls in enumerate(classes):
            cid = feature.names.index(cls) if isinstance(cls, str) and cls in feature.names else cls
            if not isinstance(cid, str):
                by_id[int(cid)] = index
        ids = np.asarray(raw, np.int64)
        return np.array([by_id.get(int(i), _UNMATCHED) for i in ids], np.int64)
    by_text = {str(cls): index for index, cls in enumerate(classes)}
    values = np.asarray(raw, dtype=object)
    found = {
        value: by_text.get(_text(value), by_text.get(_number_text(value), _UNMATCHED))
        for value in set(values.tolist())
    }
    return np.array([found[value] for value in values.tolist()], np.int64)


def declared_features(
    ds: datasets.Dataset, *, source: str, image_column: str, label_column: str, image_max: float | None
) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """float32 [N, F] features (NaN in a row to drop) and the per-example shape (None for a
    table), both as the module docstring says."""
    if image_column in ds.column_names:
        feature = ds.features[image_column]
        if not isinstance(feature, (datasets.Array2D, datasets.Array3D)):
            raise DatasetError(
                f"{source!r}: column {image_column!r} is {type(feature).__name__}, whose shape is each "
                "record's own; under DP the shape must be declared: store the images as a fixed-shape "
                "Array2D/Array3D column (zoo's mnist and idx:DIR forms do)"
            )
        scale = image_scale(feature.dtype, image_max, source, image_column)
        images = ds.with_format("numpy", columns=[image_column])[:][image_column]
        x = np.asarray(images, np.float32).reshape(len(ds), -1) / np.float32(scale)
        return x, tuple(int(d) for d in feature.shape)
    columns = [c for c in ds.column_names if c != label_column]
    if not columns:
        raise DatasetError(f"{source!r} has no feature columns besides the label column {label_column!r}")
    nested = [c for c in columns if not isinstance(ds.features[c], datasets.Value)]
    if nested:
        raise DatasetError(
            f"{source!r}: feature column {nested[0]!r} is {ds.features[nested[0]]}, not a number per row"
        )
    table = ds.select_columns(columns).to_pandas()
    import pandas as pd

    x = np.stack([pd.to_numeric(table[c], errors="coerce").to_numpy(np.float64) for c in columns], axis=1)
    x[np.abs(x) > np.finfo(np.float32).max] = np.nan  # past float32: not a finite number, dropped
    return x.astype(np.float32), None


def _rows(
    ds, spec, src: Source, classes, image_max
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None]:
    """``(x, y, keep, shape)`` of every row; ``keep`` marks the rows the rules keep. The user
    column (``src.user_column``) names the user, and is not a feature."""
    y = declared_labels(ds, spec, src.label_column, classes)
    if src.user_column is not None and src.user_column in ds.column_names:
        ds = ds.remove_columns([src.user_column])
    x, shape = declared_features(
        ds, source=spec, image_column=src.image_column, label_column=src.label_column, image_max=image_max
    )
    return x, y.astype(np.int32), (y != _UNMATCHED) & np.isfinite(x).all(axis=1), shape


def classify_declared(
    spec: str,
    src: Source,
    seed: int,
    eval_fraction: float,
    classes: tuple[int | str, ...] | None,
    image_max: float | None = None,
) -> Dataset:
    """:func:`zoo.data.sources.load_dataset`'s classifier under DP (the module docstring's rules)."""
    if not classes:
        raise DatasetError(
            f"{spec!r} under DP: list the classes (data.classes); they are not read off the labels"
        )
    users = None if src.user_column is None else user_values(src.rows, spec, src.user_column)
    x, y, keep, shape = _rows(src.rows, spec, src, tuple(classes), image_max)
    users_train = None
    if users is not None:  # whole users held out (zoo.data.users); a row with no user is dropped
        if src.eval_rows is not None:
            raise DatasetError(f"{spec!r} has its own eval split: users cannot be held out of it")
        train, held, owner = split_users(users, eval_fraction, seed, spec)
        parts = [(x[i][keep[i]], y[i][keep[i]]) for i in (train, held)]
        users_train = dense_ids(owner[train][keep[train]])
    elif src.eval_rows is None:  # split the rows first: a dropped row moves no other row
        train, held = split_indices(len(y), eval_fraction, seed, spec)
        parts = [(x[i][keep[i]], y[i][keep[i]]) for i in (train, held)]
    else:
        x_eval, y_eval, keep_eval, _ = _rows(src.eval_rows, spec, src, tuple(classes), image_max)
        parts = [(x[keep], y[keep]), (x_eval[keep_eval], y_eval[keep_eval])]
    (x_train, y_train), (x_eval, y_eval) = parts
    return Dataset(
        name=spec,
        task="classify",
        x_train=x_train,
        y_train=y_train,
        x_eval=x_eval,
        y_eval=y_eval,
        num_classes=len(classes),
        feature_shape=shape,
        users_train=users_train,
    )
