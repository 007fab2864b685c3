"""Turn a `datasets.Dataset` into numpy arrays: features/labels, text, and deterministic splits."""

from __future__ import annotations

import datasets
import numpy as np

from zoo.data.errors import DatasetError

_NUMERIC = ("bool", "int", "uint", "float")


def require_column(ds: datasets.Dataset, column: str, source: str, role: str) -> None:
    if column not in ds.column_names:
        raise DatasetError(
            f"{source!r} has no {role} column {column!r}. Available columns: {', '.join(ds.column_names)}."
            + (f" Set data.{role}_column to one of them." if role in ("text", "label") else "")
        )


def _is_numeric(feature: object) -> bool:
    dtype = getattr(feature, "dtype", "")
    return isinstance(feature, datasets.Value) and dtype.startswith(_NUMERIC)


def image_scale(dtype: np.dtype, image_max: float | None, source: str, column: str) -> float:
    """What images are divided by, one rule with and without DP (nothing read off the pixels,
    so turning DP on changes no input): ``data.image_max`` when declared, else the dtype's own
    range, 255 for uint8 and 1 for floats and bools; another dtype asks for ``data.image_max``."""
    if image_max is not None:
        return float(image_max)
    dtype = np.dtype(dtype)
    if dtype == np.uint8:
        return 255.0
    if dtype.kind in "fb":
        return 1.0
    example = f", e.g. {np.iinfo(dtype).max}" if dtype.kind in "iu" else ""
    raise DatasetError(
        f"{source!r}: images in column {column!r} are {dtype}, whose range is not known: declare "
        f"it with data.image_max{example} (it is never read off the pixels)"
    )


def _stack_images(column: np.ndarray, source: str, image_column: str) -> np.ndarray:
    if column.dtype != object:
        return column
    shapes = {np.shape(img) for img in column}
    if len(shapes) != 1:
        raise DatasetError(
            f"{source!r}: images in column {image_column!r} differ in shape: {sorted(shapes)[:4]}"
        )
    return np.stack([np.asarray(img) for img in column])


def classify_features(
    ds: datasets.Dataset, *, source: str, image_column: str, label_column: str, image_max: float | None = None
) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """float32 ``[N, F]`` features and the per-example shape (None for tabular columns).

    With an ``image_column`` the images are flattened and scaled by :func:`image_scale`; otherwise every column except ``label_column`` must be numeric and becomes
    one feature.
    """
    if image_column in ds.column_names:
        raw = ds.with_format("numpy", columns=[image_column])[:][image_column]
        images = _stack_images(np.asarray(raw), source, image_column)
        if images.ndim < 2:
            raise DatasetError(f"{source!r}: column {image_column!r} holds scalars, not images")
        shape = tuple(int(d) for d in images.shape[1:])
        feature = ds.features[image_column]  # Array2D/3D: the schema's dtype (numpy widens uint8)
        fixed = isinstance(feature, (datasets.Array2D, datasets.Array3D, datasets.Array4D))
        dtype = feature.dtype if fixed else images.dtype
        scale = np.float32(image_scale(dtype, image_max, source, image_column))
        return (images.astype(np.float32) / scale).reshape(len(images), -1), shape
    columns = [c for c in ds.column_names if c != label_column]
    if not columns:
        raise DatasetError(f"{source!r} has no feature columns besides the label column {label_column!r}")
    for c in columns:
        if not _is_numeric(ds.features[c]):
            raise DatasetError(
                f"{source!r}: feature column {c!r} is {ds.features[c]}, not numeric. "
                f"Set data.label_column = {c!r} if it is the label."
            )
    table = ds.with_format("numpy", columns=columns)[:]
    x = np.stack([np.asarray(table[c], dtype=np.float32) for c in columns], axis=1)
    if not np.isfinite(x).all():
        raise DatasetError(f"{source!r}: feature columns contain missing or non-finite values")
    return x, None


def classify_labels(ds: datasets.Dataset, *, source: str, label_column: str) -> tuple[np.ndarray, int]:
    """int64 ``[N]`` labels in ``[0, num_classes)`` and ``num_classes``.

    ClassLabel columns keep their declared class count; integer columns use ``max + 1``; string
    columns are numbered in sorted order.
    """
    require_column(ds, label_column, source, "label")
    feature = ds.features[label_column]
    raw = np.asarray(ds.with_format("numpy", columns=[label_column])[:][label_column])
    if isinstance(feature, datasets.ClassLabel):
        if raw.size and raw.min() < 0:
            raise DatasetError(f"{source!r}: label column {label_column!r} has unlabelled rows (-1)")
        return raw.astype(np.int64), int(feature.num_classes)
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        names, y = np.unique(raw.astype(str), return_inverse=True)
        return y.astype(np.int64), len(names)
    if not _is_numeric(feature):
        raise DatasetError(f"{source!r}: label column {label_column!r} is {feature}, not a class label")
    if raw.size and (not np.isfinite(raw).all() or (raw != np.round(raw)).any() or raw.min() < 0):
        raise DatasetError(f"{source!r}: label column {label_column!r} must hold non-negative integers")
    y = raw.astype(np.int64)
    return y, int(y.max()) + 1 if y.size else 0


