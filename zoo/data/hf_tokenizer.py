"""A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library, with the interface of
:class:`zoo.data.tokenizer.CharTokenizer` (``encode``, ``decode``, ``vocab_size``,
``to_json``), so an imported model's runs, datasets and samples speak its own tokenizer.

Saved in a checkpoint's metadata as ``{"format": "zoo.hf_tokenizer", "tokenizer": <the
tokenizer.json text>}``; :func:`tokenizer_from_json` reads either kind back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from zoo.data.errors import DatasetError

FORMAT = "zoo.hf_tokenizer"
FILE = "tokenizer.json"


@dataclass(frozen=True)
class HFTokenizer:
    """``tokenizer.json`` (its text) read by ``tokenizers.Tokenizer``; ``vocab`` is the model's
    vocabulary size when larger than the tokenizer's (ids it never produces)."""

    spec: str = field(repr=False)
    vocab: int = 0

    @classmethod
    def from_file(cls, path: str | Path, vocab: int = 0) -> HFTokenizer:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise DatasetError(f"{path}: cannot read the tokenizer ({error.strerror or error})") from None
        tok = cls(text, vocab)
        try:
            tok._tokenizer  # noqa: B018 -- a bad file fails here, in one line
        except DatasetError as error:
            raise DatasetError(f"{path}: {error}") from None
        return tok

    @cached_property
    def _tokenizer(self):
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_str(self.spec)
        except Exception as error:  # tokenizers raises its own Exception subclass
            raise DatasetError(f"not a tokenizer.json document ({error})") from None

    @classmethod
    def from_source(cls, src: str) -> HFTokenizer:
        """``data.vocabulary = "hf:SRC"``: a ``tokenizer.json`` file, a directory holding one, or
        ``ORG/NAME[@REV]`` through ``huggingface_hub``'s cache (``HF_HUB_OFFLINE`` respected)."""
        if not src.strip():
            raise DatasetError(
                'data.vocabulary = "hf:" names no tokenizer: give hf:FILE (a tokenizer.json), hf:DIR '
                "(a folder holding one) or hf:ORG/NAME"
            )
        path = Path(src).expanduser()
        if path.is_dir():
            path = path / FILE
        if path.is_file() or src.startswith((".", "/")) or src.count("/") != 1:
            return cls.from_file(path)
        import os

        from huggingface_hub import hf_hub_download

        name, _, rev = src.partition("@")
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        try:
            found = hf_hub_download(name, FILE, revision=rev or None, local_files_only=offline)
        except Exception as error:
            first = (str(error).strip().splitlines() or [""])[0]
            raise DatasetError(
                f"{src}: no local {FILE}, and the Hugging Face {'cache' if offline else 'Hub'} gave "
                f"nothing ({type(error).__name__}: {first})"
            ) from None
        return cls.from_file(found)

    @property
    def byte_level(self) -> bool:  # zoo's fixed byte vocabulary is CharTokenizer's
        return False

    @property
    def vocab_size(self) -> int:
        return max(self.vocab, self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        """int32 ``[n]`` ids, without special tokens added."""
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """:meth:`encode` of each text, encoded on the library's threads."""
        found = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)  # no offsets
        return [np.asarray(e.ids, np.int32) for e in found]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise DatasetError(f"decode expects a 1-D sequence of int ids, got shape {ids.shape}")
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "vocab": self.vocab, "tokenizer": self.spec})


def tokenizer_from_json(text: str):
    """The tokenizer a checkpoint's metadata holds: an :class:`HFTokenizer` or a
    :class:`~zoo.data.tokenizer.CharTokenizer`."""
    from zoo.data.ids import ID_FORMAT, IdVocabulary
    from zoo.data.tokenizer import CharTokenizer

    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError):
        doc = None
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return HFTokenizer(doc["tokenizer"], int(doc.get("vocab", 0)))
    if isinstance(doc, dict) and doc.get("format") == ID_FORMAT:  # ids:N, no text form
        return IdVocabulary.from_json(doc)
    return CharTokenizer.from_json(text)
