"""The users of a DP classifier's rows (``data.user_column``; ``dp.unit = "user"``).

A row's user is the text of its ``data.user_column`` value, read by one rule for every record,
as :mod:`zoo.data.declared` reads labels: a row with no user (an empty field, a malformed
record) is dropped like a row with no class. The column names the user and is never a feature.

The eval split holds out whole users: a user is held out when a keyed hash of its name (keyed
with the run's seed) falls below ``data.eval_fraction`` (:func:`held_out`), then every row goes
with its user, so no user is in both splits. Which side a user is on depends on its name alone:
adding or removing a user, or malforming its records, moves no other user. The number of users, like the number of rows, is
treated as public: the sampling rate ``q = E / N_users`` publishes it.

A language model's users (:func:`lm_by_user`) are read the same way: a row is a document, with
its text and its user; ``text:PATH`` names each file's user by its path inside the folder the
spec names (the same corpus, the same users wherever it lies)
(``data.user_column = "file"``, :data:`FILE_USERS`). Each user's documents, joined in order,
are tokenized on their own into one segment of the train stream, and the windows DP counts are
cut per segment (:mod:`zoo.data.windows`), so a window never holds two users' text. The eval
stream is the held-out users' text, joined. A user whose text is shorter than one window gives
no record and is not counted, as a user whose rows are all dropped.
"""

from __future__ import annotations

import hashlib

import numpy as np

from zoo.data.arrays import require_column, text_values
from zoo.data.dataset import Dataset, LanguageModel
from zoo.data.errors import DatasetError
from zoo.data.tokenizer import CharTokenizer

__all__ = ["FILE_USERS", "dense_ids", "group_rows", "held_out", "lm_by_user", "split_users", "user_values"]

_NO_USER = -1
FILE_USERS = (
    "file"  # data.user_column of text:PATH: each file one user, named by its path in the spec's folder
)


def user_values(ds, source: str, user_column: str) -> list[str | None]:
    """Each row's user: the text of its ``user_column`` value, or None (no user: dropped)."""
    require_column(ds, user_column, source, "user")
    values = ds.select_columns([user_column])[:][user_column]
    return [None if v is None or str(v) == "" else str(v) for v in values]


def held_out(names: list[str], eval_fraction: float, seed: int) -> np.ndarray:
    """bool ``[len(names)]``: whether each user is held out for eval. A user is held out when
    a keyed hash of its name (BLAKE2b keyed with ``seed``) falls below ``eval_fraction``: a
    function of the name, the seed and the fraction alone, so adding, removing or malforming
    one user's records moves no other user between the splits (the number held out is
    ``Binomial(N_users, eval_fraction)``, not a fixed share)."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1) to hold out users; got {eval_fraction!r}")
    key = int(seed).to_bytes(8, "little", signed=True)
    draws = [
        int.from_bytes(
            hashlib.blake2b(name.encode("utf-8", "surrogatepass"), key=key, digest_size=8).digest(), "little"
        )
        for name in names
    ]
    return np.array([d / 2.0**64 < eval_fraction for d in draws], dtype=bool)


def split_users(
    users: list[str | None], eval_fraction: float, seed: int, source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train rows, eval rows, owner)``: the rows of the train users and of the held-out
    users (rows with no user are in neither), and each row's user id (-1: none). Users are
    numbered in the sorted order of their names; which are held out is :func:`held_out`'s
    hash of each name, never their position, so no user's records move another user."""
    names = sorted({u for u in users if u is not None})
    number = {name: i for i, name in enumerate(names)}
    owner = np.array([number.get(u, _NO_USER) if u is not None else _NO_USER for u in users], np.int64)
    try:
        held = np.flatnonzero(held_out(names, eval_fraction, seed))
    except ValueError as error:
        raise DatasetError(f"cannot hold out users of {source!r}: {error}") from None
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


def _user_texts(texts: list, owner: np.ndarray, rows: np.ndarray, separator: str) -> list[str]:
    """The text of each user of ``rows`` (its documents in row order, joined; a missing text
    is skipped), users in the order of their ids."""
    by_user: dict[int, list[str]] = {}
    for row in rows.tolist():
        own = by_user.setdefault(int(owner[row]), [])
        if texts[row] is not None:
            own.append(texts[row])
    return [separator.join(by_user[user]) for user in sorted(by_user)]


def _encode_each(tokenizer, texts: list[str]) -> list[np.ndarray]:
    many = getattr(tokenizer, "encode_batch", None)  # a BPE tokenizer encodes on its threads
    found = many(texts) if many is not None and texts else [tokenizer.encode(t) for t in texts]
    return [np.asarray(ids, np.int32) for ids in found]


def lm_by_user(spec: str, src, seed: int, eval_fraction: float, tokenizer, private: bool) -> Dataset:
    """A language model's :class:`zoo.data.dataset.Dataset` whose train stream is one segment per
    training user (module docstring); ``tokenizer`` None: one fitted on the whole text."""
    if src.eval_rows is not None:
        raise DatasetError(f"{spec!r} has its own eval split: users cannot be held out of it")
    users = user_values(src.rows, spec, src.user_column)
    texts = text_values(src.rows, source=spec, text_column=src.text_column, private=private)
    train, held, owner = split_users(users, eval_fraction, seed, spec)
    own = _user_texts(texts, owner, train, src.separator)
    eval_text = src.separator.join(_user_texts(texts, owner, held, src.separator))
    if tokenizer is None:
        tokenizer = CharTokenizer.fit(src.separator.join([*own, eval_text]))
    segments = _encode_each(tokenizer, own)
    bounds = np.concatenate([[0], np.cumsum([len(ids) for ids in segments])]).astype(np.int64)
    return Dataset(
        name=spec,
        task=LanguageModel.name,
        x_train=np.concatenate([np.zeros(0, np.int32), *segments]),
        y_train=None,
        x_eval=tokenizer.encode(eval_text).astype(np.int32),
        y_eval=None,
        tokenizer=tokenizer,
        notice=src.notice,
        users_train=np.arange(len(segments), dtype=np.int32),
        segments_train=bounds,
    )