def label_names(ds: datasets.Dataset, label_column: str) -> tuple[str, ...] | None:
    """The names of the class ids :func:`classify_labels` gives (ClassLabel names, or a string
    column's values in sorted order); None for integer labels."""
    feature = ds.features.get(label_column)
    if isinstance(feature, datasets.ClassLabel):
        return tuple(feature.names)
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        return tuple(np.unique(np.asarray(ds[label_column]).astype(str)).tolist())
    return None


def _class_id(cls: int | str, names: tuple[str, ...] | None, source: str) -> int:
    """A ``data.classes`` entry as a label id: an int as it is, a name by its label's id."""
    if not isinstance(cls, str):
        return int(cls)
    if names is None:
        raise DatasetError(f"data.classes names {cls!r}, but the labels of {source!r} are integers: list ids")
    if cls not in names:
        raise DatasetError(
            f"data.classes names {cls!r}, not a label of {source!r}; its labels: {', '.join(names)}"
        )
    return names.index(cls)


def keep_classes(
    x: np.ndarray,
    y: np.ndarray,
    classes: tuple[int | str, ...],
    source: str,
    names: tuple[str, ...] | None = None,
    say_left_out: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose label is in ``classes``, relabelled to the label's index in ``classes``.
    ``names`` (string labels) are shown beside the ids in what it says, and a class may be
    given by its name. ``say_left_out``: warn when the classes leave rows out (a file's labels
    may hold a surprise; a dataset zoo ships documents its labels, so a subset is a choice)."""
    wanted = [_class_id(c, names, source) for c in classes]
    if not wanted:
        raise DatasetError("classes must name at least one class")
    if len(set(wanted)) != len(wanted):
        raise DatasetError(f"classes {tuple(wanted)} repeats a class")
    present = set(np.unique(y).tolist())
    missing = [c for c in wanted if c not in present]
    if missing:
        shown = ", ".join(
            f"{c} ({names[c]!r})" if names and c < len(names) else str(c) for c in sorted(present)
        )
        ids = (
            " (data.classes takes these ids or the names: string labels are numbered in sorted order)"
            if names
            else ""
        )
        raise DatasetError(
            f"{source!r} has no examples of class(es) {missing}. Labels present: [{shown}]{ids}."
        )
    keep = np.isin(y, wanted)
    if say_left_out and not keep.all():  # a subset of the classes is a choice; say what it leaves out
        import warnings

        others = sorted(present - set(wanted))
        shown = ", ".join(map(str, others[:10])) + (", ..." if len(others) > 10 else "")
        from zoo.data.errors import DataDependentWarning

        warnings.warn(
            f"{source!r}: data.classes = {list(wanted)} leaves out {int((~keep).sum()):,} of "
            f"{len(y):,} rows, whose labels ({shown}) are not among the declared classes",
            DataDependentWarning,
            stacklevel=2,
        )
    remap = np.full(max(present) + 1, -1, dtype=np.int64)
    remap[wanted] = np.arange(len(wanted))
    return x[keep], remap[y[keep]]


def split_indices(n: int, eval_fraction: float, seed: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, eval) row indices from `datasets`' seeded ``train_test_split`` of ``range(n)``."""
    index = datasets.Dataset.from_dict({"i": np.arange(n, dtype=np.int64)})
    try:
        parts = index.train_test_split(test_size=eval_fraction, seed=seed)
    except ValueError as e:
        raise DatasetError(
            f"cannot split {n} examples of {source!r} with eval_fraction={eval_fraction}: {e}"
        ) from None
    train = np.asarray(parts["train"].with_format("numpy")[:]["i"], dtype=np.int64)
    test = np.asarray(parts["test"].with_format("numpy")[:]["i"], dtype=np.int64)
    return train, test


def text_values(
    ds: datasets.Dataset, *, source: str, text_column: str, private: bool = False
) -> list[str | None]:
    """Each row's ``text_column`` value as text (None: a missing value).

    A column of another type is refused, unless ``private`` (a DP run): a CSV column's type is
    read off its values, so one record could decide it; there, every value is its text."""
    require_column(ds, text_column, source, "text")
    feature = ds.features[text_column]
    text = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    if not (text or private):
        raise DatasetError(f"{source!r}: text column {text_column!r} is {feature}, not text")
    rows = ds.select_columns([text_column])[:][text_column]
    return [None if r is None else str(r) for r in rows]


def join_text(
    ds: datasets.Dataset, *, source: str, text_column: str, separator: str, private: bool = False
) -> str:
    """All rows of ``text_column`` joined with ``separator`` (None rows are skipped; the column
    is read by :func:`text_values`)."""
    values = text_values(ds, source=source, text_column=text_column, private=private)
    return separator.join(v for v in values if v is not None)


def lm_cut(n: int, eval_fraction: float, source: str) -> int:
    """Index where the eval tail starts: the last ``eval_fraction`` of ``n`` tokens (>= 1 each side)."""
    if n < 2:
        raise DatasetError(f"{source!r} has {n} characters of text; need at least 2 to split")
    n_eval = min(max(int(round(n * eval_fraction)), 1), n - 1)
    return n - n_eval
