"""Writing a token store (:mod:`zoo.data.tokens.store`) as a stream of documents.

The files are written into a hidden folder beside ``out`` (``.NAME.partial-XXXX``) and renamed
to ``out`` once ``store.json``, written last, is complete: an interrupted write leaves no folder
that reads as a store. Each file's sha256 is taken while it is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from zoo.data.errors import DatasetError
from zoo.data.tokens.store import (
    FORMAT,
    META,
    RECORD,
    SPLITS,
    TOKENIZER,
    VERSION,
    docs_file,
    dtype_for,
    split_file,
)


class _HashedFile:
    """A file written in order, with its sha256 and byte count."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 -- closed in close()
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha256.update(data)
        self.bytes += len(data)

    def close(self) -> dict:
        self.file.close()
        return {"sha256": self.sha256.hexdigest(), "bytes": self.bytes}


class _Split:
    """One split's ids and the start of each of its documents."""

    def __init__(self, folder: Path, split: str) -> None:
        self.ids = _HashedFile(folder / split_file(split))
        self.starts = _HashedFile(folder / docs_file(split))
        self.tokens = 0
        self.documents = 0


class StoreWriter:
    """``add(split, ids, starts_document)`` in order, then ``finish()``; ``abort()`` (or leaving a
    ``with`` block on an exception) removes what was written.

    Within a split, documents are joined by ``separator`` 's ids, so with a per-character
    vocabulary a split holds exactly the ids of its documents' text joined by ``separator``.
    """

    def __init__(self, out: str | Path, tokenizer, vocabulary: str, *, separator: str, about: dict) -> None:
        self.out = Path(out).expanduser()
        if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
            raise DatasetError(f"--out {str(self.out)!r} already exists; choose another or remove it")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.folder, 0o777 & ~umask)  # mkdtemp's folder is private; a store is not
        self.tokenizer, self.vocabulary, self.about = tokenizer, vocabulary, dict(about)
        self.dtype = dtype_for(tokenizer.vocab_size)
        self.separator = separator
        self.separator_ids = np.asarray(tokenizer.encode(separator), np.int64)
        self.splits = {split: _Split(self.folder, split) for split in SPLITS}
        self.max_id = -1

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            self.abort()

    def add(self, split: str, ids: np.ndarray, starts_document: bool) -> None:
        """Append ``ids`` to ``split``; a new document first gets the separator (but the first)."""
        part = self.splits[split]
        ids = np.asarray(ids)
        if starts_document:
            if part.documents:
                self._write(part, self.separator_ids)
            part.starts.write(np.uint64(part.tokens).tobytes())
            part.documents += 1
        self._write(part, ids)

    def _write(self, part: _Split, ids: np.ndarray) -> None:
        if ids.size:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.tokenizer.vocab_size:
                raise ValueError(
                    f"ids in [{low}, {high}] outside the vocabulary of {self.tokenizer.vocab_size}"
                )
            self.max_id = max(self.max_id, high)
        part.ids.write(ids.astype(self.dtype).tobytes())
        part.tokens += int(ids.size)

    def counts(self) -> dict[str, dict[str, int]]:
        return {s: {"tokens": p.tokens, "documents": p.documents} for s, p in self.splits.items()}

    def finish(self) -> Path:
        """Close the files, write ``tokenizer.json`` and ``store.json``, rename to ``out``."""
        files = {}
        for split, part in self.splits.items():
            files[split_file(split)] = part.ids.close()
            files[docs_file(split)] = part.starts.close()
        empty = [s for s, p in self.splits.items() if p.tokens == 0]
        if empty:
            self.abort()
            counts = ", ".join(f"{s}: {p.documents} documents" for s, p in self.splits.items())
            raise DatasetError(
                f"the {' and '.join(empty)} split would hold no tokens ({counts}); tokenize more "
                "documents, or change --eval-fraction"
            )
        text = self.tokenizer.to_json().encode()
        (self.folder / TOKENIZER).write_bytes(text)
        files[TOKENIZER] = {"sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype.name,
            "vocab_size": self.tokenizer.vocab_size,
            "vocabulary": self.vocabulary,
            "record": RECORD,
            "separator": self.separator,
            "max_id": self.max_id,
            **self.about,
            "splits": self.counts(),
            "files": files,
        }
        (self.folder / META).write_text(json.dumps(meta, indent=1) + "\n")
        if self.out.exists():  # an empty folder, checked when the write began
            self.out.rmdir()
        os.rename(self.folder, self.out)
        return self.out

    def abort(self) -> None:
        for part in self.splits.values():
            for f in (part.ids.file, part.starts.file):
                f.close()
        shutil.rmtree(self.folder, ignore_errors=True)
