"""python-docs and text: corpora, and the character tokenizer."""

from __future__ import annotations

from pydoc_data.topics import topics

import numpy as np
import pytest

from zoo.data import CharTokenizer, DatasetError, load_dataset


def _python_docs_text() -> str:
    return "\n\n".join(topics[k] for k in sorted(topics))


@pytest.fixture(scope="module")
def docs():
    return load_dataset("python-docs", task="lm")


def test_python_docs_is_the_pydoc_corpus(docs):
    text = _python_docs_text()
    assert docs.task == "lm" and docs.y_train is None and docs.y_eval is None
    assert docs.x_train.dtype == np.int32 and docs.x_train.ndim == 1
    assert docs.num_train + docs.num_eval == len(text)
    assert docs.num_eval == round(0.1 * len(text))
    assert docs.tokenizer.chars == tuple(sorted(set(text)))
    assert docs.vocab_size == len(set(text)) + 1
    assert docs.tokenizer.decode(docs.x_train) == text[: docs.num_train]
    assert docs.tokenizer.decode(docs.x_eval) == text[docs.num_train :]


def test_python_docs_is_lm_only():
    with pytest.raises(DatasetError, match="lm"):
        load_dataset("python-docs", task="classify")


def test_tokenizer_ids_follow_sorted_chars():
    text = "hello, world"
    tok = CharTokenizer.fit(text)
    chars = sorted(set(text))
    assert tok.chars == tuple(chars) and tok.vocab_size == len(chars) + 1
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.shape == (len(text),)
    assert ids.tolist() == [chars.index(c) + 1 for c in text]
    assert tok.decode(ids) == text


def test_tokenizer_roundtrip_on_corpus(docs):
    sample = _python_docs_text()[1000:5000]
    assert docs.tokenizer.decode(docs.tokenizer.encode(sample)) == sample


def test_unknown_chars_map_to_zero():
    tok = CharTokenizer.fit("abc")
    ids = tok.encode("aZb€")
    assert ids.tolist()[1] == 0 and ids.tolist()[3] == 0
    assert ids.tolist()[0] == tok.chars.index("a") + 1
    assert tok.decode(ids)[0] == "a" and tok.decode(ids)[2] == "b"
    assert tok.decode(ids)[1] != "Z"


def test_tokenizer_json_roundtrip():
    tok = CharTokenizer.fit('quote " backslash \\ newline \n emoji \U0001f600 tab \t')
    again = CharTokenizer.from_json(tok.to_json())
    assert again == tok
    probe = "emoji \U0001f600 \n?"
    np.testing.assert_array_equal(again.encode(probe), tok.encode(probe))


def test_tokenizer_rejects_bad_json_and_ids():
    with pytest.raises(DatasetError):
        CharTokenizer.from_json('{"chars": "ab"}')
    with pytest.raises(DatasetError):
        CharTokenizer.fit("ab").decode([3])
    with pytest.raises(DatasetError):
        CharTokenizer(("b", "a"))


def test_text_files_are_joined_in_order(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("First file.\nSecond line.\n", encoding="utf-8")
    b.write_text("Another document, with more text in it.\n", encoding="utf-8")
    ds = load_dataset(f"text:{a},{b}", task="lm", eval_fraction=0.2)
    expected = a.read_text(encoding="utf-8") + "\n" + b.read_text(encoding="utf-8")
    assert ds.tokenizer.chars == tuple(sorted(set(expected)))
    assert ds.tokenizer.decode(np.concatenate([ds.x_train, ds.x_eval])) == expected
    assert ds.num_eval == round(0.2 * len(expected))


def test_text_missing_file_names_path(tmp_path):
    present = tmp_path / "here.txt"
    present.write_text("some text", encoding="utf-8")
    missing = tmp_path / "not_here.txt"
    with pytest.raises(DatasetError, match="not_here.txt"):
        load_dataset(f"text:{present},{missing}", task="lm")


def test_pretrained_tokenizer_is_reused(tmp_path, docs):
    path = tmp_path / "new.txt"
    text = "def f(x):\n    return x \u2603 + 1\n"
    path.write_text(text, encoding="utf-8")
    ds = load_dataset(f"text:{path}", task="lm", tokenizer=docs.tokenizer)
    assert ds.tokenizer is docs.tokenizer and ds.vocab_size == docs.vocab_size
    ids = np.concatenate([ds.x_train, ds.x_eval])
    np.testing.assert_array_equal(ids, docs.tokenizer.encode(text))
    assert ids[text.index("\u2603")] == 0


def test_tokenizer_only_for_lm(docs):
    with pytest.raises(DatasetError, match="tokenizer"):
        load_dataset("digits", task="classify", tokenizer=docs.tokenizer)
