"""Issue 33, data: unreadable files name the file, where and why; directories, one-class
data and a negative seed are refused in one line before any model is built."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.clikit import refused
from tests.tiny import HF_FIXTURES as FIXTURES
from zoo.cli import main


def _train(tmp_path, dataset: str, *more: str) -> list[str]:
    return [
        "train",
        "digits-mlp",
        "--dataset",
        dataset,
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
        *more,
    ]


def _zero_row_parquet(path) -> None:
    pq.write_table(pa.table({"a": pa.array([], pa.float32()), "label": pa.array([], pa.int64())}), path)


# (file name, bytes, the words the one line must hold besides the path)
CSV_CASES = [
    ("binary.csv", bytes(range(256)) * 4, ["a binary file"]),
    ("latin1.csv", "a,caf\xe9,label\n1,2,0\n".encode("latin-1"), ["not UTF-8", "0xe9", "line 1, column 6"]),
    ("empty.csv", b"", ["the file is empty"]),
    ("ragged.csv", b"a,b,label\n1,2,0\n3,4,1,5\n", ["ragged rows", "line 3"]),
    ("header.csv", b"a,b,label\n", ["no rows"]),
]


@pytest.mark.parametrize("name, content, words", CSV_CASES, ids=[c[0] for c in CSV_CASES])
def test_an_unreadable_csv_names_the_file_the_place_and_the_cause(tmp_path, capsys, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    line = refused(capsys, _train(tmp_path, f"csv:{path}"), str(path), *words)
    assert "DatasetGenerationError" not in line


def test_a_zero_row_parquet_file_is_named(tmp_path, capsys):
    path = tmp_path / "zero.parquet"
    _zero_row_parquet(path)
    refused(capsys, _train(tmp_path, f"parquet:{path}"), str(path), "no rows", "a, label")


def test_a_text_file_that_is_not_utf8_is_named_with_its_line(tmp_path, capsys):
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("plain text\n" * 20)
    bad.write_bytes("fine\n\xe9t\xe9\n".encode("latin-1"))
    argv = ["train", "python-docs-lm", "--dataset", f"text:{good},{bad}", "--out", str(tmp_path / "r")]
    refused(capsys, argv, str(bad), "not UTF-8", "line 2, column 1")


def test_a_directory_is_not_called_a_missing_file(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    argv = [
        "train",
        "python-docs-lm",
        "--dataset",
        f"text:{tmp_path / 'corpus'}",
        "--out",
        str(tmp_path / "r"),
    ]
    line = refused(capsys, argv, "the directory", "holds no files")  # a directory: its files
    assert "not found" not in line


def test_one_class_data_is_refused_instead_of_scoring_accuracy_one(tmp_path, capsys):
    path = tmp_path / "one.csv"
    path.write_text("a,b,label\n1,2,0\n3,4,0\n5,6,0\n")
    refused(capsys, _train(tmp_path, f"csv:{path}"), "3 rows, all of class 0", "at least 2 classes")


def test_a_negative_seed_blames_the_seed_not_the_split(capsys, tmp_path):
    line = refused(
        capsys, ["train", "digits-mlp", "--set", "train.seed=-1", "--out", str(tmp_path / "r")], "-1"
    )
    assert "seed must be" in line and "cannot split" not in line


@pytest.mark.parametrize(
    ("make", "flags", "words"),
    [
        (None, ["text:/no/such/dir", "--vocabulary", "bytes"], ["file not found", "/no/such/dir"]),
        ("corpus", ["--vocabulary", "words"], ["unknown vocabulary 'words'", "bytes, hf:SRC, char:FILE"]),
        ("corpus", ["--vocabulary", "ids:300"], ["ids:N has no text form"]),
        (
            "corpus",
            ["--vocabulary", "bytes", "--eval-fraction", "1.5"],
            ["--eval-fraction must be in (0, 1)"],
        ),
        # one document splits by its tail (auto); held out whole it leaves train empty
        ("one", ["--vocabulary", "bytes", "--split", "documents"], ["train split would hold no tokens"]),
        ("latin", ["--vocabulary", "bytes"], ["not UTF-8", "latin.txt"]),
    ],
)
def test_zoo_tokenize_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, make, flags, words):
    (tmp_path / "corpus").mkdir()
    if make == "corpus":
        for i in range(3):
            (tmp_path / "corpus" / f"{i}.txt").write_text(f"document {i}\n")
    elif make == "one":
        (tmp_path / "corpus" / "only.txt").write_text("one document\n")
    elif make == "latin":
        (tmp_path / "corpus" / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    source = [] if make is None else [f"text:{tmp_path / 'corpus'}"]
    argv = ["tokenize", *source, *flags, "--out", str(tmp_path / "store"), "--no-progress"]
    refused(capsys, argv, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no store, no partial folder


def test_a_token_store_that_is_not_there_is_refused_before_any_model_is_built(tmp_path, capsys):
    (tmp_path / "half").mkdir()  # what a killed zoo tokenize leaves at most: no store.json
    argv = [
        "train",
        "python-docs-lm",
        "--dataset",
        f"tokens:{tmp_path / 'half'}",
        "--out",
        str(tmp_path / "r"),
    ]
    refused(capsys, argv, "no store.json", "zoo tokenize")
    refused(capsys, [*argv[:3], f"bin:{tmp_path / 'x.bin'}", *argv[4:]], "without their vocabulary")


@pytest.mark.parametrize("vocabulary", ["words", "ids:300"])
def test_a_bad_tokenize_vocabulary_is_refused_before_the_progress_bar(tmp_path, capsys, vocabulary):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("a document\n")
    argv = [
        "tokenize",
        f"text:{tmp_path / 'corpus'}",
        "--vocabulary",
        vocabulary,
        "--out",
        str(tmp_path / "s"),
    ]
    line = refused(capsys, argv, "bytes, hf:SRC, char:FILE")  # the bar is on: still one line
    listed = line.split("Valid: " if "Valid: " in line else "use ")[-1]
    assert listed.startswith("bytes") and "ids:N" not in listed  # only forms it can tokenize with


def test_labels_outside_the_declared_classes_are_left_out_with_a_word(capsys, tmp_path):
    """Issue 41, item 19: rows of other labels were dropped silently."""
    path = tmp_path / "three.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 1]"]
    assert main([*argv, "--steps=1", "--no-progress", "--out", str(tmp_path / "r")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("leaves out 10 of 30 rows, whose labels (2)" in line for line in warned), warned


def test_under_dp_the_left_out_labels_are_not_released(capsys, tmp_path):
    """Issue 41, item 19 under DP: whether the notice is given, and its counts, depend on the records, so
    a DP run gives it for neither neighbour (one with a row of another label, one without)."""
    seen = []
    for extra in ("", "29,1,2\n"):
        path = tmp_path / f"d{len(seen)}.csv"
        path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(29)) + extra)
        argv = ["train", "digits-mlp-dp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 1]"]
        argv += ["--set", "dp.expected_batch_size=8", "--set", "train.eval_batches=1"]
        assert main([*argv, "--steps=1", "--no-progress", "--out", str(tmp_path / f"r{len(seen)}")]) == 0
        seen.append([line for line in capsys.readouterr().err.splitlines() if "leaves out" in line])
    assert seen == [[], []], seen


def test_string_labels_show_their_names_beside_the_ids(capsys, tmp_path):
    """Issue 41, item 23: string labels showed as "Labels present: [0, 1, 2]"."""
    path = tmp_path / "pets.csv"
    names = ("dog", "cat", "emu")
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{names[i % 3]}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 5]"]
    refused(
        capsys,
        [*argv, "--steps=1", "--out", str(tmp_path / "r")],
        "no examples of class(es) [5]",
        "Labels present: [0 ('cat'), 1 ('dog'), 2 ('emu')]",
        "numbered in sorted order",
    )


def test_data_classes_takes_the_names_of_string_labels(capsys, tmp_path):
    """Issue 41, item 23: ``data.classes`` took integer ids only; a string label is listed by its name,
    and the classes are numbered in the order listed."""
    import json

    path = tmp_path / "pets.csv"
    names = ("dog", "cat", "emu")
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{names[i % 3]}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--steps=1", "--no-progress", "--json"]
    assert main([*argv, "--set", 'data.classes=["emu", "dog"]', "--out", str(tmp_path / "r")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["dataset"] == f"csv:{path}"
    refused(capsys, [*argv, "--set", 'data.classes=["emu", "yak"]', "--out", str(tmp_path / "s")],
            "names 'yak', not a label", "its labels: cat, dog, emu")  # fmt: skip


def test_csv_column_errors_name_the_recipe_keys(capsys, tmp_path):
    """Issue 41, item 24: the csv text-column error named Python arguments (``label_column=``)."""
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,4,1\n")
    argv = ["train", "python-docs-lm", "--dataset", f"csv:{path}", "--steps=1", "--out", str(tmp_path / "r")]
    line = refused(capsys, argv, "has no text column 'text'", "Set data.text_column to one of them")
    assert "_column=" not in line
    path.write_text("a,b,label\nx,2,0\ny,4,1\n")
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--steps=1", "--out", str(tmp_path / "r")]
    line = refused(capsys, argv, "feature column 'a'", "Set data.label_column = 'a' if it is the label")
    assert "image_column=" not in line


def test_an_idx_file_shorter_than_its_header_is_one_line(tmp_path, capsys):
    """Issue 41, item 8: ``ValueError: buffer is smaller than requested size``."""
    from zoo.data.idx import FILES

    (tmp_path / "mine").mkdir()
    for name in FILES.values():
        (tmp_path / "mine" / name).write_bytes(bytes([0, 0, 8, 3, 0, 0]))  # 3 dims, 2 bytes of 12
    argv = ["train", "mnist-mlp", "--dataset", f"idx:{tmp_path / 'mine'}", "--out", str(tmp_path / "r")]
    refused(capsys, [*argv, "--steps=1"], "names 3 dimensions (16 bytes)", "only 6 bytes", "cut short")


@pytest.mark.parametrize(
    ("vocabulary", "words"),
    [
        (
            f"hf:{FIXTURES / 'gpt2' / 'config.json'}",
            [f"{FIXTURES / 'gpt2' / 'config.json'}: not a tokenizer.json"],
        ),
        ("hf:", ['"hf:" names no tokenizer', "hf:FILE"]),
    ],
    ids=["config-json", "empty"],
)
def test_tokenizer_errors_name_the_file(capsys, tmp_path, vocabulary, words):
    """Issue 41, item 24: "not a tokenizer.json document" named no file; "hf:" read ./tokenizer.json."""
    argv = ["train", "python-docs-lm", "--set", f"data.vocabulary={vocabulary}", "--steps=1"]
    refused(capsys, [*argv, "--out", str(tmp_path / "r")], *words)
