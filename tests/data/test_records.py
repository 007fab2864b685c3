"""zoo.data.records: a DP run's CSV, every record by one rule; a malformed one is a row of
missing values in its place, never an error."""

import pytest

from zoo.data import DatasetError
from zoo.data.declared import declared_labels
from zoo.data.records import read_csv_records


def test_a_malformed_record_is_a_row_of_missing_values_in_its_place(tmp_path):
    path = tmp_path / "t.csv"
    lines = [b"a,b,label", b"1,2,0", b"1,2,1,9", b"3", b"caf\xe9,1,1", b"", b'"4,5",6,1.0', b"7,,2"]
    path.write_bytes(b"\r\n".join(lines) + b"\n")
    rows = read_csv_records("csv:t", str(path))
    assert rows.to_dict() == {
        "a": ["1", None, None, None, "4,5", "7"],
        "b": ["2", None, None, None, "6", None],
        "label": ["0", None, None, None, "1.0", "2"],
    }
    assert declared_labels(rows, "t", "label", (0, 1, 2)).tolist() == [0, -1, -1, -1, 1, 2]


def test_the_header_is_the_schema_and_is_refused_when_unreadable(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"a,a,label\n1,2,0\n")
    with pytest.raises(DatasetError, match="repeats a column name"):
        read_csv_records("csv:t", str(path))
    path.write_bytes(b"")
    with pytest.raises(DatasetError, match="no header row"):
        read_csv_records("csv:t", str(path))
