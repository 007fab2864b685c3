"""A DP classifier's users (zoo.data.users): the user column names users and is not a
feature, rows with no user are dropped, and the eval split holds out whole users."""

from __future__ import annotations

import numpy as np

from zoo.data import load_dataset
from zoo.data.users import group_rows, split_users

USERS = 30


def write_table(tmp_path, extra: list[str] = ()) -> str:
    """``user,uid,b,label``: ``uid`` is the user's number as a feature, so a test can tell
    which user a loaded row came from."""
    rng = np.random.default_rng(0)
    lines = ["user,uid,b,label"]
    for user in range(USERS):
        for _ in range(1 + user % 5):
            lines.append(f"u{user},{user},{rng.normal():.3f},{user % 2}")
    path = tmp_path / "users.csv"
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return f"csv:{path}"


def load(spec: str):
    return load_dataset(
        spec, task="classify", classes=(0, 1), private=True, user_column="user", eval_fraction=0.2
    )


def test_the_eval_split_holds_out_whole_users(tmp_path):
    ds = load(write_table(tmp_path))
    train_users = set(ds.x_train[:, 0].tolist())
    eval_users = set(ds.x_eval[:, 0].tolist())
    assert train_users and eval_users and not train_users & eval_users
    assert len(train_users | eval_users) == USERS and len(eval_users) == round(0.2 * USERS)


def test_the_user_column_is_not_a_feature_and_names_each_training_rows_user(tmp_path):
    ds = load(write_table(tmp_path))
    assert ds.num_features == 2  # uid and b; not the user's name
    ids = ds.users_train
    assert ids.shape == (ds.num_train,) and ids.min() == 0 and ids.max() == len(set(ds.x_train[:, 0])) - 1
    for user in np.unique(ids):  # one id per user, one user per id
        assert len(set(ds.x_train[ids == user, 0].tolist())) == 1


def test_a_row_with_no_user_is_dropped_like_a_row_with_no_class(tmp_path):
    """A row whose user field is empty is dropped, silently, and no other row moves (the users are the same)."""
    with_blank = load(write_table(tmp_path, [",99,0.5,1"]))
    plain = load(write_table(tmp_path))
    assert 99.0 not in set(with_blank.x_train[:, 0]) | set(with_blank.x_eval[:, 0])
    for name in ("x_train", "y_train", "x_eval", "users_train"):
        np.testing.assert_array_equal(getattr(with_blank, name), getattr(plain, name), err_msg=name)


def test_split_users_is_a_split_of_users_not_of_rows():
    """Planted: a row-level split of the same rows puts some user in both splits."""
    owners = [f"u{i % 12}" for i in range(120)]
    train, held, owner = split_users(owners, 0.25, 0, "t")
    assert not set(owner[train]) & set(owner[held])
    from zoo.data.arrays import split_indices

    rows_train, rows_held = split_indices(len(owners), 0.25, 0, "t")
    assert set(owner[rows_train]) & set(owner[rows_held])


def test_group_rows_lists_each_users_rows():
    users = np.array([2, 0, 2, 1, 0, 2])
    offsets, rows = group_rows(users)
    assert offsets.tolist() == [0, 2, 3, 6]
    assert [sorted(rows[offsets[u] : offsets[u + 1]].tolist()) for u in range(3)] == [[1, 4], [3], [0, 2, 5]]
