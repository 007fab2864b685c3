"""The dataset layer: specs -> `datasets` -> numpy train/eval splits, plus batching.

    ds = load_dataset("digits", task="classify", seed=0)          # x float32 [N, 64], y int32 [N]
    ds = load_dataset("python-docs", task="lm")                    # x int32 [T] character ids
    batch = sample_batch(ds, "train", 32, rng, seq_len=128)        # {"x", "y", "mask"}

Specs are listed in ``DATASET_KINDS``; every failure raises ``DatasetError`` (a ``ZooError``).
Offline datasets known by name register with ``register_builtin`` (``zoo/data/spiral.py``).
"""

from zoo.data import mnist as _mnist  # noqa: F401  (registers "mnist", "fashion-mnist" and their "-val")
from zoo.data import spiral as _spiral  # noqa: F401  (registers the "spiral" builtin)
from zoo.data.batches import eval_batches, sample_batch
from zoo.data.dataset import Dataset
from zoo.data.errors import DatasetError
from zoo.data.sources import dataset_kinds, load_dataset, register_builtin
from zoo.data.tokenizer import CharTokenizer

DATASET_KINDS = dataset_kinds()

__all__ = [
    "DATASET_KINDS",
    "CharTokenizer",
    "Dataset",
    "DatasetError",
    "eval_batches",
    "dataset_kinds",
    "load_dataset",
    "register_builtin",
    "sample_batch",
]
