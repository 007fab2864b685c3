"""Users (zoo.data.users): a DP classifier's user column names users and is not a feature, rows
with no user are dropped, and the eval split holds out whole users; a language model's users
(each file of text:DIR, or a user column) hold out whole users too, and each window is cut
from one user's own text."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from zoo.data import load_dataset
from zoo.data.forms.schemes import read_text
from zoo.data.table import Columns
from zoo.data.users import FILE_USERS, group_rows, held_out, split_users

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


def as_parquet(spec: str) -> str:
    """The table of ``csv:PATH`` as a parquet file of typed columns."""
    import pandas as pd

    path = spec.partition(":")[2]
    pd.read_csv(path).to_parquet(path + ".parquet")
    return f"parquet:{path}.parquet"


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_the_eval_split_holds_out_whole_users(tmp_path, kind):
    spec = write_table(tmp_path)
    ds = load(spec if kind == "csv" else as_parquet(spec))
    train_users = set(ds.x_train[:, 0].tolist())
    eval_users = set(ds.x_eval[:, 0].tolist())
    assert train_users and eval_users and not train_users & eval_users
    assert len(train_users | eval_users) == USERS
    held = held_out([f"u{user}" for user in range(USERS)], 0.2, 0)
    assert eval_users == {float(user) for user in np.flatnonzero(held)}


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


# Issue 60, item 2: one user's records, malformed or gone, move no other user between the splits.
LONE = 10  # user u10 holds one record (1 + 10 % 5)
NEIGHBOURS = {
    "removed": None,
    "a field too many": b"u10,10,0.5,0,9",
    "too few fields": b"u10,10",
    "an empty user field": b",10,0.5,0",
    "a byte that is not UTF-8": b"u10\xe9,10,0.5,0",
}


def write_neighbour(tmp_path, record: bytes | None) -> str:
    """``write_table``'s table with user ``LONE``'s one record replaced by ``record`` (None: left out)."""
    lines = write_table(tmp_path).partition(":")[2]
    rows = [r for r in open(lines, "rb").read().splitlines() if not r.startswith(b"u10,")]
    path = tmp_path / "neighbour.csv"
    path.write_bytes(b"\n".join([*rows, *([record] if record is not None else [])]) + b"\n")
    return f"csv:{path}"


def by_user(x: np.ndarray) -> dict[float, list]:
    rows: dict[float, list] = {}
    for row in x.tolist():
        rows.setdefault(row[0], []).append(row)
    return rows


@pytest.mark.parametrize("case", list(NEIGHBOURS))
def test_one_users_malformed_or_missing_record_moves_no_other_user(tmp_path, case):
    """Each pair: the table, and the table with user ``LONE``'s only record malformed (it
    becomes a row of missing values, its user column too) or gone. Every other user keeps its
    side and its rows. Planted: users split by their position in the list (the split before
    issue 60) moves about a quarter of them."""
    plain = load(write_table(tmp_path))
    other = load(write_neighbour(tmp_path, NEIGHBOURS[case]))
    for split in ("x_train", "x_eval"):
        a, b = by_user(getattr(plain, split)), by_user(getattr(other, split))
        a.pop(float(LONE), None), b.pop(float(LONE), None)
        assert a == b, (split, sorted(set(a) ^ set(b)))


def test_held_out_depends_on_a_users_name_and_the_seed_only():
    names = [f"person-{i}" for i in range(400)]
    held = held_out(names, 0.25, 3)
    assert held.tolist() == [bool(held_out([name], 0.25, 3)[0]) for name in names]
    assert held.tolist() == held_out(names[::-1], 0.25, 3)[::-1].tolist()  # not the order
    assert held.tolist() != held_out(names, 0.25, 4).tolist()  # the seed keys the hash
    assert 0.15 < held.mean() < 0.35


def test_group_rows_lists_each_users_rows():
    users = np.array([2, 0, 2, 1, 0, 2])
    offsets, rows = group_rows(users)
    assert offsets.tolist() == [0, 2, 3, 6]
    assert [sorted(rows[offsets[u] : offsets[u + 1]].tolist()) for u in range(3)] == [[1, 4], [3], [0, 2, 5]]


# -- a language model's users: each file (or user column value) one segment of windows ---------
SEQ = 8
LETTERS = "abcdefghij"


def user_text(user: int) -> str:
    """A user's text: its own letter only, so a window tells whose text it holds."""
    return "".join(LETTERS[user] * (4 + (line + user) % 7) + "\n" for line in range(3 + user))


