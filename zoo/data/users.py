"""The users of a DP classifier's rows (``data.user_column``; ``dp.unit = "user"``).

A row's user is the text of its ``data.user_column`` value, read by one rule for every record,
as :mod:`zoo.data.declared` reads labels: a row with no user (an empty field, a malformed
record) is dropped like a row with no class. The column names the user and is never a feature.

The eval split holds out whole users: the users are split (``data.eval_fraction`` of them, by
the same seeded split as rows, :func:`zoo.data.arrays.split_indices`), then every row goes with
its user, so no user is in both splits. The number of users, like the number of rows, is
treated as public: the sampling rate ``q = E / N_users`` publishes it.
"""

from __future__ import annotations

import numpy as np

from zoo.data.arrays import require_column, split_indices

__all__ = ["group_rows", "split_users", "user_values"]

_NO_USER = -1


def user_values(ds, source: str, user_column: str) -> list[str | None]:
    """Each row's user: the text of its ``user_column`` value, or None (no user: dropped)."""
    require_column(ds, user_column, source, "user")
    values = ds.select_columns([user_column])[:][user_column]
    return [None if v is None or str(v) == "" else str(v) for v in values]


def split_users(
    users: list[str | None], eval_fraction: float, seed: int, source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train rows, eval rows, owner)``: the rows of the train users and of the held-out
    users (rows with no user are in neither), and each row's user id (-1: none). Users are
    numbered in the sorted order of their names, so the split does not follow the rows' order."""
    names = sorted({u for u in users if u is not None})
    number = {name: i for i, name in enumerate(names)}
    owner = np.array([number.get(u, _NO_USER) if u is not None else _NO_USER for u in users], np.int64)
    _, held = split_indices(len(names), eval_fraction, seed, source)
    is_held = np.isin(owner, held)
    train = np.flatnonzero((owner != _NO_USER) & ~is_held)
    return train, np.flatnonzero(is_held), owner


def dense_ids(owner: np.ndarray) -> np.ndarray:
    """int32 ids ``0 .. U-1`` for the users of ``owner`` (one per row), in the order of the
    original ids: the users a split keeps, numbered without gaps."""
    _, ids = np.unique(owner, return_inverse=True)
    return ids.astype(np.int32).reshape(owner.shape)


def group_rows(users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets [U+1], rows [N])``: the rows of user ``u`` are
    ``rows[offsets[u]:offsets[u + 1]]`` (in row order), for ``users`` int ``[N]`` in ``0..U-1``."""
    users = np.asarray(users, np.int64)
    rows = np.argsort(users, kind="stable")
    counts = np.bincount(users, minlength=int(users.max()) + 1 if users.size else 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, rows.astype(np.int64)
