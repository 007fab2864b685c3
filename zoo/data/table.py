"""The dataset table: every form a ``data.dataset`` spec takes is one row, and found here.

A row is a named dataset (``digits``, ``mnist``, ...) or a scheme whose spec is
``SCHEME:REST`` (``hf:NAME``, ``csv:PATH``, ...), with its reader, the tasks it serves, a
one-line description and whether it reads without a network. Each module of
``zoo.data.forms`` registers its rows when imported, and :func:`forms` imports them all the
first time the table is read, so a new dataset is a new module and nothing else. The CLI
help, the "unknown dataset" error and the Hub's offline alternatives are read off the table.

Nothing here imports `datasets`: ``zoo train --help`` lists the forms without loading it
(a reader imports what it needs when it runs).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zoo.data.dataset import TASKS
from zoo.data.errors import DatasetError

if TYPE_CHECKING:
    import datasets

FORMS_PACKAGE = "zoo.data.forms"
ROW_SEPARATOR = "\n"  # between rows of text files, csv/parquet and hf text columns


@dataclass(frozen=True)
class Columns:
    """The column names a spec's rows are read by (``data.text_column``, ...)."""

    text: str = "text"
    image: str = "image"
    label: str = "label"
    private: bool = False  # a DP run: a CSV's records are read by one rule (zoo.data.records)
    user: str | None = None  # data.user_column: the column naming each record's user


@dataclass(frozen=True)
class Source:
    """What a spec reads: the rows plus the column names to use for them."""

    rows: datasets.Dataset
    text_column: str
    image_column: str
    label_column: str
    separator: str = ROW_SEPARATOR
    eval_rows: datasets.Dataset | None = None  # an official test split: eval there, not on a slice of rows
    notice: str | None = None  # the line a run says about these rows (text: is tokenized in memory)
    user_column: str | None = None  # the column naming each row's user (zoo.data.users)


Reader = Callable[[str, str, Columns], Source]  # (the whole spec, the part after "SCHEME:", columns)


@dataclass(frozen=True)
class DatasetForm:
    """One row of the table: how a spec of this form is written and read."""

    name: str  # the dataset's name, or the scheme before the ':'
    usage: str  # how a spec is written: "digits", "csv:PATH"
    tasks: tuple[str, ...]  # the tasks it serves, of TASKS
    read: Reader
    description: str  # one line, for listings
    offline: bool  # reads without a network
    # (spec, rest, text_column, piece_chars) -> zoo.data.tokens.documents.DocumentStream: how
    # zoo tokenize streams its documents; None: not a text source to tokenize
    documents: Callable | None = None
    users: bool = False  # a DP run's records name their user (data.user_column, zoo.data.users)
    # The one data.user_column the form reads its users by ("file" for text:, each file one
    # user); None: any column of its rows.
    user_column: str | None = None

    @property
    def is_scheme(self) -> bool:
        """A ``SCHEME:REST`` form, not a dataset known by name."""
        return self.usage != self.name


_FORMS: dict[str, DatasetForm] = {}
_imported = False


def register_form(form: DatasetForm) -> DatasetForm:
    """Add ``form`` to the table (ValueError if its name is taken or a field is malformed)."""
    if form.name in _FORMS:
        raise ValueError(f"dataset form {form.name!r} is taken")
    if not form.name or ":" in form.name or form.usage.partition(":")[0] != form.name:
        raise ValueError(f"dataset form {form.name!r}: a name has no ':' and starts its usage {form.usage!r}")
    if not form.tasks or any(t not in TASKS for t in form.tasks):
        raise ValueError(
            f"dataset form {form.name!r}: unknown task in {form.tasks!r}. Valid: {', '.join(TASKS)}."
        )
    if not form.description.strip() or "\n" in form.description:
        raise ValueError(f"dataset form {form.name!r} needs a one-line description")
    _FORMS[form.name] = form
    return form


