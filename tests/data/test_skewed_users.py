"""The ``skewed-users`` table (zoo.data.forms.skewed_users): each user holds the records the
module declares, the user column names users and is never a feature, and the eval split
holds out whole users."""

from __future__ import annotations

import numpy as np

from zoo.data import load_dataset
from zoo.data.forms.skewed_users import FEATURES, HEAVIEST, USERS, make_rows, records_of
from zoo.data.users import group_rows, held_out


def test_the_rows_hold_the_declared_skew():
    users, x, y = make_rows()
    counts = np.bincount(users, minlength=USERS)
    assert counts.tolist() == [records_of(u) for u in range(USERS)]
    assert (
        counts.max() == HEAVIEST
        and counts.min() == 2
        and counts.sum() == 9900
        and x.shape == (users.size, FEATURES)
    )
    assert 0.3 < y.mean() < 0.7  # both classes well represented
    again = make_rows()
    assert all(np.array_equal(a, b) for a, b in zip((users, x, y), again, strict=True))


def test_under_users_the_column_groups_rows_and_the_eval_split_holds_out_whole_users():
    ds = load_dataset(
        "skewed-users", task="classify", classes=(0, 1), private=True, user_column="user", eval_fraction=0.2
    )
    assert ds.x_train.shape[1] == FEATURES  # the user column is not a feature
    offsets, _ = group_rows(ds.users_train)
    sizes = sorted(np.diff(offsets).tolist())
    held = sorted(records_of(u) for u in range(USERS))
    kept = ~held_out([f"user{u:04d}" for u in range(USERS)], 0.2, 0)  # by name (zoo.data.users)
    assert len(sizes) == kept.sum()  # whole users in the training split
    assert sorted(records_of(u) for u in np.flatnonzero(kept)) == sizes
    # the training users' record counts are a sub-multiset of the declared ones
    assert sum(sizes) + ds.x_eval.shape[0] == sum(held)
    assert max(sizes) <= HEAVIEST


def test_without_users_the_column_is_left_out():
    ds = load_dataset("skewed-users", task="classify", eval_fraction=0.2)
    assert ds.x_train.shape[1] == FEATURES and ds.users_train is None
    assert ds.num_train + ds.x_eval.shape[0] == sum(records_of(u) for u in range(USERS))


def test_the_recipe_says_how_many_records_its_users_hold():
    import re
    from pathlib import Path

    import zoo

    recipe = Path(zoo.__file__).parent / "recipes" / "skewed-users-mlp-dp.toml"
    low, high = map(int, re.search(r"a user holds (\d+) to (\d+) records", recipe.read_text()).groups())
    counts = [records_of(u) for u in range(USERS)]
    assert (low, high) == (min(counts), max(counts))
