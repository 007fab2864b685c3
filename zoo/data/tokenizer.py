"""A character-level tokenizer with a reserved unknown id, and its fixed byte-level form.

A vocabulary fitted on a text (:meth:`CharTokenizer.fit`) is a function of that text: one record
with a new character adds an id and changes the model's shape. Under DP the vocabulary must not
come from the private data; :meth:`CharTokenizer.utf8_bytes` is one that never does (the 256
byte values of UTF-8, the same for every text).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from zoo.data.errors import DatasetError

UNK_ID = 0
UNK_TEXT = "\ufffd"  # what decode() prints for the <unk> id
_FORMAT = "zoo.char_tokenizer"
_VERSION = 1
BYTE_CHARS = tuple(chr(i) for i in range(256))  # byte b is the character U+00bb (Latin-1)


def _code_points(text: str) -> np.ndarray:
    """Unicode code points of ``text`` as uint32 ``[len(text)]``."""
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


@dataclass(frozen=True)
class CharTokenizer:
    """Maps each character to an id; vocabulary = ``chars`` (sorted, unique) plus ``<unk>``.

    Id 0 is reserved for ``<unk>``: characters not in ``chars`` encode to 0, and ``chars[i]``
    encodes to ``i + 1``, so ``vocab_size == len(chars) + 1``. ``decode`` renders id 0 as
    U+FFFD (the replacement character), keeping one output character per id.
    """

    chars: tuple[str, ...]
    # True: ids are the bytes of the text's UTF-8 encoding (chars are the 256 byte values),
    # a vocabulary that does not depend on any text.
    byte_level: bool = False

    def __post_init__(self) -> None:
        chars = tuple(self.chars)
        object.__setattr__(self, "chars", chars)
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise DatasetError("CharTokenizer.chars must be single characters")
        if list(chars) != sorted(set(chars)):
            raise DatasetError("CharTokenizer.chars must be sorted and unique; use CharTokenizer.fit(text)")
        if self.byte_level and chars != BYTE_CHARS:
            raise DatasetError(
                "a byte-level CharTokenizer has the 256 byte values as chars; use utf8_bytes()"
            )

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is every distinct character of ``text``."""
        return cls(tuple(sorted(set(text))))

    @classmethod
    def utf8_bytes(cls) -> CharTokenizer:
        """The fixed byte-level tokenizer: a text's UTF-8 bytes, byte ``b`` as id ``b + 1``."""
        return cls(BYTE_CHARS, byte_level=True)

    @property
    def is_public(self) -> bool:
        """Whether the vocabulary is fixed in advance rather than read from a text."""
        return self.byte_level

    @property
    def vocab_size(self) -> int:
        """Number of ids: one per character plus the ``<unk>`` id 0."""
        return len(self.chars) + 1

    @cached_property
    def _sorted_points(self) -> np.ndarray:
        return _code_points("".join(self.chars))

    @cached_property
    def _id_to_text(self) -> np.ndarray:
        return np.array([UNK_TEXT, *self.chars], dtype=object)

    def encode(self, text: str) -> np.ndarray:
        """int32 ``[len(text)]`` ids; unknown characters become ``UNK_ID`` (0). Byte-level:
        one id per byte of the UTF-8 encoding."""
        if self.byte_level:
            raw = np.frombuffer(text.encode("utf-8", errors="surrogatepass"), dtype=np.uint8)
            return raw.astype(np.int32) + 1
        points = _code_points(text)
        table = self._sorted_points
        if table.size == 0:
            return np.zeros(points.shape, np.int32)
        pos = np.searchsorted(table, points)
        found = table[np.minimum(pos, table.size - 1)] == points
        return np.where(found, pos + 1, UNK_ID).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text for a 1-D sequence of ids (id 0 -> U+FFFD)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise DatasetError(f"decode expects a 1-D sequence of int ids, got {ids.dtype} {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DatasetError(f"ids must lie in [0, {self.vocab_size}), got [{ids.min()}, {ids.max()}]")
        if ids.size == 0:
            return ""
        if self.byte_level:  # whole UTF-8 sequences become characters, the rest U+FFFD
            data = b"".join(UNK_TEXT.encode() if i == UNK_ID else bytes((i - 1,)) for i in ids.tolist())
            return data.decode("utf-8", errors="replace")
        return "".join(self._id_to_text[ids].tolist())

    def to_json(self) -> str:
        """A JSON string that :meth:`from_json` turns back into an equal tokenizer."""
        doc = {"format": _FORMAT, "version": _VERSION, "chars": "".join(self.chars)}
        return json.dumps({**doc, "byte_level": True} if self.byte_level else doc)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        """Inverse of :meth:`to_json`."""
        try:
            obj = json.loads(text)
        except (TypeError, json.JSONDecodeError) as e:
            raise DatasetError(f"not a CharTokenizer JSON document: {e}") from None
        if not isinstance(obj, dict) or obj.get("format") != _FORMAT or not isinstance(obj.get("chars"), str):
            raise DatasetError(f"not a CharTokenizer JSON document (expected format {_FORMAT!r})")
        if obj.get("version") != _VERSION:
            version = obj.get("version")
            raise DatasetError(f"unsupported CharTokenizer version {version!r}; expected {_VERSION}")
        if not isinstance(obj.get("byte_level", False), bool):
            raise DatasetError(
                f"CharTokenizer JSON: byte_level must be true or false, got {obj['byte_level']!r}"
            )
        return cls(tuple(obj["chars"]), byte_level=obj.get("byte_level", False))
