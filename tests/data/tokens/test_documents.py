"""``zoo.data.tokens.documents``: sources streamed in pieces of bounded size."""

from __future__ import annotations

import pytest

from zoo.data.errors import DatasetError
from zoo.data.tokens.documents import cut, open_documents


def test_cut_keeps_the_text_and_ends_pieces_after_a_newline():
    text = "line one\nline two is longer\n\nx" + "y" * 30
    pieces = cut(text, 12)
    assert "".join(pieces) == text and all(len(p) <= 12 for p in pieces)
    assert pieces[:3] == ["line one\n", "line two is ", "longer\n\n"]  # no newline in reach: cut at 12
    assert cut("", 5) == [""] and cut("abc", 5) == ["abc"]


@pytest.mark.parametrize("limit", [1, 3, 8, 64])
def test_a_file_streams_as_cut_of_the_whole_file(tmp_path, limit):
    text = "".join(f"row {i} " * (i % 5) + "\n" * (i % 3) for i in range(40))
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt").write_text("")
    stream = open_documents(f"text:{tmp_path}", piece_chars=limit)
    pieces = list(stream.pieces)
    assert [p.text for p in pieces] == cut(text, limit) + [""]  # the empty file is an empty document
    assert [p.starts_document for p in pieces] == [True] + [False] * (len(pieces) - 2) + [True]
    assert stream.total == len(text.encode()) and pieces[-1].done == stream.total


def test_a_directory_is_walked_in_name_order_without_hidden_files(tmp_path):
    for name in ("b.txt", "a/z.txt", "a/y.txt", ".hidden/c.txt", "a/.d.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    texts = [p.text for p in open_documents(f"text:{tmp_path}").pieces]
    assert texts == ["a/y.txt", "a/z.txt", "b.txt"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="the directory .*empty' holds no files"):
        open_documents(f"text:{tmp_path / 'empty'}")


def test_the_token_store_reads_its_sources_through_the_dataset_table(tmp_path):
    """One parser of sources: a form registered with a documents reader is a source of zoo
    tokenize, and the list of valid sources is the table's."""
    from zoo.data.errors import DatasetError
    from zoo.data.table import DatasetForm, document_forms, register_form, unregister
    from zoo.data.tokens.build import tokenize
    from zoo.data.tokens.documents import DocumentStream, Piece, open_documents

    def toy(spec, rest, text_column, piece_chars):
        texts = rest.split("+")
        pieces = iter([Piece(t, True, i + 1) for i, t in enumerate(texts)])
        return DocumentStream(spec, "rows", len(texts), pieces, len(texts))

    register_form(DatasetForm("toydocs", "toydocs:A+B", ("lm",), None, "toy documents", True, toy))
    try:
        assert "toydocs:A+B" in [f.usage for f in document_forms()]
        meta = tokenize("toydocs:abc+de", tmp_path / "s", "bytes", split="documents", eval_fraction=0.5)
        assert meta["splits"]["eval"] == {"tokens": 3, "documents": 1}  # "abc", the first
    finally:
        unregister("toydocs")
    with pytest.raises(DatasetError, match=r"cannot tokenize 'csv:x.csv': valid sources are hf:.*text:"):
        open_documents("csv:x.csv")  # a form of the table, but without a documents reader


@pytest.mark.parametrize("special", ["fifo", "dangling link"])
def test_an_entry_that_is_not_a_regular_file_is_refused_naming_it_or_kept_under_dp(tmp_path, special):
    """Issue 60, items 4 and 5: a FIFO in the folder blocked the DP read forever in ``open()``,
    and a dangling link was a FileNotFoundError traceback (train with and without DP, and
    tokenize). Outside DP it is refused in one line naming it; a DP read keeps it (read as
    empty text: zoo.data.forms.schemes)."""
    import os

    from zoo.data.tokens.documents import source_paths

    (tmp_path / "a.txt").write_text("one\n")
    odd = tmp_path / "b.txt"
    os.mkfifo(odd) if special == "fifo" else odd.symlink_to(tmp_path / "gone.txt")
    what = "a FIFO" if special == "fifo" else "a dangling symbolic link"
    with pytest.raises(DatasetError, match=f"'{odd}' is {what}"):
        source_paths("text:DIR", str(tmp_path))
    assert source_paths("text:DIR", str(tmp_path), keep_special=True) == [tmp_path / "a.txt", odd]
