"""The documents of a text source, streamed in pieces of bounded size: ``text:`` files and
directories (a file is a document), ``parquet:`` files (a row is a document) and ``hf:`` Hub
datasets in streaming mode (a row is a document).

Every source yields :class:`Piece` s: a document longer than ``piece_chars`` characters comes in
several, cut after a newline where there is one (a BPE tokenizer then sees whole lines), so
memory stays bounded by the piece size whatever the size of a file or a row.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zoo.data.errors import DatasetError

SPLITS = ("auto", "documents", "tail")  # zoo tokenize --split: zoo.data.tokens.build.choose_split
PIECE_CHARS = 1 << 22  # characters of one piece: about 4 MB of text


@dataclass(frozen=True)
class Piece:
    text: str
    starts_document: bool  # the first piece of a document
    done: int  # units of the source read so far (bytes of files, or rows)


@dataclass(frozen=True)
class DocumentStream:
    """A source's pieces, and how far along they are: ``total`` ``unit`` s (None: unknown)."""

    spec: str
    unit: str  # "bytes" or "rows"
    total: int | None
    pieces: Iterator[Piece]
    documents: int | None = None  # how many documents it names, when known before reading


def cut(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, each ending after its last newline
    when it has one."""
    out = []
    while len(text) > limit:
        end = text.rfind("\n", 0, limit) + 1 or limit
        out.append(text[:end])
        text = text[end:]
    return [*out, text] if text or not out else out


def _named(rest: str) -> list[tuple[str, Path]]:
    """The entries ``rest`` names, comma-separated: each as written and as a path."""
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    stdlib = sysconfig.get_paths()["stdlib"]
    return [(part, Path(part.replace("{stdlib}", stdlib)).expanduser()) for part in parts]


def source_root(rest: str) -> Path:
    """The absolute folder the entries of ``rest`` are named from: the deepest folder holding
    each of them (a directory named alone is its own root; a file named alone, its folder).
    It comes from the entries as named, never from the files found in them, so adding a file
    moves no other file's name relative to it."""
    named = [Path(os.path.abspath(path)) for _, path in _named(rest)]
    root = Path(os.path.commonpath(named))
    return root if root.is_dir() else root.parent


def source_paths(spec: str, rest: str, suffix: str | None = None, keep_special: bool = False) -> list[Path]:
    """The files ``rest`` names (comma-separated; a directory stands for its files, walked in
    name order, hidden ones left out; with ``suffix``, only files ending so). An entry that is
    not a regular file (a FIFO, a socket, a dangling link: :func:`zoo.data.files.not_a_file`)
    is refused in one line naming it, or with ``keep_special`` (a DP run, which reads it as
    empty: :func:`zoo.data.forms.schemes.read_text`) kept like any other."""
    from zoo.data.files import not_a_file

    parts = _named(rest)
    if not parts:
        raise DatasetError(f"{spec!r} names no file; write {spec.partition(':')[0]}:PATH[,PATH...]")
    found: list[Path] = []
    for part, path in parts:
        if path.is_dir():
            inside = sorted(
                Path(top, name)
                for top, dirs, names in os.walk(path)
                for name in names
                if not name.startswith(".") and (suffix is None or name.endswith(suffix))
                if not any(d.startswith(".") for d in Path(top).relative_to(path).parts)
            )
            if not inside:
                kind = f"{suffix} files" if suffix else "files"
                raise DatasetError(f"{spec!r}: the directory {part!r} holds no {kind}")
            found += inside
        elif path.is_file() or path.is_symlink() or path.exists():
            found.append(path)
        else:
            raise DatasetError(f"{spec!r}: file not found: {part!r}")
    for path in [] if keep_special else found:
        special = not_a_file(path)
        if special is not None:
            raise DatasetError(
                f"{spec!r}: {str(path)!r} is {special}, not a file to read; remove it or name the files"
            )
    return found


def _text_pieces(spec: str, paths: list[Path], limit: int) -> Iterator[Piece]:
    """Each file a document, read ``limit`` characters at a time; the pieces are :func:`cut`'s
    of the whole file, while at most twice ``limit`` characters are held."""
    done = 0
    for path in paths:
        first, held = True, ""
        try:
            with open(path, encoding="utf-8") as f:  # newlines as `datasets`' text builder reads them
                while block := f.read(limit):
                    held += block
                    while len(held) > limit:
                        end = held.rfind("\n", 0, limit) + 1 or limit
                        yield Piece(held[:end], first, done + f.buffer.tell())
                        first, held = False, held[end:]
        except UnicodeDecodeError as error:
            raise DatasetError(
                f"{spec!r}: {path}: not UTF-8 text (byte 0x{error.object[error.start]:02x}). "
                "Convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
            ) from None
        done += path.stat().st_size
        if held or first:
            yield Piece(held, first, done)


def _row_pieces(rows: Iterator[str | None], limit: int) -> Iterator[Piece]:
    for count, text in enumerate(rows, 1):
        if text is None:  # a missing row is skipped, as the in-memory path does
            continue
        for i, piece in enumerate(cut(text, limit)):
            yield Piece(piece, i == 0, count)


def _parquet_rows(spec: str, paths: list[Path], column: str) -> Iterator[str | None]:
    import pyarrow.parquet as pq

    for path in paths:
        try:
            table = pq.ParquetFile(path)
        except Exception as error:
            raise DatasetError(
                f"{spec!r}: {path}: not a parquet file ({' '.join(str(error).split())})"
            ) from None
        names = table.schema_arrow.names
        if column not in names:
            raise DatasetError(
                f"{spec!r}: {path} has no column {column!r}; columns: {', '.join(names)} (--text-column)"
            )
        kind = str(table.schema_arrow.field(column).type)
        if kind not in ("string", "large_string"):
            raise DatasetError(f"{spec!r}: {path}: column {column!r} is {kind}, not text")
        for batch in table.iter_batches(batch_size=1024, columns=[column]):
            yield from batch.column(0).to_pylist()


def _hub_rows(spec: str, rest: str, column: str) -> Iterator[str | None]:
    """The ``train`` split of a Hub dataset (or a local dataset folder), streamed."""
    import datasets

    from zoo.data.hub import offline_error, offline_flag, unreachable_reason

    name, _, config = rest.partition(":")
    if not name.strip():
        raise DatasetError(f"{spec!r} names no dataset; use hf:NAME[:CONFIG]")
    if not Path(name).expanduser().is_dir():
        flag = offline_flag()
        reason = (
            flag if flag and not datasets.config.HF_HUB_OFFLINE else (None if flag else unreachable_reason())
        )
        if reason:
            raise offline_error(spec, reason)
    try:
        rows = datasets.load_dataset(name.strip(), config.strip() or None, split="train", streaming=True)
    except Exception as error:
        raise DatasetError(f"cannot stream {spec!r}: {type(error).__name__}: {error}") from None
    for row in rows:
        if column not in row:
            raise DatasetError(
                f"{spec!r} has no column {column!r}; columns: {', '.join(row)} (--text-column)"
            )
        yield row[column]


def text_documents(spec: str, rest: str, text_column: str, piece_chars: int) -> DocumentStream:
    """``text:PATH[,PATH...]``: each file a document (a directory: its files)."""
    paths = source_paths(spec, rest)
    total = sum(p.stat().st_size for p in paths)
    return DocumentStream(spec, "bytes", total, _text_pieces(spec, paths, piece_chars), len(paths))


def parquet_documents(spec: str, rest: str, text_column: str, piece_chars: int) -> DocumentStream:
    """``parquet:PATH[,PATH...]``: each row of ``text_column`` a document."""
    import pyarrow.parquet as pq

    paths = source_paths(spec, rest, ".parquet")
    total = sum(pq.read_metadata(p).num_rows for p in paths)
    rows = _parquet_rows(spec, paths, text_column)
    return DocumentStream(spec, "rows", total, _row_pieces(rows, piece_chars), total)


def hub_documents(spec: str, rest: str, text_column: str, piece_chars: int) -> DocumentStream:
    """``hf:NAME[:CONFIG]``: each row of its train split a document, streamed."""
    return DocumentStream(spec, "rows", None, _row_pieces(_hub_rows(spec, rest, text_column), piece_chars))


def open_documents(spec: str, *, text_column: str = "text", piece_chars: int = PIECE_CHARS) -> DocumentStream:
    """The documents of ``spec``, read by its form's ``documents`` reader in the dataset table
    (``zoo.data.table``: the one parser of sources); nothing is read until iterated, but the
    files it names are checked here."""
    from zoo.data.table import document_forms, lookup

    valid = ", ".join(f.usage for f in document_forms())
    try:
        form, rest = lookup(spec)
    except DatasetError:
        form, rest = None, ""
    if form is None or form.documents is None:
        raise DatasetError(f"cannot tokenize {spec!r}: valid sources are {valid}")
    return form.documents(spec, rest, text_column, piece_chars)