def text_dir(tmp_path) -> tuple[str, dict[str, str]]:
    """``text:DIR`` of one file per user; the users' names (each file's path inside DIR) and
    texts. Users ``08`` and ``09`` live in a subfolder."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    texts = {}
    for user in range(len(LETTERS)):
        name = f"{'sub/' if user >= 8 else ''}{user:02d}.txt"
        (root / name).write_text(user_text(user))
        texts[name] = user_text(user)
    return f"text:{root}", texts


def text_table(tmp_path, kind: str = "csv") -> tuple[str, dict[str, str]]:
    """``csv:`` (or ``parquet:``) rows ``text,user``: a user's documents are its rows (its
    lines, interleaved with other users' rows); its text is them joined by newlines, in order."""
    rows = [(line, f"u{user}") for user in range(len(LETTERS)) for line in user_text(user).splitlines()]
    rows.sort(key=lambda row: (len(row[0]), row[1]))  # users interleaved, each in its own order
    path = tmp_path / f"docs.{kind}"
    if kind == "csv":
        path.write_text("text,user\n" + "".join(f"{text},{user}\n" for text, user in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [t for t, _ in rows], "user": [u for _, u in rows]}), path)
    texts = {name: "\n".join(t for t, u in rows if u == name) for name in {u for _, u in rows}}
    return f"{kind}:{path}", texts


def load_lm(spec: str, column: str):
    from zoo.data import CharTokenizer

    tok = CharTokenizer.utf8_bytes()
    return load_dataset(spec, task="lm", private=True, user_column=column, eval_fraction=0.2, tokenizer=tok)


def letters(ds, ids) -> set[str]:
    return set(ds.tokenizer.decode(np.asarray(ids))) - {"\n"}


SOURCES = {
    "text:DIR": (text_dir, "file"),
    "csv": (text_table, "user"),
    "parquet": (lambda tmp_path: text_table(tmp_path, "parquet"), "user"),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_an_lm_holds_out_whole_users(tmp_path, source):
    """Planted: the eval split as the stream's last tokens (lm_cut) puts a user in both."""
    make, column = SOURCES[source]
    spec, texts = make(tmp_path)
    ds = load_lm(spec, column)
    held, kept = letters(ds, ds.x_eval), letters(ds, ds.x_train)
    assert not held & kept and held | kept == set(LETTERS)
    names = sorted(texts)
    assert held == {texts[n][0] for n, out in zip(names, held_out(names, 0.2, 0), strict=True) if out}


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_lm_window_is_a_window_of_its_users_own_text(tmp_path, source):
    """Each record is the ``j``-th window of ``seq_len + 1`` tokens of one training user's text
    (its file, or its rows joined), and names that user: none mixes two users.
    Planted: windows at stride ``seq_len`` over the whole train stream cross users."""
    make, column = SOURCES[source]
    spec, texts = make(tmp_path)
    ds = load_lm(spec, column)
    held = letters(ds, ds.x_eval)
    names = sorted(name for name, text in texts.items() if text[0] not in held)  # ids: name order
    expected = []
    for user, name in enumerate(names):
        data = texts[name].encode()
        expected += [(user, data[j * SEQ : j * SEQ + SEQ + 1]) for j in range((len(data) - 1) // SEQ)]
    kind = ds.task_type
    count = kind.num_records(ds, SEQ)
    batch = kind.examples(ds, np.arange(count), np.ones(count, np.float32), SEQ)
    windows = np.concatenate([batch["x"], batch["y"][:, -1:]], axis=1)
    found = [
        (int(u), ds.tokenizer.decode(w).encode())
        for u, w in zip(kind.record_users(ds, SEQ), windows, strict=True)
    ]
    assert found == expected


def test_a_text_corpus_gives_the_same_users_and_split_wherever_it_lies(tmp_path):
    """Issue 67, item 2: a file's user was named by its absolute path, so the same files under
    another parent drew another split (19 training users against 15 in the sweep). A user is
    now its path inside the folder the spec names: the same names, split and streams."""
    spec, texts = text_dir(tmp_path / "here")
    elsewhere = tmp_path / "there" / "copy" / "corpus"
    shutil.copytree(spec.partition(":")[2], elsewhere)
    columns = Columns(private=True, user=FILE_USERS)
    for where in (spec, f"text:{elsewhere}"):
        rows = read_text(where, where.partition(":")[2], columns).rows
        assert sorted(rows[FILE_USERS]) == sorted(texts), where
    a, b = load_lm(spec, "file"), load_lm(f"text:{elsewhere}", "file")
    for field in ("x_train", "x_eval", "users_train", "segments_train"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_files_named_one_by_one_are_named_from_their_common_folder(tmp_path):
    spec, texts = text_dir(tmp_path)
    root = spec.partition(":")[2]
    rest = f"{root}/00.txt,{root}/sub"  # a file and a folder: named from the folder holding both
    rows = read_text(f"text:{rest}", rest, Columns(private=True, user=FILE_USERS)).rows
    assert list(rows[FILE_USERS]) == ["00.txt", "sub/08.txt", "sub/09.txt"]
    one = f"{root}/sub/09.txt"  # a file named alone: its name
    assert list(read_text(f"text:{one}", one, Columns(private=True, user=FILE_USERS)).rows[FILE_USERS]) == [
        "09.txt"
    ]
