"""Local data files (``text:``, ``csv:``, ``parquet:``): the paths a spec names, read with
`datasets`, and when a file cannot be read, which file, where and why.

`datasets` wraps every parse failure in ``DatasetGenerationError: An error occurred while
generating the dataset``; the cause it hides (a ``UnicodeDecodeError`` at a chunk offset, a
pandas ``ParserError``, an Arrow error) rarely names the file. So after a failure each file is
checked on its own, and the first finding becomes the one-line error.
"""

from __future__ import annotations

import os
import stat
import sysconfig

import datasets
from datasets.utils import logging as ds_logging

from zoo.data.errors import DatasetError

_SNIFF = 8192  # bytes read to tell a binary file from text


def local_paths(spec: str, rest: str, many: bool, forms: str) -> list[str]:
    """Absolute paths of the files ``rest`` names (comma-separated when ``many``); DatasetError
    for a missing file or a directory. ``forms`` lists the valid spec forms for the message."""
    parts = [p.strip() for p in rest.split(",")] if many else [rest.strip()]
    if not any(parts):
        raise DatasetError(f"{spec!r} names no file. Valid forms: {forms}.")
    paths = []
    for part in parts:
        # "{stdlib}" lets a shipped recipe name text files every Python install has.
        part = part.replace("{stdlib}", sysconfig.get_paths()["stdlib"])
        path = os.path.abspath(os.path.expanduser(part))
        if part and os.path.isdir(path):
            scheme, folder = spec.partition(":")[0], part.rstrip("/")
            example = f"{folder}/a.txt,{folder}/b.txt" if many else f"{folder}/FILE"
            example = f"{scheme}:{example}"
            raise DatasetError(f"{spec!r}: {part!r} is a directory; name its files, e.g. {example}")
        if not part or not os.path.isfile(path):
            raise DatasetError(f"{spec!r}: file not found: {part or '(empty path)'!r}")
        paths.append(path)
    return paths


def load_local(spec: str, builder: str, paths: list[str], **options: object):
    """``datasets.load_dataset(builder, data_files=paths)``, or one DatasetError line naming the
    unreadable file, the line and column (or row) where it could be told, and the cause."""
    bars, verbosity = ds_logging.is_progress_bar_enabled(), ds_logging.get_verbosity()
    ds_logging.disable_progress_bar()  # a parse takes a moment; a failed one left half a bar
    ds_logging.set_verbosity(ds_logging.CRITICAL)  # the error below says it once
    try:
        return datasets.load_dataset(builder, data_files=paths, **options)
    except Exception as e:
        for path in paths:
            reason = unreadable(builder, path)
            if reason:
                raise DatasetError(f"cannot read {spec!r}: {path}: {reason}") from None
        cause = _root_cause(e)
        detail = " ".join(str(cause).split()) or "no detail"
        raise DatasetError(f"cannot read {spec!r} as {builder}: {type(cause).__name__}: {detail}") from None
    finally:
        ds_logging.set_verbosity(verbosity)
        if bars:
            ds_logging.enable_progress_bar()


def not_a_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is not a regular file (``open`` on a FIFO waits for a writer
    forever; a dangling link has nothing to read), or None for a regular file."""
    try:
        mode = os.stat(path).st_mode  # follows links
    except FileNotFoundError:
        return "a dangling symbolic link" if os.path.islink(path) else "missing"
    except OSError as error:
        return f"unreadable ({error.strerror})"
    kinds = ((stat.S_ISREG, None), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"))
    kinds += ((stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def unreadable(builder: str, path: str) -> str | None:
    """Why ``path`` cannot be read as ``builder`` ("csv", "text" or "parquet"), or None if
    nothing is wrong with the file by itself."""
    special = not_a_file(path)
    if special is not None:
        return special
    if os.path.getsize(path) == 0:
        return "the file is empty"
    if builder == "parquet":
        return _parquet_problem(path)
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data[:_SNIFF]:
        kind = "text" if builder == "text" else f"{builder} text"  # not "text text"
        return f"a binary file, not {kind} (it holds NUL bytes)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - data.rfind(b"\n", 0, e.start)
        return (
            f"not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {column}. "
            "Convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
        )
    if builder == "csv":
        return _csv_problem(path)
    return None


def _csv_problem(path: str) -> str | None:
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return "no header row and no data"
    except pd.errors.ParserError as e:  # "Expected 3 fields in line 3, saw 4"
        return "ragged rows: " + " ".join(str(e).split()).removeprefix("Error tokenizing data. C error: ")
    if frame.empty:
        return f"a header ({', '.join(map(str, frame.columns))}) but no rows"
    return None


def _parquet_problem(path: str) -> str | None:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except Exception as e:
        return f"not a parquet file ({' '.join(str(e).split())})"
    if meta.num_rows == 0:
        return f"no rows (columns: {', '.join(meta.schema.names)})"
    return None


def _root_cause(error: BaseException) -> BaseException:
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error
