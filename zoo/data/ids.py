"""``ids:N``: a vocabulary of ``N`` ids with no text form, for token files written elsewhere."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zoo.data.errors import DatasetError

ID_FORMAT = "zoo.id_vocabulary"
MAX_IDS = 2**32  # a uint32 id


@dataclass(frozen=True)
class IdVocabulary:
    """``size`` ids with no text form: ``decode`` writes the ids in decimal, ``encode`` reads
    them back (a prompt for ``zoo sample`` is written the same way: ``--prompt "12 7 301"``)."""

    size: int

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 2 <= self.size <= MAX_IDS:
            raise DatasetError(f"ids:N needs an int N in [2, {MAX_IDS}], got {self.size!r}")

    @property
    def byte_level(self) -> bool:
        return False

    @property
    def has_text(self) -> bool:
        """False: an id stands for no characters (bits per character count one per token)."""
        return False

    @property
    def vocab_size(self) -> int:
        return self.size

    def encode(self, text: str) -> np.ndarray:
        """int32 ids from their decimal form, separated by whitespace."""
        try:
            ids = np.asarray([int(word) for word in text.split()], np.int64)
        except ValueError:
            raise DatasetError(
                f"ids:{self.size} has no text form: write the ids in decimal, e.g. '12 7 301'"
            ) from None
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise DatasetError(f"ids must lie in [0, {self.size}), got [{ids.min()}, {ids.max()}]")
        return ids.astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Each id in decimal followed by a space, so that decoded pieces concatenate."""
        return "".join(f"{int(i)} " for i in np.asarray(ids).ravel())

    def to_json(self) -> str:
        return json.dumps({"format": ID_FORMAT, "size": self.size})

    @classmethod
    def from_json(cls, doc: dict) -> IdVocabulary:
        return cls(doc.get("size"))
