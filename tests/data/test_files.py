"""csv: and parquet: files written in tmp_path, for both tasks."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from zoo.data import DatasetError, load_dataset


def _sorted_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    table = np.concatenate([x.astype(np.float64), y[:, None].astype(np.float64)], axis=1)
    return table[np.lexsort(table.T[::-1])]


@pytest.fixture
def table():
    rng = np.random.default_rng(7)
    n = 60
    return {
        "f0": rng.normal(size=n).round(3),
        "f1": rng.integers(0, 100, size=n),
        "f2": rng.uniform(size=n).round(3),
        "label": rng.integers(0, 4, size=n),
    }


def _write(tmp_path, fmt: str, columns: dict) -> str:
    path = tmp_path / f"data.{fmt}"
    rows = datasets.Dataset.from_dict(
        {k: list(v) if isinstance(v, np.ndarray) else v for k, v in columns.items()}
    )
    if fmt == "csv":
        rows.to_csv(str(path), index=False)
    else:
        rows.to_parquet(str(path))
    return str(path)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_classify_features_are_the_other_columns(tmp_path, table, fmt):
    path = _write(tmp_path, fmt, table)
    ds = load_dataset(f"{fmt}:{path}", task="classify", eval_fraction=0.2, seed=3)
    expected_x = np.stack([table["f0"], table["f1"], table["f2"]], axis=1).astype(np.float32)
    assert ds.num_features == 3 and ds.feature_shape is None
    assert ds.num_classes == int(table["label"].max()) + 1
    assert ds.num_eval == 12 and ds.num_train == 48
    ours = _sorted_rows(np.concatenate([ds.x_train, ds.x_eval]), np.concatenate([ds.y_train, ds.y_eval]))
    np.testing.assert_array_equal(ours, _sorted_rows(expected_x, table["label"]))


def test_custom_label_column_and_classes(tmp_path, table):
    cols = {"a": table["f0"], "b": table["f2"], "target": table["label"]}
    path = _write(tmp_path, "csv", cols)
    ds = load_dataset(f"csv:{path}", task="classify", label_column="target", classes=(2, 0))
    keep = np.isin(table["label"], (2, 0))
    original = np.asarray([2, 0])[np.concatenate([ds.y_train, ds.y_eval])]
    expected = np.stack([cols["a"], cols["b"]], axis=1).astype(np.float32)[keep]
    ours = _sorted_rows(np.concatenate([ds.x_train, ds.x_eval]), original)
    np.testing.assert_array_equal(ours, _sorted_rows(expected, table["label"][keep]))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_missing_label_column_lists_columns(tmp_path, table, fmt):
    path = _write(tmp_path, fmt, table)
    with pytest.raises(DatasetError) as err:
        load_dataset(f"{fmt}:{path}", task="classify", label_column="target")
    msg = str(err.value)
    assert "'target'" in msg and all(c in msg for c in ("f0", "f1", "f2", "label"))


def test_non_numeric_feature_is_named(tmp_path, table):
    path = _write(tmp_path, "csv", {**table, "note": ["x"] * len(table["label"])})
    with pytest.raises(DatasetError, match="'note'"):
        load_dataset(f"csv:{path}", task="classify")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_lm_reads_text_column(tmp_path, fmt):
    lines = [f"row {i}: the quick brown fox #{i * i}" for i in range(30)]
    path = _write(tmp_path, fmt, {"body": lines, "id": list(range(30))})
    ds = load_dataset(f"{fmt}:{path}", task="lm", text_column="body")
    expected = "\n".join(lines)
    assert ds.tokenizer.chars == tuple(sorted(set(expected)))
    assert ds.tokenizer.decode(np.concatenate([ds.x_train, ds.x_eval])) == expected


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_lm_missing_text_column_lists_columns(tmp_path, fmt):
    path = _write(tmp_path, fmt, {"body": ["a b", "c d"], "id": [1, 2]})
    with pytest.raises(DatasetError) as err:
        load_dataset(f"{fmt}:{path}", task="lm")
    msg = str(err.value)
    assert "'text'" in msg and "body" in msg and "id" in msg


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_missing_file_names_path(tmp_path, fmt):
    missing = tmp_path / f"absent.{fmt}"
    with pytest.raises(DatasetError, match=f"absent.{fmt}"):
        load_dataset(f"{fmt}:{missing}", task="classify")


def test_parquet_image_column(tmp_path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(20, 6, 5), dtype=np.uint8)
    labels = rng.integers(0, 3, size=20)
    from PIL import Image

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    rows = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p) for p in pixels], "label": labels.tolist()}, features=features
    )
    path = tmp_path / "images.parquet"
    rows.to_parquet(str(path))
    ds = load_dataset(f"parquet:{path}", task="classify")
    assert ds.feature_shape == (6, 5) and ds.num_features == 30 and ds.num_classes == 3
    ours = _sorted_rows(np.concatenate([ds.x_train, ds.x_eval]), np.concatenate([ds.y_train, ds.y_eval]))
    expected = (pixels.reshape(20, -1) / 255.0).astype(np.float32)
    np.testing.assert_array_equal(ours, _sorted_rows(expected, labels))


@pytest.mark.parametrize(
    ("builder", "said"), [("text", "a binary file, not text ("), ("csv", "not csv text (")]
)
def test_a_binary_file_is_named_once_as_not_text(tmp_path, builder, said):
    from zoo.data.files import unreadable

    path = tmp_path / "blob.dat"
    path.write_bytes(bytes(range(256)) * 4)
    reason = unreadable(builder, str(path))
    assert said in reason and "text text" not in reason
