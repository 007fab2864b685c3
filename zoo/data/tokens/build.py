"""``zoo tokenize``'s work: a text source streamed through a declared vocabulary into a token
store, in bounded memory.

Pieces of documents (:mod:`zoo.data.tokens.documents`) are gathered into batches of about
``batch_chars`` characters, encoded together (a Hugging Face tokenizer encodes a batch on
several threads) and appended to the store's train or eval split. Every ``1/eval_fraction``-th
document (the first included) goes to eval, so the eval split holds whole documents and
``ceil(documents * eval_fraction)`` of them.

A per-character vocabulary (``bytes``, ``char:FILE``) gives the ids of the joined text whatever
the pieces. A BPE tokenizer encodes each document on its own, a document longer than
``BPE_PART`` characters in line-aligned parts (``documents.cut``), the parts of a batch on the
library's threads.

With ``--split tail`` (the ``auto`` choice for a source of fewer than ``1/eval_fraction``
documents, one big file above all) each document is held in a spool file until it ends, then
its last ``eval_fraction`` of ids goes to eval and the rest to train, as nanoGPT's
``prepare.py`` and the in-memory ``text:`` path cut a single text.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from zoo.data.errors import DatasetError
from zoo.data.table import ROW_SEPARATOR
from zoo.data.tokens.documents import PIECE_CHARS, SPLITS, Piece, cut, open_documents
from zoo.data.tokens.store import META
from zoo.data.tokens.writer import StoreWriter
from zoo.data.vocabulary import FORMS, check_form, resolve

BATCH_CHARS = 1 << 23  # characters encoded at once
BPE_BATCH_CHARS = 1 << 20  # ... by a BPE tokenizer: its encodings hold about 100 bytes a token
BPE_PART = 1 << 16  # characters a BPE tokenizer encodes as one item of a batch


@dataclass(frozen=True)
class Progress:
    """How far a tokenize run is: ``done`` of ``total`` ``unit`` s of the source (None:
    unknown), the documents and tokens written, and the seconds since it began."""

    unit: str
    done: int
    total: int | None
    documents: int
    tokens: int
    seconds: float


def eval_documents(fraction: float) -> Callable[[int], bool]:
    """Whether document ``i`` (from 0) is held out: every ``1/fraction``-th, the first
    included, ``ceil(n * fraction)`` of the first ``n``."""
    f = Fraction(fraction).limit_denominator(1_000_000)
    if not 0 < f < 1:
        raise DatasetError(f"--eval-fraction must be in (0, 1), got {fraction!r}")
    return lambda i: math.ceil((i + 1) * f) > math.ceil(i * f)


def tail_size(tokens: int, fraction: float) -> int:
    """The ids of a ``tokens``-id document that the tail rule holds out: its last
    ``round(tokens * fraction)``, at least 1 and leaving 1 (none of a 1-id document), as the
    in-memory ``text:`` path cuts its ids (:func:`zoo.data.arrays.lm_cut`)."""
    return min(max(round(tokens * fraction), 1), tokens - 1) if tokens > 1 else 0


def choose_split(split: str, documents: int | None, fraction: float) -> str:
    """The rule ``--split`` names; ``auto``: ``tail`` when the source names fewer than
    ``1 / fraction`` documents (one file: nanoGPT's rule), else ``documents`` (also when the
    count is unknown, as for a streamed ``hf:`` dataset)."""
    if split not in SPLITS:
        raise DatasetError(f"--split {split!r}: valid are {', '.join(SPLITS)}")
    if split != "auto":
        return split
    return "tail" if documents is not None and documents * fraction < 1 else "documents"


def percent(share: float) -> str:
    """``share`` as a percentage to three significant figures (0.001 is "0.1%", not "0%")."""
    return f"{share * 100:.3g}%"


def balance_notice(meta: dict) -> str | None:
    """One line when the eval split's share of the tokens is under half or over twice
    ``--eval-fraction``, else None. Its reason and advice follow the rule that split the store:
    whole documents of very different sizes (``documents``: try ``tail``), or documents so short
    that the 1 id each holds out, and the separators between them, outweigh the fraction
    (``tail``: try ``documents``)."""
    train, held = (meta["splits"][s]["tokens"] for s in ("train", "eval"))
    share, fraction = held / (train + held), meta["eval_fraction"]
    if fraction / 2 <= share <= 2 * fraction:
        return None
    if meta["split"] == "tail":
        why = (
            "--split tail holds out the last part of each document, at least 1 id of each with a "
            "separator between them, which is more than the fraction of short documents; "
            "--split documents holds out whole documents instead"
        )
    else:
        why = (
            f"--split {meta['split']} holds out whole documents of unequal sizes; "
            "--split tail holds out the last part of each document instead"
        )
    return (
        f"note: the eval split holds {share:.1%} of the tokens ({held:,} of {train + held:,}), not "
        f"about {percent(fraction)}: {why}"
    )


class _Spool:
    """One document's ids, held in a file until the document ends; then its head goes to
    train and its tail (:func:`tail_size`) to eval, read back in blocks."""

    BLOCK = 1 << 22

    def __init__(self, writer: StoreWriter, fraction: float) -> None:
        self.writer, self.fraction = writer, fraction
        self.path = writer.folder / ".document.spool"
        self.file = open(self.path, "wb")  # noqa: SIM115 -- closed in end()
        self.tokens, self.open = 0, False  # ids held; whether a document is held (maybe empty)

    def add(self, ids: np.ndarray, starts_document: bool) -> None:
        if starts_document:
            self.end()
            self.open = True
        self.file.write(np.asarray(ids).astype(self.writer.dtype).tobytes())
        self.tokens += int(np.asarray(ids).size)

    def end(self) -> None:
        """Write the document held so far: head to train, tail to eval. An empty document is a
        document of the train split, as ``--split documents`` counts it (its tail is empty)."""
        self.file.flush()
        if self.tokens:
            ids = np.memmap(self.path, dtype=self.writer.dtype, mode="r", shape=(self.tokens,))
            cut = self.tokens - tail_size(self.tokens, self.fraction)
            for split, begin, end in (("train", 0, cut), ("eval", cut, self.tokens)):
                for at in range(begin, end, self.BLOCK):
                    self.writer.add(split, ids[at : min(at + self.BLOCK, end)], at == begin)
            del ids
        elif self.open:
            self.writer.add("train", np.zeros(0, self.writer.dtype), True)
        self.file.seek(0)
        self.file.truncate()
        self.tokens, self.open = 0, False

    def close(self) -> None:
        self.end()
        self.file.close()
        self.path.unlink()


def _encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """The ids of each text. A Hugging Face tokenizer encodes a batch on its own threads, one
    item per thread: each text goes in line-aligned parts of at most ``BPE_PART`` characters."""
    batch = getattr(tokenizer, "encode_batch", None)
    if batch is None:
        return [tokenizer.encode(t) for t in texts]
    parts = [cut(t, BPE_PART) for t in texts]
    ids = iter(batch([p for text in parts for p in text]))
    return [np.concatenate([next(ids) for _ in text]) for text in parts]


def check_text_vocabulary(vocabulary: str) -> str:
    """``vocabulary`` if it is a declared form with a text side (``bytes``, ``hf:SRC``,
    ``char:FILE``); DatasetError naming it and listing those otherwise (nothing is read)."""
    valid = [form for form in FORMS if form != "ids:N"]
    if vocabulary.startswith("ids:"):
        raise DatasetError(
            f"--vocabulary {vocabulary}: ids:N has no text form to tokenize with; use {', '.join(valid)}"
        )
    try:
        return check_form(vocabulary)
    except DatasetError:
        raise DatasetError(f"unknown vocabulary {vocabulary!r}. Valid: {', '.join(valid)}.") from None


def tokenize(
    source: str,
    out: str | Path,
    vocabulary: str,
    *,
    eval_fraction: float = 0.1,
    split: str = "auto",
    text_column: str = "text",
    piece_chars: int | None = None,
    batch_chars: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict:
    """Write the store of ``source`` (``text:``, ``parquet:``, ``hf:``) through ``vocabulary``
    (``bytes``, ``hf:SRC``, ``char:FILE``) at ``out``; returns its ``store.json``. ``split``
    (:data:`SPLITS`, :func:`choose_split`): ``documents`` holds out every ``1/eval_fraction``-th
    document whole, ``tail`` the last ``eval_fraction`` of each document's ids."""
    tokenizer = resolve(check_text_vocabulary(vocabulary))
    bpe = hasattr(tokenizer, "encode_batch")  # a Hugging Face tokenizer: smaller batches
    piece_chars = piece_chars or (BPE_BATCH_CHARS if bpe else PIECE_CHARS)
    batch_chars = batch_chars or (BPE_BATCH_CHARS if bpe else BATCH_CHARS)
    held_out = eval_documents(eval_fraction)
    stream = open_documents(source, text_column=text_column, piece_chars=piece_chars)
    rule = choose_split(split, stream.documents, eval_fraction)
    about = {"source": source, "eval_fraction": eval_fraction, "split": rule, "text_column": text_column}
    began = time.perf_counter()
    with StoreWriter(out, tokenizer, vocabulary, separator=ROW_SEPARATOR, about=about) as writer:
        sink = _Spool(writer, eval_fraction) if rule == "tail" else None
        documents, pending, size = 0, [], 0
        for piece in stream.pieces:
            pending.append(piece)
            size += len(piece.text)
            if size >= batch_chars:
                documents = _flush(writer, tokenizer, pending, documents, held_out, sink)
                pending, size = [], 0
                _report(on_progress, stream, piece.done, writer, documents, began)
        if pending:
            documents = _flush(writer, tokenizer, pending, documents, held_out, sink)
        if sink is not None:
            sink.close()  # the tail rule writes a document when it ends: the last one now
        # the last line counts all that was written, the tail rule's last document included
        _report(on_progress, stream, piece.done if documents else 0, writer, documents, began)
        stored = writer.finish()
    return json.loads((stored / META).read_text())


def _flush(
    writer: StoreWriter, tokenizer, pieces: list[Piece], documents: int, held_out, sink: _Spool | None
) -> int:
    """Encode ``pieces`` and append them (to ``sink`` under the tail rule); returns the
    documents seen so far."""
    for piece, ids in zip(pieces, _encode(tokenizer, [p.text for p in pieces]), strict=True):
        documents += piece.starts_document
        if sink is not None:
            sink.add(ids, piece.starts_document)
        else:
            writer.add("eval" if held_out(documents - 1) else "train", ids, piece.starts_document)
    return documents


def _report(on_progress, stream, done: int, writer: StoreWriter, documents: int, began: float) -> None:
    if on_progress is not None:
        tokens = sum(c["tokens"] for c in writer.counts().values())
        on_progress(Progress(stream.unit, done, stream.total, documents, tokens, time.perf_counter() - began))
