"""The dataset layer: specs -> `datasets` -> numpy train/eval splits, plus batching.

    ds = load_dataset("digits", task="classify", seed=0)          # x float32 [N, 64], y int32 [N]
    ds = load_dataset("python-docs", task="lm")                    # x int32 [T] character ids
    batch = sample_batch(ds, "train", 32, rng, seq_len=128)        # {"x", "y", "mask"}

Specs are listed in ``DATASET_KINDS``; every failure raises ``DatasetError`` (a ``ZooError``).
"""

from zoo.data.batches import eval_batches, sample_batch
from zoo.data.dataset import Dataset
from zoo.data.errors import DatasetError
from zoo.data.sources import DATASET_KINDS, load_dataset
from zoo.data.tokenizer import CharTokenizer

__all__ = [
    "DATASET_KINDS",
    "CharTokenizer",
    "Dataset",
    "DatasetError",
    "eval_batches",
    "load_dataset",
    "sample_batch",
]
