"""``digits``: the UCI 8x8 handwritten digits bundled with scikit-learn (1,797 images, 10 classes)."""

from __future__ import annotations

import functools

from zoo.data.table import Source, register_builtin


@functools.cache
def read_digits() -> Source:
    import datasets
    import numpy as np
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


register_builtin(
    "digits",
    "classify",
    read_digits,
    description="UCI 8x8 digits bundled with scikit-learn (1,797 images, 10 classes)",
)
