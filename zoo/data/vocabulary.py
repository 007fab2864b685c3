"""Declared vocabularies: the forms ``data.vocabulary`` and ``zoo tokenize --vocabulary`` take.

A declared vocabulary is fixed before any text is read, so it is the same for every dataset and
may be used under DP (``zoo.data.public``):

- ``bytes``: UTF-8 bytes, byte ``b`` as id ``b + 1`` (:meth:`CharTokenizer.utf8_bytes`);
- ``hf:SRC``: a Hugging Face ``tokenizer.json`` (a file, a folder holding one, ``ORG/NAME``);
- ``char:FILE``: one id per distinct character of ``FILE`` (every character in it, a newline
  included), plus the ``<unk>`` id 0. The file is the declaration: it is never the corpus;
- ``ids:N``: ``N`` ids with no text form, for token files written by another tool
  (:class:`zoo.data.ids.IdVocabulary`).
"""

from __future__ import annotations

from pathlib import Path

from zoo.data.errors import DatasetError
from zoo.data.ids import IdVocabulary
from zoo.data.tokenizer import CharTokenizer

FORMS = ("bytes", "hf:SRC", "char:FILE", "ids:N")


def char_vocabulary(path: str) -> CharTokenizer:
    """``char:FILE``: the distinct characters of ``FILE`` (UTF-8), each one an id."""
    if not path.strip():
        raise DatasetError("char: names no file; write char:FILE, a file holding the characters")
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise DatasetError(f"char:{path}: cannot read the character file ({reason})") from None
    if not text:
        raise DatasetError(f"char:{path}: the file is empty; it must hold every character of the vocabulary")
    return CharTokenizer.fit(text)


def id_vocabulary(count: str) -> IdVocabulary:
    """``ids:N``."""
    try:
        size = int(count.replace("_", ""))
    except ValueError:
        raise DatasetError(f"ids:{count}: N must be an int, e.g. ids:50257") from None
    return IdVocabulary(size)


def check_form(spec: str) -> str:
    """``spec`` if it is written in one of :data:`FORMS` (nothing is read), else DatasetError."""
    scheme, sep, rest = str(spec).partition(":")
    if spec == "bytes" or (sep and scheme in ("hf", "char", "ids") and rest.strip()):
        return spec
    raise DatasetError(f"unknown vocabulary {spec!r}. Valid: {', '.join(FORMS)}.")


def resolve(spec: str):
    """The tokenizer a declared vocabulary names (DatasetError listing the forms otherwise)."""
    if not isinstance(spec, str):
        raise DatasetError(f"a vocabulary is a string, got {type(spec).__name__}")
    if spec == "bytes":
        return CharTokenizer.utf8_bytes()
    scheme, sep, rest = spec.partition(":")
    if sep and scheme == "hf":
        from zoo.data.hf_tokenizer import HFTokenizer

        return HFTokenizer.from_source(rest)
    if sep and scheme == "char":
        return char_vocabulary(rest)
    if sep and scheme == "ids":
        return id_vocabulary(rest)
    raise DatasetError(f"unknown vocabulary {spec!r}. Valid: {', '.join(FORMS)}.")


def same_ids(a, b) -> bool:
    """Whether two tokenizers give every text the same ids (an HF tokenizer's padding of the
    model's vocabulary aside)."""
    if type(a) is not type(b):
        return False
    spec = getattr(a, "spec", None)
    return spec == b.spec if spec is not None else a == b
