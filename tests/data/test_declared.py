"""zoo.data.declared: how a DP run reads a classifier's rows, one rule per fact (the neighbour
pairs that hold whole runs to them are in tests/e2e/test_dp_neighbours.py)."""

import datasets
import numpy as np
import pytest

from zoo.data import DatasetError, load_dataset
from zoo.data.declared import declared_features, declared_labels


def rows(labels, feature=None, **columns) -> datasets.Dataset:
    data = {"a": np.arange(len(labels), dtype=np.float32), **columns, "label": labels}
    return datasets.Dataset.from_dict(data, features=datasets.Features(feature) if feature else None)


@pytest.mark.parametrize(
    ("labels", "classes", "expected"),
    [
        ([0, 2, 1, 7, -1], (0, 1, 2), [0, 2, 1, -1, -1]),  # ints: another label and -1 match nothing
        ([0.0, 1.0, 1.5, 2.0], (2, 0), [1, -1, -1, 0]),  # integral floats are their ints; 1.5 is none
        (["emu", "dog", "cat", "dog"], ("dog", "emu"), [1, 0, -1, 0]),  # names in the order listed
        (["0", "1", "cat"], (1, 0), [1, 0, -1]),  # an int matches its decimal text
        (["cat", "dog"], (0, 1), [-1, -1]),  # never a position among the names present
    ],
)
def test_a_label_matches_a_declared_class_by_value(labels, classes, expected):
    assert declared_labels(rows(labels), "t", "label", classes).tolist() == expected


def test_a_class_label_matches_by_id_or_by_name_and_minus_one_by_nothing():
    feature = {"a": datasets.Value("float32"), "label": datasets.ClassLabel(names=["x", "y", "z"])}
    got = declared_labels(rows([0, 1, 2, -1], feature), "t", "label", ("z", 0, 5))
    assert got.tolist() == [1, -1, 0, -1]


def images(values, dtype: str) -> datasets.Dataset:
    feature = {"image": datasets.Array2D(shape=(1, 2), dtype=dtype), "label": datasets.Value("int64")}
    return datasets.Dataset.from_dict(
        {"image": np.asarray(values, dtype).reshape(-1, 1, 2), "label": [0] * len(values)},
        features=datasets.Features(feature),
    )


def features(ds, image_max=None):
    return declared_features(ds, source="t", image_column="image", label_column="label", image_max=image_max)


def test_images_are_scaled_by_their_format_or_the_declared_range_never_by_their_values():
    x, shape = features(images([[0, 255], [51, 300.0]], "float32"))
    assert shape == (1, 2) and x.tolist() == [[0.0, 255.0], [51.0, 300.0]]  # floats as they are
    x, _ = features(images([[0, 255], [51, 102]], "uint8"))
    np.testing.assert_array_equal(x, np.float32([[0, 255], [51, 102]]) / np.float32(255))
    x, _ = features(images([[0, 4095]], "uint16"), image_max=4095.0)
    assert x.tolist() == [[0.0, 1.0]]
    with pytest.raises(DatasetError, match="declare it with data.image_max, e.g. 65535"):
        features(images([[0, 4095]], "uint16"))


def test_images_of_a_shape_decoded_per_record_are_refused_before_a_row_is_read():
    from PIL import Image

    ds = datasets.Dataset.from_dict(
        {"image": [Image.new("L", (2, 2)), Image.new("L", (3, 2))], "label": [0, 1]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
    )
    with pytest.raises(DatasetError, match="Image, whose shape is each record's own"):
        features(ds)


def test_a_table_reads_every_value_as_a_number_and_marks_the_rest():
    ds = datasets.Dataset.from_dict({"a": ["1", "x", "2.5", None], "b": [1, 2, 3, 4], "label": [0, 0, 1, 1]})
    x, shape = declared_features(ds, source="t", image_column="image", label_column="label", image_max=None)
    assert shape is None
    assert x[:, 1].tolist() == [1, 2, 3, 4] and x[[0, 2], 0].tolist() == [1.0, 2.5]
    assert np.isnan(x[[1, 3], 0]).all()


def test_the_loader_drops_unmatched_and_non_finite_rows_and_keeps_every_declared_class(tmp_path):
    path = tmp_path / "t.csv"
    lines = ["a,b,label", *(f"{i},{i % 4},{i % 2}" for i in range(20)), "x,1,0", "3,4,9", ",1,1"]
    path.write_text("\n".join(lines) + "\n")
    ds = load_dataset(f"csv:{path}", task="classify", classes=(0, 1, 2), private=True, eval_fraction=0.25)
    assert ds.num_classes == 3 and ds.num_features == 2  # class 2 has no row and is a class
    assert ds.num_train + ds.num_eval == 20  # the three bad rows are gone, silently
    with pytest.raises(DatasetError, match="list the classes"):
        load_dataset(f"csv:{path}", task="classify", private=True)


@pytest.mark.parametrize(
    ("dtype", "top"),
    [("float32", 200), ("uint8", 1)],  # floats in 0..255; uint8 images of 0 and 1 only
)
def test_a_classifier_recipes_inputs_are_equal_bit_for_bit_with_dp_on_and_off(tmp_path, dtype, top):
    """One scaling rule for both loaders (zoo.data.arrays.image_scale): the dtype's range or
    data.image_max, never the largest pixel, so turning dp.enabled on changes no input."""
    from zoo import recipes
    from zoo.commands import settings

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, top + 1, size=(60, 4, 4)).astype(dtype)
    feature = {"image": datasets.Array2D(shape=(4, 4), dtype=dtype), "label": datasets.Value("int64")}
    data = {"image": pixels, "label": rng.integers(0, 3, 60)}
    datasets.Dataset.from_dict(data, features=datasets.Features(feature)).to_parquet(
        str(tmp_path / "i.parquet")
    )
    loaded = {}
    for dp in (False, True):
        recipe = settings.with_values(
            recipes.load_recipe("digits-mlp-dp"),
            {
                "data.dataset": f"parquet:{tmp_path / 'i.parquet'}",
                "data.classes": [0, 1, 2],
                "dp.enabled": dp,
            },
        )
        d = recipe.data
        loaded[dp] = load_dataset(
            d.dataset, task="classify", seed=recipe.train.seed, eval_fraction=d.eval_fraction,
            classes=d.classes, image_max=d.image_max, private=recipe.dp.enabled,
        )  # fmt: skip
    for split in ("x_train", "y_train", "x_eval", "y_eval"):
        assert getattr(loaded[False], split).tobytes() == getattr(loaded[True], split).tobytes(), split
    expected = pixels.reshape(60, -1).astype(np.float32) / np.float32(255 if dtype == "uint8" else 1)
    assert np.isin(loaded[False].x_train, expected).all()
