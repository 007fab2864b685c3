"""The schemes: a spec ``SCHEME:REST`` reads the Hub (``hf:``), local files (``text:``,
``csv:``, ``parquet:``) or a directory of idx files (``idx:``)."""

from __future__ import annotations

import os

from zoo.data.errors import DatasetError
from zoo.data.table import Columns, DatasetForm, Source, register_form, valid_forms


def train_rows(loaded, spec: str):
    """The ``train`` split of a `datasets` load (the only split when there is one)."""
    import datasets

    if isinstance(loaded, datasets.Dataset):
        return loaded
    if "train" in loaded:
        return loaded["train"]
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    raise DatasetError(f"{spec!r} has no 'train' split. Splits: {', '.join(loaded)}.")


def read_hub(spec: str, rest: str, columns: Columns) -> Source:
    from zoo.data.hub import load_hub

    name, _, config = rest.partition(":")
    if not name.strip():
        raise DatasetError(f"{spec!r} names no dataset; use hf:NAME[:CONFIG], e.g. hf:mnist")
    rows = train_rows(load_hub(spec, name.strip(), config.strip() or None), spec)
    return Source(rows, columns.text, columns.image, columns.label, user_column=columns.user)


IN_MEMORY = (  # the same line for every corpus: under DP no notice may depend on the records
    "{spec} is read and tokenized in memory (several times its size in RAM); a corpus over about "
    "100 MB trains from a token store instead: zoo tokenize SRC --out DIR, then tokens:DIR (docs/data.md)"
)


def read_text(spec: str, rest: str, columns: Columns) -> Source:
    """``text:PATH[,PATH...]``, a directory standing for its files (as ``zoo tokenize`` reads
    them): each file one row. Under DP every file is read by one rule, a byte that is not UTF-8
    read as U+FFFD and a path that is not a regular file as empty (refusing the file would
    depend on it: :func:`_private_text`); outside DP such a file is refused in one line naming
    it. ``data.user_column = "file"`` (under DP only): each file is one user, named by its path
    relative to the folder the spec names (:func:`~zoo.data.tokens.documents.source_root`), so
    the same corpus gives the same users, and the same split, wherever it lies
    (:data:`zoo.data.users.FILE_USERS`)."""
    from zoo.data.files import load_local
    from zoo.data.tokens.documents import source_paths, source_root
    from zoo.data.users import FILE_USERS

    paths = [os.path.abspath(path) for path in source_paths(spec, rest, keep_special=columns.private)]
    notice = IN_MEMORY.format(spec=spec)
    if not columns.private:
        rows = train_rows(load_local(spec, "text", paths, sample_by="document"), spec)
        return Source(rows, "text", columns.image, columns.label, notice=notice)
    import datasets

    texts = [_private_text(path) for path in paths]
    root = source_root(rest)
    users = [os.path.relpath(path, root).replace(os.sep, "/") for path in paths]
    rows = datasets.Dataset.from_dict({"text": texts, FILE_USERS: users})
    return Source(rows, "text", columns.image, columns.label, notice=notice, user_column=columns.user)


def _private_text(path: str) -> str:
    """A DP run's text of one file, by one rule for every file: a byte that is not UTF-8 is
    U+FFFD, and a path that is not a regular readable file (a FIFO, whose ``open`` would wait
    forever, a dangling link, a file it may not read) is empty text, so its user gives no record,
    as a user whose rows are all dropped. No refusal, so nothing depends on which file it was."""
    from zoo.data.files import not_a_file

    if not_a_file(path) is not None:
        return ""
    try:  # universal newlines, as `datasets`' text builder reads a file
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_table(spec: str, rest: str, columns: Columns) -> Source:
    """``csv:PATH`` or ``parquet:PATH``: the builder is the scheme; a DP run's CSV is read by
    :func:`zoo.data.records.read_csv_records` (a malformed record: a row to drop, not an error)."""
    from zoo.data.files import load_local, local_paths

    builder = spec.partition(":")[0]
    paths = local_paths(spec, rest, many=False, forms=valid_forms())
    if builder == "csv" and columns.private:  # one rule for every record, malformed or not
        from zoo.data.records import read_csv_records

        rows = read_csv_records(spec, paths[0])
        return Source(rows, columns.text, columns.image, columns.label, user_column=columns.user)
    return Source(
        train_rows(load_local(spec, builder, paths), spec),
        columns.text,
        columns.image,
        columns.label,
        user_column=columns.user,
    )


def read_idx_dir(spec: str, rest: str, columns: Columns) -> Source:
    """The four MNIST-style idx files of a directory: the official train and test splits."""
    from zoo.data.idx import image_rows, read_split_dir

    train_x, train_y, test_x, test_y = read_split_dir(os.path.abspath(os.path.expanduser(rest.strip())))
    return Source(
        image_rows(train_x, train_y), "text", "image", "label", eval_rows=image_rows(test_x, test_y)
    )


BOTH = ("classify", "lm")


def _scheme(
    name: str,
    usage: str,
    tasks: tuple[str, ...],
    read,
    description: str,
    offline: bool = True,
    documents=None,
    users: bool = False,
    user_column: str | None = None,
):
    register_form(DatasetForm(name, usage, tasks, read, description, offline, documents, users, user_column))


def _documents(name: str):
    """The ``zoo tokenize`` reader ``name`` of ``zoo.data.tokens.documents``, imported when used."""

    def read(spec: str, rest: str, text_column: str, piece_chars: int):
        from zoo.data.tokens import documents

        return getattr(documents, name)(spec, rest, text_column, piece_chars)

    return read


_scheme(
    "hf",
    "hf:NAME[:CONFIG]",
    BOTH,
    read_hub,
    "a Hugging Face Hub dataset, e.g. hf:mnist",
    offline=False,
    documents=_documents("hub_documents"),
    users=True,
)
_scheme(
    "text",
    "text:PATH[,PATH...]",
    ("lm",),
    read_text,
    "local text files (a directory: its files); {stdlib} is the standard library",
    documents=_documents("text_documents"),
    users=True,
    user_column="file",  # zoo.data.users.FILE_USERS: each file one user
)
_scheme("csv", "csv:PATH", BOTH, read_table, "a local CSV table with named columns", users=True)
_scheme(
    "parquet",
    "parquet:PATH",
    BOTH,
    read_table,
    "a local parquet table with named columns",
    users=True,
    documents=_documents("parquet_documents"),
)
_scheme("idx", "idx:DIR", ("classify",), read_idx_dir, "a directory of the four MNIST-style idx files")
