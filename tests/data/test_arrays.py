"""``zoo.data.arrays``: the classes a recipe names are numbered in the order listed."""

from __future__ import annotations


def test_named_classes_are_numbered_in_the_order_listed():
    import numpy as np

    from zoo.data.arrays import keep_classes

    y = np.array([0, 1, 2, 1, 0])  # cat, dog, emu (string labels in sorted order)
    _, kept = keep_classes(np.arange(5)[:, None], y, ("emu", "dog"), "pets", ("cat", "dog", "emu"))
    assert kept.tolist() == [1, 0, 1]
