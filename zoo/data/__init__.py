"""The dataset layer: specs -> `datasets` -> numpy train/eval splits, plus batching.

    ds = load_dataset("digits", task="classify", seed=0)          # x float32 [N, 64], y int32 [N]
    ds = load_dataset("python-docs", task="lm")                    # x int32 [T] character ids
    batch = sample_batch(ds, "train", 32, rng, seq_len=128)        # {"x", "y", "mask"}

A spec is one of the forms of the dataset table (``zoo.data.table``; :func:`dataset_kinds`
lists them); each module of ``zoo/data/forms/`` registers its own (``register_builtin`` for a
dataset known by name: ``zoo/data/forms/spiral.py``). Every failure raises ``DatasetError``
(a ``ZooError``).

The names below load on first use, so that reading the table (``zoo train --help``) does not
import `datasets`.
"""

import importlib

# name -> the module that defines it, imported on first touch (see ``__getattr__``).
_LAZY = {
    "CharTokenizer": "zoo.data.tokenizer",
    "Dataset": "zoo.data.dataset",
    "DatasetError": "zoo.data.errors",
    "dataset_kinds": "zoo.data.table",
    "eval_batches": "zoo.data.batches",
    "load_dataset": "zoo.data.sources",
    "register_builtin": "zoo.data.table",
    "sample_batch": "zoo.data.batches",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zoo.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
