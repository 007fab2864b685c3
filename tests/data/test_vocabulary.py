"""``zoo.data.vocabulary`` and ``zoo.data.ids``: the declared vocabularies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zoo.commands.sample import unknown_characters
from zoo.configs import DataConfig
from zoo.data.errors import DatasetError
from zoo.data.hf_tokenizer import HFTokenizer, tokenizer_from_json
from zoo.data.ids import IdVocabulary
from zoo.data.public import declared_tokenizer
from zoo.data.tokenizer import CharTokenizer
from zoo.data.vocabulary import check_form, resolve, same_ids
from zoo.errors import ZooError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "hf" / "llama3-tied"


def test_each_form_resolves_to_its_tokenizer(tmp_path):
    (tmp_path / "chars.txt").write_text("cab\n")
    assert resolve("bytes") == CharTokenizer.utf8_bytes()
    assert resolve(f"char:{tmp_path / 'chars.txt'}").chars == ("\n", "a", "b", "c")
    assert resolve("ids:50_257") == IdVocabulary(50257) and resolve("ids:9").vocab_size == 9
    assert isinstance(resolve(f"hf:{FIXTURE}"), HFTokenizer)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("words", "unknown vocabulary 'words'. Valid: bytes, hf:SRC, char:FILE, ids:N"),
        ("ids:many", "N must be an int"),
        ("ids:1", r"N in \[2, 4294967296\]"),
        ("char:", "names no file"),
        ("char:/no/such/file", "cannot read the character file"),
    ],
)
def test_bad_forms_are_named(spec, match):
    with pytest.raises(DatasetError, match=match):
        resolve(spec)


def test_an_empty_char_file_is_refused(tmp_path):
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(DatasetError, match="the file is empty"):
        resolve(f"char:{tmp_path / 'e.txt'}")


def test_id_vocabulary_round_trips_through_text_and_checkpoint_json():
    ids = IdVocabulary(1000)
    assert ids.encode("3 999\n 0").tolist() == [3, 999, 0]
    assert ids.decode(np.array([5, 6])) + ids.decode([7]) == "5 6 7 "  # streamed pieces concatenate
    assert unknown_characters(ids, "5 6 7") == []
    assert tokenizer_from_json(ids.to_json()) == ids and not ids.has_text
    with pytest.raises(DatasetError, match=r"ids must lie in \[0, 1000\)"):
        ids.encode("1000")
    with pytest.raises(DatasetError, match="no text form"):
        ids.encode("hello")


def test_the_recipe_field_takes_every_form_and_a_checkpoint_keeps_its_own(tmp_path):
    for form in ("bytes", "hf:x", "char:x", "ids:5"):
        assert DataConfig(vocabulary=form).vocabulary == form
    with pytest.raises(ZooError, match="Valid: bytes, char:FILE, hf:SRC, ids:N"):
        DataConfig(vocabulary="chars")
    (tmp_path / "c.txt").write_text("ab")
    char = resolve(f"char:{tmp_path / 'c.txt'}")
    assert declared_tokenizer(f"char:{tmp_path / 'c.txt'}", char) == char
    with pytest.raises(DatasetError, match="has a character vocabulary of its own; drop data.vocabulary"):
        declared_tokenizer("ids:3", char)
    assert check_form("ids:3") == "ids:3"
    assert same_ids(HFTokenizer("{}", 10), HFTokenizer("{}", 20)) and not same_ids(char, IdVocabulary(3))