def register_builtin(
    name: str,
    task: str,
    read: Callable[[], Source],
    *,
    description: str,
    offline: bool = True,
    user_column: str | None = None,
) -> DatasetForm:
    """Make ``name`` a dataset spec: ``read()`` returns its rows (cache it; it is called on
    every load), ``task`` is the only task it serves. ``user_column``: the column naming each
    row's user, read under ``data.user_column``, and left out of the rows otherwise (it is never
    a feature)."""
    if ":" in name:
        raise ValueError(f"builtin dataset {name!r} has a ':'")

    def reader(spec, rest, columns):
        source = read()
        if user_column is None:
            return source
        if columns.user is None:
            return dataclasses.replace(source, rows=source.rows.remove_columns([user_column]))
        return dataclasses.replace(source, user_column=columns.user)

    form = DatasetForm(
        name,
        name,
        (task,),
        reader,
        description,
        offline,
        users=user_column is not None,
        user_column=user_column,
    )
    return register_form(form)


def unregister(name: str) -> None:
    """Drop ``name`` from the table (tests register toy rows)."""
    _FORMS.pop(name, None)


def import_forms(package: str = FORMS_PACKAGE) -> tuple[str, ...]:
    """Import every module of ``package`` (each registers its rows); returns their names."""
    paths = importlib.import_module(package).__path__
    found = sorted(info.name for info in pkgutil.iter_modules(paths) if not info.name.startswith("_"))
    for name in found:
        importlib.import_module(f"{package}.{name}")
    return tuple(found)


def forms() -> tuple[DatasetForm, ...]:
    """Every row: the datasets known by name, then the schemes, each in name order (not in
    the order their modules happened to be imported)."""
    global _imported
    if not _imported:
        import_forms()
        _imported = True
    return tuple(sorted(_FORMS.values(), key=lambda f: (f.is_scheme, f.name)))


def dataset_kinds() -> tuple[str, ...]:
    """How each form is written: the names, then the schemes (``"csv:PATH"``)."""
    return tuple(f.usage for f in forms())


def valid_forms() -> str:
    """The forms as one comma-separated line, for messages."""
    return ", ".join(dataset_kinds())


def offline_forms() -> tuple[str, ...]:
    """The forms that read without a network (what to use when the Hub is out of reach)."""
    return tuple(f.usage for f in forms() if f.offline)


def document_forms() -> tuple[DatasetForm, ...]:
    """The forms ``zoo tokenize`` reads (those with a ``documents`` reader)."""
    return tuple(f for f in forms() if f.documents is not None)


def dataset_help() -> str:
    """The ``--dataset`` flag's help: every form."""
    return f"a dataset name or SCHEME:SOURCE: {valid_forms()}"


def lookup(spec: str) -> tuple[DatasetForm, str]:
    """The row ``spec`` is written in and the rest of it after ``SCHEME:`` ("" for a name);
    DatasetError, with close matches and the valid forms, if it is neither."""
    rows = {f.name: f for f in forms()}
    if spec in rows and not rows[spec].is_scheme:
        return rows[spec], ""
    scheme, sep, rest = spec.partition(":")
    if sep and scheme in rows and rows[scheme].is_scheme:
        return rows[scheme], rest
    raise _unknown_spec(spec, rows)


def _unknown_spec(spec: str, rows: dict[str, DatasetForm]) -> DatasetError:
    schemes = [n for n, f in rows.items() if f.is_scheme]
    if ":" in spec:
        scheme, rest = spec.split(":", 1)
        close = [f"{s}:{rest}" for s in difflib.get_close_matches(scheme, schemes, n=2, cutoff=0.5)]
    else:
        names = [n for n, f in rows.items() if not f.is_scheme]
        close = difflib.get_close_matches(spec, names, n=2, cutoff=0.6)
        if not close and spec.strip() and " " not in spec and "hf" in schemes:
            close = [f"hf:{spec}"]
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return DatasetError(f"unknown dataset {spec!r}.{hint} Valid forms: {valid_forms()}.")
