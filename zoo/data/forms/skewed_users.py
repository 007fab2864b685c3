"""``skewed-users``: a table whose rows belong to users, drawn offline, for user-level DP.

2,000 users hold a skewed number of records each: user ``u`` holds ``1 + 40 // (1 + u % 40)``
(41 for every 40th user, 2 for most, 4.95 on average; 9,900 rows). A record is 16 standard normal
features and a label, 1 where ``x . w / 4 + b_u + noise > 0``: a rule ``w`` shared by everyone
and an offset ``b_u ~ N(0, 1)`` of the user's own, so a user's records look alike. The column
``user`` names each row's user (read under ``data.user_column = "user"``, never a feature).
Drawn from NumPy with a fixed seed: the same rows on every machine.
"""

from __future__ import annotations

import functools

import numpy as np

from zoo.data.table import Source, register_builtin

SEED = 2026
USERS = 2000
FEATURES = 16
HEAVIEST = 41  # records of the heaviest users (every 40th user)


def records_of(user: int) -> int:
    """How many records user ``user`` holds."""
    return 1 + (HEAVIEST - 1) // (1 + user % (HEAVIEST - 1))


def make_rows(seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(users int64 [N], x float32 [N, 16], y int64 [N])``, user by user."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=FEATURES)
    counts = np.array([records_of(u) for u in range(USERS)])
    users = np.repeat(np.arange(USERS), counts)
    x = rng.normal(size=(users.size, FEATURES))
    offsets = rng.normal(size=USERS)[users]
    y = (x @ w / np.sqrt(FEATURES) + offsets + 0.5 * rng.normal(size=users.size) > 0).astype(np.int64)
    return users, x.astype(np.float32), y


@functools.cache
def _skewed_users() -> Source:
    import datasets

    users, x, y = make_rows()
    columns = {"user": [f"user{u:04d}" for u in users]}
    columns |= {f"x{i}": x[:, i] for i in range(FEATURES)}
    features = datasets.Features(
        {
            "user": datasets.Value("string"),
            **{f"x{i}": datasets.Value("float32") for i in range(FEATURES)},
            "label": datasets.ClassLabel(names=["0", "1"]),
        }
    )
    rows = datasets.Dataset.from_dict({**columns, "label": y}, features=features)
    return Source(rows, text_column="text", image_column="image", label_column="label")


register_builtin(
    "skewed-users",
    "classify",
    _skewed_users,
    description=f"{USERS} users with 2 to {HEAVIEST} records each (user column 'user'), drawn with a fixed seed",
    user_column="user",
)
