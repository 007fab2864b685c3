"""A token store on disk, read by index: ``tokens:DIR`` (written by ``zoo tokenize``) and a raw
``.bin`` of ids (``bin:PATH[,EVAL_PATH]``, the file nanoGPT's ``prepare.py`` writes).

A store is a directory::

    store.json        format, dtype, vocabulary, record unit, token counts, a sha256 per file
    train.bin         the train split: one flat stream of ids (uint16, or uint32 past 65,536 ids)
    eval.bin          the eval split, whole documents held out (zoo tokenize --eval-fraction)
    train.docs        uint64 start of each document in train.bin (eval.docs for eval.bin)
    tokenizer.json    the tokenizer, as zoo saves it in a checkpoint

Both splits are ``np.memmap`` arrays: opening a store reads ``store.json`` and ``tokenizer.json``
only, whatever its size, and a batch reads its windows' pages. The sha256 in ``store.json``
were taken while the files were written; :meth:`TokenStore.verify` reads the files again to
check them (a resumed run does). A raw ``.bin`` has no ``store.json``: it is read once when
opened, to take its checksum and its largest id.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from zoo.data.errors import DataDependentWarning, DatasetError

FORMAT = "zoo.token_store"
VERSION = 1
META = "store.json"
TOKENIZER = "tokenizer.json"
SPLITS = ("train", "eval")
RECORD = "window"  # a DP record: seq_len + 1 tokens at stride seq_len (docs/data.md)
_HASH_BLOCK = 1 << 24  # bytes read at a time to hash a file


def dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (at most 65,536 ids), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def split_file(split: str) -> str:
    return f"{split}.bin"


def docs_file(split: str) -> str:
    return f"{split}.docs"


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks (the file is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _digest(checksums: dict[str, str], **parts) -> str:
    """What tells this data from other data: the files' checksums by name (a store that moves
    keeps its digest), plus ``parts``."""
    named = {Path(path).name: sha for path, sha in checksums.items()}
    return hashlib.sha256(json.dumps({**parts, "files": named}, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class TokenStore:
    """Train and eval ids memory-mapped from ``path``, their tokenizer, and ``digest``: what a
    run records to tell this data from any other (:func:`zoo.train.resume.check_same_data`)."""

    path: Path
    train: np.ndarray
    eval: np.ndarray
    tokenizer: object
    digest: str
    vocabulary: str | None = None  # the declared form it was written with (tokens:DIR)
    checksums: dict[str, str] = field(default_factory=dict)  # file path -> sha256
    max_id: int = 0
    # An id past the vocabulary in a batch: "refuse" it (a store, whose ids zoo tokenize wrote
    # and store.json bounds) or read it as 0, "<unk>" (a raw .bin, said when it is opened; and
    # every DP run, the same for every record and without a word: :func:`private_rule`).
    past_vocabulary: str = "refuse"
    # What zoo tokenize read (store.json's "source" and "split"): whether its documents are the
    # files of a text: source, held out whole (file_segments: each file one user).
    source: str | None = None
    split_rule: str | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.train.dtype

    def refusing(self, split: str) -> Path | None:
        """The file an id past the vocabulary in ``split`` is refused in, or None where it is
        read as 0."""
        if self.past_vocabulary != "refuse":
            return None
        return self.path / split_file(split) if self.path.is_dir() else self.path

    def verify(self) -> None:
        """Read every file again; DatasetError naming the first whose sha256 is not the one
        recorded (the data changed under the run)."""
        for path, expected in self.checksums.items():
            found = file_sha256(Path(path)) if Path(path).is_file() else "(no file)"
            if found != expected:
                raise DatasetError(
                    f"{path}: its sha256 is {found[:16]}, not the {expected[:16]} recorded for it: "
                    "the data changed"
                )


def _read_meta(root: Path) -> dict:
    path = root / META
    if not root.is_dir():
        raise DatasetError(f"tokens:{root}: not a directory (write a store with zoo tokenize SRC --out DIR)")
    if not path.is_file():
        raise DatasetError(
            f"tokens:{root}: no {META} (a store is written by zoo tokenize SRC --out DIR; an "
            "interrupted one leaves none)"
        )
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DatasetError(f"{path}: not a token store's metadata ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatasetError(f"{path}: not a token store (expected format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise DatasetError(f"{path}: store version {meta.get('version')!r}; this zoo reads {VERSION}")
    return meta


def stored_vocabulary(dataset: str) -> str | None:
    """The declared vocabulary the token store ``tokens:DIR`` was written with, read from its
    metadata alone (nothing of the data); None for any other dataset."""
    if not dataset.startswith("tokens:") or not dataset[len("tokens:") :].strip():
        return None
    vocabulary = _read_meta(Path(dataset[len("tokens:") :].strip()).expanduser()).get("vocabulary")
    return vocabulary if isinstance(vocabulary, str) else None


def _map(path: Path, dtype: np.dtype, tokens: int | None = None) -> np.ndarray:
    """``path`` as a read-only memmap of ``dtype`` ids (``tokens`` of them, when known)."""
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise DatasetError(
            f"{path}: {size:,} bytes is not a whole number of {dtype} ids ({dtype.itemsize} bytes each)"
        )
    if tokens is not None and size != tokens * dtype.itemsize:
        raise DatasetError(
            f"{path}: {size:,} bytes, but the store records {tokens:,} {dtype} ids "
            f"({tokens * dtype.itemsize:,} bytes): the file was changed or cut short"
        )
    if size == 0:
        raise DatasetError(f"{path}: no tokens")
    return np.memmap(path, dtype=dtype, mode="r")


def open_store(root: str | Path) -> TokenStore:
    """The store in directory ``root``; reads its two small files, maps the rest."""
    from zoo.data.hf_tokenizer import tokenizer_from_json

    root = Path(root).expanduser()
    meta = _read_meta(root)
    try:
        dtype = np.dtype(meta["dtype"])
        splits = {s: _map(root / split_file(s), dtype, int(meta["splits"][s]["tokens"])) for s in SPLITS}
        tokenizer = tokenizer_from_json((root / TOKENIZER).read_text())
        checksums = {str(root / name): entry["sha256"] for name, entry in meta["files"].items()}
        vocab_size, vocabulary, max_id = int(meta["vocab_size"]), meta["vocabulary"], int(meta["max_id"])
    except (KeyError, TypeError, ValueError, OSError) as error:
        raise DatasetError(
            f"{root / META}: incomplete or damaged ({type(error).__name__}: {error})"
        ) from None
    if tokenizer.vocab_size != vocab_size or dtype != dtype_for(vocab_size):
        raise DatasetError(
            f"{root / META}: vocab_size {vocab_size} and dtype {dtype} do not match its tokenizer "
            f"({tokenizer.vocab_size} ids)"
        )
    if not 0 <= max_id < vocab_size:
        raise DatasetError(
            f"{root / META}: its largest id {max_id} is past its vocabulary of {vocab_size} ids"
        )
    digest = _digest(checksums, dtype=dtype.name)
    return TokenStore(
        root,
        splits["train"],
        splits["eval"],
        tokenizer,
        digest,
        vocabulary,
        checksums,
        max_id,
        source=meta.get("source"),
        split_rule=meta.get("split"),
    )


def open_bin(paths: list[Path], tokenizer, eval_fraction: float) -> TokenStore:
    """Raw ids (``dtype_for(tokenizer.vocab_size)``): a train file and an eval file, or one file
    whose last ``eval_fraction`` is the eval split. Each file is read once, here, for its sha256
    and its largest id; ids past the vocabulary become 0 (<unk>) in every batch, with a notice."""
    dtype = dtype_for(tokenizer.vocab_size)
    checksums, top = {}, 0
    for path in paths:
        checksums[str(path)], largest = _scan(path, dtype)
        top = max(top, largest)
    arrays = [_map(path, dtype) for path in paths]
    if len(arrays) == 1:
        n = arrays[0].shape[0]
        held = min(max(int(round(n * eval_fraction)), 1), n - 1) if n > 1 else 0
        if held == 0:
            raise DatasetError(f"{paths[0]}: {n} token; need at least 2 to split train from eval")
        arrays = [arrays[0][: n - held], arrays[0][n - held :]]
    if top >= tokenizer.vocab_size:
        warnings.warn(
            f"bin:{paths[0]}: ids up to {top} but the vocabulary has {tokenizer.vocab_size}; the "
            "ids past it are read as 0 (<unk>). Declare the vocabulary the file was written with",
            DataDependentWarning,
            stacklevel=3,
        )
    digest = _digest(checksums, dtype=dtype.name, split=[int(a.shape[0]) for a in arrays])
    return TokenStore(paths[0], arrays[0], arrays[1], tokenizer, digest, None, checksums, top, "unk")


def private_rule(store: TokenStore) -> TokenStore:
    """``store`` as a DP run reads it: an id past the vocabulary is read as 0 (``<unk>``) in
    every window, without a word. Refusing the run, or saying so, would depend on the one
    window that holds it: a release outside the mechanism (docs/dp-data.md). What opening a store
    checks (each file's size against the recorded token count, the recorded largest id
    against the vocabulary) reads ``store.json`` and the file sizes, never an id."""
    return replace(store, past_vocabulary="unk")


def file_segments(store: TokenStore, spec: str) -> np.ndarray:
    """int64 ``[D + 1]``: the bounds of the train split's documents, for a store whose
    documents are the files of a ``text:`` source held out whole (``zoo tokenize text:DIR
    --split documents``), so that each file is one user (``data.user_column = "file"``). A
    document's segment ends with the separator that follows it. Reads ``train.docs`` (one
    number per document), never an id; DatasetError for another store."""
    if not (store.source or "").startswith("text:") or store.split_rule != "documents":
        raise DatasetError(
            f"{spec!r}: users by file need a store of text: files held out whole (zoo tokenize "
            f"text:DIR --split documents); this one was written from {store.source!r} with "
            f"--split {store.split_rule}"
        )
    starts = np.fromfile(store.path / docs_file("train"), dtype=np.uint64).astype(np.int64)
    return np.concatenate([starts, [store.train.shape[0]]]).astype(np.int64)


def _scan(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """sha256 and largest id of a raw id file, in blocks."""
    _map(path, dtype)  # its size is checked before it is read
    digest, top = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            top = max(top, int(np.frombuffer(block, dtype).max()))
    return digest.hexdigest(), top


@dataclass(frozen=True)
class TokenSource:
    """What a token form's reader returns instead of rows (``zoo.data.forms.tokens``):
    ``open(tokenizer, eval_fraction)`` gives the store, ``tokenizer`` being the declared one
    (``data.vocabulary``, or a start checkpoint's), or None."""

    open: Callable[[object, float], TokenStore]
