"""Fixed-shape batches: random training batches and a deterministic pass over the eval split.

Every batch is a dict of numpy arrays with a leading batch axis B and a float32 ``"mask"`` [B]
that is 1 for real rows and 0 for padding (only the last eval batch is ever padded).
classify: ``x`` float32 [B, F], ``y`` int32 [B].
lm: ``x`` int32 [B, seq_len] token windows, ``y`` int32 [B, seq_len] the next tokens (x shifted by one).
The dataset's task type (:mod:`zoo.data.tasks`) picks the readers: rows or windows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from zoo.checks import require_positive_int
from zoo.data.errors import DatasetError

# ``ds`` below is a zoo.data.dataset.Dataset (not imported: the dataset module's task types
# import these readers).

SPLITS = ("train", "eval")


def _split(ds, split: str) -> tuple[np.ndarray, np.ndarray | None]:
    if split == "train":
        return ds.x_train, ds.y_train
    if split == "eval":
        return ds.x_eval, ds.y_eval
    raise DatasetError(f"unknown split {split!r}. Valid: {', '.join(SPLITS)}.")


def _tokens_for(ds, split: str, seq_len: int | None) -> tuple[np.ndarray, int]:
    if seq_len is None:
        raise DatasetError(f"{ds.name!r} is an lm dataset: pass seq_len= to get token windows")
    seq_len = require_positive_int("seq_len", seq_len, error=DatasetError)
    tokens, _ = _split(ds, split)
    if tokens.shape[0] < seq_len + 1:
        raise DatasetError(
            f"the {split} split of {ds.name!r} has {tokens.shape[0]} tokens; "
            f"seq_len={seq_len} needs at least {seq_len + 1}"
        )
    return tokens, seq_len


def read_windows(
    tokens: np.ndarray, starts: np.ndarray, length: int, vocab_size: int, refuse: Path | None = None
) -> np.ndarray:
    """int32 ``[len(starts), length]``: the ``length`` tokens from each start. ``tokens`` may be
    a memmap (only these windows' pages are read). An id past the vocabulary is read as 0,
    ``<unk>`` (a raw ``.bin`` written with another vocabulary, or any DP run:
    ``zoo.data.tokens.store.private_rule``), or, with ``refuse`` (the split's file, a token
    store read without DP), is a DatasetError naming the file, the id and where it is."""
    starts = np.asarray(starts, np.int64)
    raw = tokens[starts[:, None] + np.arange(length)[None, :]]  # checked before the cast to int32
    past = raw >= vocab_size
    if past.any():
        if refuse is not None:
            row, col = np.argwhere(past)[0]
            raise DatasetError(
                f"{refuse}: id {int(raw[row, col]):,} at token {int(starts[row]) + int(col):,} is past "
                f"the vocabulary of {vocab_size:,} ids: the file changed after zoo tokenize wrote it "
                "(store.json records its sha256 and largest id); tokenize the source again"
            )
        raw = np.where(past, 0, raw)
    return raw.astype(np.int32)


def refusal(ds, split: str) -> Path | None:
    """The file to name when ``split`` holds an id past the vocabulary: a token store read
    without DP refuses it (zoo.data.tokens.store); None reads such ids as 0."""
    return ds.store.refusing(split) if ds.store is not None else None


def _windows(ds, split: str, tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    window = read_windows(tokens, starts, seq_len + 1, ds.vocab_size, refusal(ds, split))
    return {
        "x": np.ascontiguousarray(window[:, :-1]),
        "y": np.ascontiguousarray(window[:, 1:]),
        "mask": np.ones(len(starts), np.float32),
    }


def sample_batch(
    ds,
    split: str,
    batch_size: int,
    rng: np.random.Generator,
    seq_len: int | None = None,
    rows: slice = slice(None),
) -> dict[str, np.ndarray]:
    """One random batch from ``split`` ("train" or "eval"); ``mask`` is all ones.

    classify: rows drawn without replacement (with replacement only if batch_size > rows);
    ``seq_len`` is ignored. lm: ``batch_size`` windows starting at uniform random offsets.
    ``rows``: only these rows of the batch are read (one process's share), the same rows as
    the whole batch's.
    """
    batch_size = require_positive_int("batch_size", batch_size, error=DatasetError)
    return ds.task_type.sample(ds, split, batch_size, rng, seq_len, rows)


def sample_rows(ds, split: str, batch_size: int, rng: np.random.Generator, rows: slice) -> dict:
    """A classifier's batch: ``batch_size`` rows drawn without replacement (with, past ``n``)."""
    x, y = _split(ds, split)
    n = x.shape[0]
    if n == 0:
        raise DatasetError(f"the {split} split of {ds.name!r} is empty")
    idx = rng.choice(n, batch_size, replace=batch_size > n)[rows]
    return {"x": x[idx], "y": y[idx], "mask": np.ones(len(idx), np.float32)}


def sample_windows(
    ds, split: str, batch_size: int, rng: np.random.Generator, seq_len: int | None, rows: slice
) -> dict:
    """An LM's batch: ``batch_size`` windows at uniform random offsets."""
    tokens, seq_len = _tokens_for(ds, split, seq_len)
    starts = rng.integers(0, tokens.shape[0] - seq_len, size=batch_size)[rows]
    return _windows(ds, split, tokens, starts, seq_len)


def eval_batches(
    ds, batch_size: int, seq_len: int | None = None, max_batches: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Deterministic batches over the eval split, every one of shape ``batch_size``.

    classify: consecutive rows; the last batch is padded with zero rows whose ``mask`` is 0, so
    ``sum(mask)`` over all batches equals ``ds.num_eval``.
    lm: consecutive non-overlapping windows (``(num_eval - 1) // seq_len`` of them); a partial last
    batch is padded by repeating its first window with ``mask`` 0.
    At most ``max_batches`` batches are yielded when it is given.
    """
    batch_size = require_positive_int("batch_size", batch_size, error=DatasetError)
    limit = (
        None if max_batches is None else require_positive_int("max_batches", max_batches, error=DatasetError)
    )
    rows, make = ds.task_type.eval_source(ds, seq_len)
    for count, begin in enumerate(range(0, rows, batch_size)):
        if limit is not None and count >= limit:
            return
        real = min(batch_size, rows - begin)
        idx = np.arange(begin, begin + batch_size)
        idx[real:] = begin  # padding rows repeat a real row; the mask hides them
        batch = make(idx, real)
        batch["mask"] = (np.arange(batch_size) < real).astype(np.float32)
        yield batch


def eval_rows(ds) -> tuple[int, Callable]:
    """A classifier's eval pass: every eval row; padding rows are zeros."""

    def make(idx: np.ndarray, real: int) -> dict:
        batch = {"x": ds.x_eval[idx], "y": ds.y_eval[idx]}
        batch["x"][real:] = 0.0
        batch["y"][real:] = 0
        return batch

    return ds.num_eval, make


def eval_windows(ds, seq_len: int | None) -> tuple[int, Callable]:
    """An LM's eval pass: the non-overlapping windows of the eval stream."""
    tokens, seq_len = _tokens_for(ds, "eval", seq_len)
    starts = np.arange((tokens.shape[0] - 1) // seq_len) * seq_len
    return len(starts), lambda idx, real: _windows(ds, "eval", tokens, starts[idx], seq_len)
