"""zoo.data.forms.schemes: ``text:`` reads a directory as its files, in name order, and under DP
reads every file by one rule (a byte that is not UTF-8 is U+FFFD), where outside DP the file is
refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.data import CharTokenizer, DatasetError, load_dataset


def corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "b.txt").write_text("second file\n" * 5)
    (root / "a.txt").write_text("first file\n" * 5)
    (root / ".hidden").write_text("never read\n")
    return root


def whole_text(ds) -> str:
    ids = np.concatenate([np.asarray(ds.x_train), np.asarray(ds.x_eval)])
    return ds.tokenizer.decode(ids)


@pytest.mark.parametrize("private", [False, True])
def test_a_directory_is_its_files_in_name_order(tmp_path, private):
    tok = CharTokenizer.utf8_bytes()
    ds = load_dataset(f"text:{corpus(tmp_path)}", task="lm", tokenizer=tok, private=private)
    assert whole_text(ds) == "first file\n" * 5 + "\n" + "second file\n" * 5


def test_under_dp_a_byte_that_is_not_utf8_is_read_as_a_replacement_character(tmp_path):
    """Planted: reading the files through `datasets` under DP refuses the run (a release that
    depends on one file)."""
    root = corpus(tmp_path)
    (root / "c.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    tok = CharTokenizer.utf8_bytes()
    with pytest.raises(DatasetError, match="c.txt: not UTF-8 text"):
        load_dataset(f"text:{root}", task="lm", tokenizer=tok)
    ds = load_dataset(f"text:{root}", task="lm", tokenizer=tok, private=True)
    assert whole_text(ds).endswith("\ncaf\ufffd\n")
