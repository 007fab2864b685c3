"""Token data on disk, read by index (``zoo.data.tokens``): ``tokens:DIR``, a store written by
``zoo tokenize``, and ``bin:PATH[,EVAL_PATH]``, raw ids of the vocabulary ``data.vocabulary``
declares (uint16 when it has at most 65,536 ids, else uint32)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from zoo.data.errors import DatasetError
from zoo.data.table import Columns, DatasetForm, register_form
from zoo.data.tokens.store import TokenSource, TokenStore, open_bin, open_store
from zoo.data.vocabulary import FORMS, same_ids


def _store(spec: str, rest: str, tokenizer, eval_fraction: float) -> TokenStore:
    if not rest.strip():
        raise DatasetError(f"{spec!r} names no directory; write tokens:DIR (zoo tokenize SRC --out DIR)")
    store = open_store(rest.strip())
    if tokenizer is not None and not same_ids(tokenizer, store.tokenizer):
        raise DatasetError(
            f"{spec!r} was written with the vocabulary {store.vocabulary!r}, which gives other ids "
            "than the declared one (data.vocabulary, or the start checkpoint's); drop data.vocabulary, "
            "or tokenize again with the declared vocabulary"
        )
    # A checkpoint's tokenizer may pad the model's vocabulary: keep it, its ids are the store's.
    return store if tokenizer is None else replace(store, tokenizer=tokenizer)


def _bin(spec: str, rest: str, tokenizer, eval_fraction: float) -> TokenStore:
    paths = [Path(p.strip()).expanduser() for p in rest.split(",") if p.strip()]
    if not 1 <= len(paths) <= 2:
        raise DatasetError(f"{spec!r}: write bin:TRAIN_PATH or bin:TRAIN_PATH,EVAL_PATH")
    if tokenizer is None:
        raise DatasetError(
            f"{spec!r} holds ids without their vocabulary; declare it with data.vocabulary "
            f"({', '.join(FORMS)}; ids:N for N ids with no text form)"
        )
    return open_bin(paths, tokenizer, eval_fraction)


def read_tokens(spec: str, rest: str, columns: Columns) -> TokenSource:
    return TokenSource(lambda tokenizer, fraction: _store(spec, rest, tokenizer, fraction))


def read_bin(spec: str, rest: str, columns: Columns) -> TokenSource:
    return TokenSource(lambda tokenizer, fraction: _bin(spec, rest, tokenizer, fraction))


register_form(
    DatasetForm(
        "tokens",
        "tokens:DIR",
        ("lm",),
        read_tokens,
        "a token store written by zoo tokenize, read by index from disk",
        offline=True,
        users=True,  # a store of text: files held out whole: each file one user (file_segments)
        user_column="file",
    )
)
register_form(
    DatasetForm(
        "bin",
        "bin:PATH[,EVAL_PATH]",
        ("lm",),
        read_bin,
        "raw uint16/uint32 token ids (nanoGPT's train.bin) of the vocabulary data.vocabulary declares",
        offline=True,
    )
)
