"""A CSV read the way a DP run must read it: every record by one rule, whatever is wrong with it.

Outside DP a CSV goes through `datasets` (``zoo.data.files``), and a malformed file is refused
in one line naming the line and column. Under DP that refusal would depend on one record, and
so would the column types `datasets` infers from the values. Here instead:

- the header (the schema, not a record) names the columns; a header that is not UTF-8 or that
  repeats a name is refused;
- every other record becomes one row, every value its text (an empty field: missing), read by
  :mod:`zoo.data.declared`'s rules (labels by value, features as numbers);
- a **malformed record** (more or fewer fields than the header, a byte that is not UTF-8) becomes
  a row of missing values in its place: the declared rules drop it, after the train/eval split,
  so no other record moves. Nothing is printed, and no count of them is released.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from zoo.data.errors import DatasetError


def _broken(field: str) -> bool:
    """Whether ``field`` holds a byte that is not UTF-8 (decoded as a lone surrogate)."""
    return any("\udc80" <= ch <= "\udcff" for ch in field)


def read_csv_records(spec: str, path: str):
    """The rows of the CSV at ``path`` as a `datasets.Dataset` of text columns (module
    docstring), one row per record, in order."""
    import datasets

    text = Path(path).read_bytes().decode("utf-8", errors="surrogateescape")
    records = csv.reader(io.StringIO(text, newline=""))
    header = next(records, None)
    if not header:
        raise DatasetError(f"cannot read {spec!r}: {path}: no header row")
    if any(_broken(name) for name in header) or len(set(header)) != len(header):
        raise DatasetError(f"cannot read {spec!r}: {path}: its header is not UTF-8 or repeats a column name")
    columns: dict[str, list[str | None]] = {name: [] for name in header}
    for record in records:
        if not record:  # a blank line is no record
            continue
        good = len(record) == len(header) and not any(_broken(v) for v in record)
        for name, value in zip(header, record if good else [None] * len(header), strict=True):
            columns[name].append(value if value != "" else None)
    features = datasets.Features({name: datasets.Value("string") for name in header})
    return datasets.Dataset.from_dict(columns, features=features)
