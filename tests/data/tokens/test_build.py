"""``zoo.data.tokens.build``: a store written in pieces and batches holds the ids the in-memory
path gives the same text; the eval split is whole documents; nothing looks like a store until
the write is complete."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from zoo.data import load_dataset
from zoo.data.errors import DatasetError
from zoo.data.tokenizer import CharTokenizer
from zoo.data.tokens import open_store
from zoo.data.tokens.build import balance_notice, eval_documents, tokenize
from zoo.data.tokens.store import META

FIXTURE = Path(__file__).parents[2] / "fixtures" / "hf" / "llama3-tied" / "tokenizer.json"
LINES = ["the quick brown fox", "jumps over the lazy dog", "déjà vu — naïve café", "a\tb\r\nc", ""]


def write_corpus(root: Path, documents: int = 13) -> list[Path]:
    """Files of a few lines each (accents, a tab, CRLF, blank lines), some longer than a piece."""
    root.mkdir()
    paths = []
    for i in range(documents):
        text = "\n".join(LINES[(i + j) % len(LINES)] + f" {i}.{j}" for j in range(1 + i % 4)) + "\n" * (i % 2)
        path = root / f"doc{i:02d}.txt"
        path.write_text(text, encoding="utf-8", newline="")
        paths.append(path)
    return paths


def in_memory(paths: list[Path], tokenizer) -> np.ndarray:
    """The ids the in-memory ``text:`` path gives these files (its train and eval together)."""
    ds = load_dataset("text:" + ",".join(map(str, paths)), task="lm", tokenizer=tokenizer)
    assert "is read and tokenized in memory" in ds.notice and ds.store is None
    return np.concatenate([ds.x_train, ds.x_eval])


def split_paths(paths: list[Path], fraction: float) -> dict[str, list[Path]]:
    held = eval_documents(fraction)
    return {
        "train": [p for i, p in enumerate(paths) if not held(i)],
        "eval": [p for i, p in enumerate(paths) if held(i)],
    }


@pytest.mark.parametrize("vocabulary", ["bytes", "char"])
def test_a_store_written_in_pieces_equals_the_in_memory_tokenization(tmp_path, vocabulary):
    paths = write_corpus(tmp_path / "corpus")
    if vocabulary == "char":  # a declared file that lacks some characters of the text: <unk> in both
        (tmp_path / "chars.txt").write_text("abcdefghijklmnopqrstuvwxyz .\n0123456789é")
        vocabulary = f"char:{tmp_path / 'chars.txt'}"
    meta = tokenize(
        f"text:{tmp_path / 'corpus'}",
        tmp_path / "store",
        vocabulary,
        eval_fraction=0.25,
        piece_chars=7,
        batch_chars=13,
    )
    store = open_store(tmp_path / "store")
    for split, files in split_paths(paths, 0.25).items():
        expected = in_memory(files, store.tokenizer)
        got = store.train if split == "train" else store.eval
        assert got.dtype == np.uint16 and got.tolist() == expected.tolist(), split
        assert meta["splits"][split] == {"tokens": len(expected), "documents": len(files)}
    assert isinstance(store.train, np.memmap) and meta["max_id"] == max(store.train.max(), store.eval.max())


def test_document_offsets_point_at_each_document(tmp_path):
    paths = write_corpus(tmp_path / "corpus", documents=6)
    tokenize(f"text:{tmp_path / 'corpus'}", tmp_path / "store", "bytes", eval_fraction=0.5, piece_chars=5)
    store = open_store(tmp_path / "store")
    starts = np.fromfile(tmp_path / "store" / "train.docs", np.uint64)
    files = split_paths(paths, 0.5)["train"]
    texts = [p.read_text(encoding="utf-8").encode() for p in files]  # read as text: CRLF is one newline
    assert starts.tolist() == [sum(map(len, texts[:i])) + i for i in range(len(files))]  # a separator between
    second = bytes((store.train[int(starts[1]) : int(starts[1]) + 4] - 1).astype(np.uint8).tolist())
    assert second == texts[1][:4]


def test_a_bpe_tokenizer_encodes_each_document_on_its_own(tmp_path):
    paths = write_corpus(tmp_path / "corpus")
    tokenize(
        f"text:{tmp_path / 'corpus'}", tmp_path / "store", f"hf:{FIXTURE}", eval_fraction=0.25, batch_chars=10
    )
    reference = Tokenizer.from_file(str(FIXTURE))  # the library itself, one document at a time
    encode = lambda text: reference.encode(text, add_special_tokens=False).ids  # noqa: E731
    store = open_store(tmp_path / "store")
    for split, files in split_paths(paths, 0.25).items():
        expected = []
        for i, path in enumerate(files):
            expected += (encode("\n") if i else []) + encode(path.read_text(encoding="utf-8"))
        assert (store.train if split == "train" else store.eval).tolist() == expected


def test_a_long_document_goes_to_a_bpe_tokenizer_in_line_aligned_parts(tmp_path, monkeypatch):
    from zoo.data.tokens import build
    from zoo.data.tokens.documents import cut

    monkeypatch.setattr(build, "BPE_PART", 12)
    paths = write_corpus(tmp_path / "corpus", documents=4)
    tokenize(f"text:{tmp_path / 'corpus'}", tmp_path / "store", f"hf:{FIXTURE}", eval_fraction=0.25)
    reference = Tokenizer.from_file(str(FIXTURE))
    expected = []
    for i, path in enumerate(split_paths(paths, 0.25)["train"]):
        parts = cut(path.read_text(encoding="utf-8"), 12)
        assert i or len(parts) > 2  # the parts are cut where a line ends, or at 12 characters
        ids = [reference.encode(part, add_special_tokens=False).ids for part in parts]
        expected += (reference.encode("\n", add_special_tokens=False).ids if i else []) + sum(ids, [])
    assert open_store(tmp_path / "store").train.tolist() == expected


def test_the_eval_split_is_every_kth_document_first_included():
    held = eval_documents(0.1)
    assert [i for i in range(35) if held(i)] == [0, 10, 20, 30]
    third = eval_documents(1 / 3)
    assert sum(third(i) for i in range(300)) == 100
    with pytest.raises(DatasetError, match="eval-fraction"):
        eval_documents(1.0)


def test_one_file_holds_out_its_tail_as_the_in_memory_text_path_does(tmp_path):
    """nanoGPT's input.txt: one document, whose last eval_fraction of ids is the eval split,
    the ids the in-memory text: path cuts from the same file, bit for bit."""
    path = tmp_path / "input.txt"
    path.write_text(
        "".join(f"{LINES[i % len(LINES)]} {i}\n" for i in range(400)), encoding="utf-8", newline=""
    )
    meta = tokenize(f"text:{path}", tmp_path / "store", "bytes", piece_chars=64, batch_chars=200)
    store = open_store(tmp_path / "store")
    ds = load_dataset(f"text:{path}", task="lm", tokenizer=CharTokenizer.utf8_bytes(), eval_fraction=0.1)
    assert store.train.tolist() == ds.x_train.tolist() and store.eval.tolist() == ds.x_eval.tolist()
    assert meta["split"] == "tail" and not [p for p in (tmp_path / "store").iterdir() if "spool" in p.name]


def test_few_documents_split_by_tail_and_a_lopsided_documents_split_is_said(tmp_path):
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_text("a long document line\n" * 1000)
    small.write_text("tiny\n")
    source = f"text:{big},{small}"
    meta = tokenize(source, tmp_path / "auto", "bytes")  # 2 documents < 1 / 0.1: the tail rule
    tokens = [meta["splits"][s]["tokens"] for s in ("train", "eval")]
    assert meta["split"] == "tail" and abs(tokens[1] / sum(tokens) - 0.1) < 0.01
    assert balance_notice(meta) is None
    whole = tokenize(source, tmp_path / "whole", "bytes", split="documents")  # big.txt held out whole
    assert whole["splits"]["train"]["tokens"] == 5
    notice = balance_notice(whole)
    assert (
        "the eval split holds 100.0% of the tokens (21,000 of 21,005)" in notice and "--split tail" in notice
    )


def test_a_documents_split_of_one_document_is_refused_and_leaves_nothing(tmp_path):
    (tmp_path / "one.txt").write_text("only one document")
    with pytest.raises(DatasetError, match="train split would hold no tokens"):
        tokenize(f"text:{tmp_path / 'one.txt'}", tmp_path / "store", "bytes", split="documents")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt"]
    with pytest.raises(DatasetError, match="--split 'halves': valid are auto, documents, tail"):
        tokenize(f"text:{tmp_path / 'one.txt'}", tmp_path / "store", "bytes", split="halves")


def test_an_interrupted_write_leaves_no_store(tmp_path):
    write_corpus(tmp_path / "corpus")
    seen = []

    def interrupt(progress):
        seen.append((tmp_path / "store").exists())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize(
            f"text:{tmp_path / 'corpus'}", tmp_path / "store", "bytes", batch_chars=20, on_progress=interrupt
        )
    assert seen == [False] and sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_a_killed_write_leaves_a_hidden_partial_folder_that_is_not_a_store(tmp_path):
    import subprocess
    import sys

    write_corpus(tmp_path / "corpus")
    code = (
        "import os, signal; from zoo.data.tokens.build import tokenize; "
        "kill = lambda p: os.kill(os.getpid(), signal.SIGKILL); "
        f"tokenize('text:{tmp_path / 'corpus'}', '{tmp_path / 'store'}', 'bytes', batch_chars=20, on_progress=kill)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    partial = [p.name for p in tmp_path.iterdir() if p.name != "corpus"]
    assert len(partial) == 1 and partial[0].startswith(".store.partial-")
    assert not (tmp_path / partial[0] / META).exists()
    with pytest.raises(DatasetError, match="not a directory"):
        open_store(tmp_path / "store")


def test_an_existing_out_is_refused(tmp_path):
    write_corpus(tmp_path / "corpus")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "keep.txt").write_text("mine")
    with pytest.raises(DatasetError, match="already exists"):
        tokenize(f"text:{tmp_path / 'corpus'}", tmp_path / "store", "bytes")
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["keep.txt"]


ROWS = ["first row", None, "second row\nwith two lines", "", "third", "fourth", "fifth"]


def write_parquet(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"body": ROWS, "label": list(range(len(ROWS)))}), path, row_group_size=2)


@pytest.mark.parametrize("scheme", ["parquet", "hf"])
def test_parquet_and_hub_rows_are_documents(tmp_path, scheme, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local dataset folder: no network is touched
    write_parquet(tmp_path / "rows" / "train-00000.parquet")
    source = f"parquet:{tmp_path / 'rows'}" if scheme == "parquet" else f"hf:{tmp_path / 'rows'}"
    meta = tokenize(
        source, tmp_path / "store", "bytes", eval_fraction=0.25, text_column="body", piece_chars=4
    )
    store = open_store(tmp_path / "store")
    rows = [r for r in ROWS if r is not None]  # a missing row is skipped, as in memory
    train = "\n".join(r for i, r in enumerate(rows) if i % 4)  # documents 0 and 4 are held out
    tok = CharTokenizer.utf8_bytes()
    assert store.train.tolist() == tok.encode(train).tolist()
    assert store.eval.tolist() == tok.encode(rows[0] + "\n" + rows[4]).tolist()
    assert meta["source"] == source and meta["text_column"] == "body"


def test_bad_sources_are_named_in_one_line(tmp_path):
    write_parquet(tmp_path / "t.parquet")
    with pytest.raises(DatasetError, match="no column 'text'; columns: body, label"):
        tokenize(f"parquet:{tmp_path / 't.parquet'}", tmp_path / "s", "bytes")
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DatasetError, match="latin.txt: not UTF-8"):
        tokenize(f"text:{tmp_path / 'latin.txt'}", tmp_path / "s", "bytes")
    with pytest.raises(DatasetError, match=r"valid sources are hf:NAME\[:CONFIG\], parquet:PATH, text:PATH"):
        tokenize("csv:x.csv", tmp_path / "s", "bytes")
    with pytest.raises(DatasetError, match="ids:N has no text form"):
        tokenize(f"text:{tmp_path / 'latin.txt'}", tmp_path / "s", "ids:300")
    with pytest.raises(DatasetError, match="file not found"):
        tokenize(f"text:{tmp_path / 'nope.txt'}", tmp_path / "s", "bytes")
    assert not (tmp_path / "s").exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_store_json_records_what_reads_it(tmp_path):
    write_corpus(tmp_path / "corpus")
    tokenize(f"text:{tmp_path / 'corpus'}", tmp_path / "store", "bytes")
    meta = json.loads((tmp_path / "store" / META).read_text())
    assert (meta["dtype"], meta["vocab_size"], meta["vocabulary"], meta["record"]) == (
        "uint16",
        257,
        "bytes",
        "window",
    )
    names = {"train.bin", "eval.bin", "train.docs", "eval.docs", "tokenizer.json"}
    assert set(meta["files"]) == names and all(len(f["sha256"]) == 64 for f in meta["files"].values())
    assert oct((tmp_path / "store").stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's private mode


def test_a_lopsided_tail_split_gives_the_tail_rule_s_reason_and_the_fraction_unrounded(tmp_path):
    (tmp_path / "many").mkdir()
    for i in range(30):  # short documents: each holds out 1 of its 4 ids, and a separator
        (tmp_path / "many" / f"f{i:02d}.txt").write_text("abcd")
    meta = tokenize(
        f"text:{tmp_path / 'many'}", tmp_path / "store", "bytes", eval_fraction=0.004, split="tail"
    )
    notice = balance_notice(meta)
    assert "not about 0.4%:" in notice and "--split tail holds out the last part" in notice
    assert "whole documents of unequal" not in notice and notice.endswith(
        "--split documents holds out whole documents instead"
    )


def test_the_last_progress_report_counts_every_token_written(tmp_path):
    (tmp_path / "one.txt").write_text("a line of text\n" * 300)
    for rule in ("tail", "documents"):
        seen = []
        source = f"text:{tmp_path / 'one.txt'},{tmp_path / 'one.txt'}"
        meta = tokenize(
            source, tmp_path / rule, "bytes", eval_fraction=0.5, split=rule, on_progress=seen.append
        )
        written = sum(meta["splits"][s]["tokens"] for s in ("train", "eval"))
        assert (seen[-1].tokens, seen[-1].done, seen[-1].documents) == (written, 2 * 4500, 2)


def test_empty_files_are_documents_under_either_split(tmp_path):
    (tmp_path / "d").mkdir()
    for name, text in (("a.txt", "hello world\n"), ("b.txt", ""), ("c.txt", "x" * 500), ("d.txt", "")):
        (tmp_path / "d" / name).write_text(text)
    counts = {}
    for rule in ("tail", "documents"):
        meta = tokenize(f"text:{tmp_path / 'd'}", tmp_path / rule, "bytes", eval_fraction=0.25, split=rule)
        counts[rule] = meta["splits"]
    assert counts["documents"]["train"]["documents"] + counts["documents"]["eval"]["documents"] == 4
    assert counts["tail"]["train"]["documents"] == 4 and counts["tail"]["eval"]["documents"] == 2
