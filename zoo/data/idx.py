"""The idx format of MNIST-style datasets, and the four files of such a dataset.

An idx file is a big-endian header -- two zero bytes, a type code (``0x08``: unsigned bytes),
the number of dimensions -- then each dimension as a 4-byte integer, then the values. Files may
be gzipped. A dataset directory holds the four standard files (``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each
optionally ``.gz``): the official train and test splits.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from zoo.data.errors import DatasetError

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_UBYTE = 0x08


def read_idx(path: str) -> np.ndarray:
    """The uint8 array of one idx file (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"cannot read idx file {path!r}: {e}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _UBYTE:
        raise DatasetError(f"{path!r} is not an idx file of unsigned bytes (header {data[:4].hex()})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(
            f"{path!r}: its header names {ndim} dimensions ({header} bytes) but the file has only "
            f"{len(data)} bytes; the file is cut short, download it again"
        )
    shape = tuple(int(n) for n in np.frombuffer(data, ">u4", count=ndim, offset=4))
    if len(data) - header != int(np.prod(shape)):
        raise DatasetError(
            f"{path!r}: header says shape {shape} but the file holds {len(data) - header} values"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def find_files(directory: str) -> dict[str, str] | str:
    """``{role: path}`` of the four standard files in ``directory`` (plain or ``.gz``), or a
    short reason why they are not all there."""
    if not os.path.isdir(directory):
        return f"no directory {directory}"
    found, missing = {}, []
    for role, name in FILES.items():
        for candidate in (name, name + ".gz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                found[role] = path
                break
        else:
            missing.append(name)
    return found if not missing else f"{directory} lacks {', '.join(missing)}[.gz]"


def read_split_dir(directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train images [N, H, W] uint8, train labels [N], test images, test labels)`` from the
    four files of ``directory``; DatasetError when one is missing or they disagree."""
    files = find_files(directory)
    if isinstance(files, str):
        raise DatasetError(f"idx:{directory}: {files}")
    arrays = {role: read_idx(path) for role, path in files.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DatasetError(
                f"idx:{directory}: {split} images {images.shape} and labels {labels.shape} do not match "
                "([N, H, W] and [N])"
            )
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise DatasetError(f"idx:{directory}: train and test images differ in shape")
    return arrays["train_images"], arrays["train_labels"], arrays["test_images"], arrays["test_labels"]


def image_rows(images: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...] | None = None):
    """A `datasets.Dataset` with an ``image`` column (float32 [H, W], the uint8 pixels divided by
    the fixed constant 255) and a ``label`` column: a ClassLabel of ``class_names`` (a public,
    declared class set), or integers. Built through Arrow directly: ``from_dict`` takes seconds
    per 10k images."""
    import datasets
    import pyarrow as pa
    from datasets.features.features import Array2DExtensionType

    n, h, w = images.shape
    pixels = pa.array((images.reshape(-1) / np.float32(255)).astype(np.float32))
    rows = pa.ListArray.from_arrays(pa.array(np.arange(n * h + 1, dtype=np.int64) * w), pixels)
    per_image = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int64) * h), rows)
    storage = pa.ExtensionArray.from_storage(
        Array2DExtensionType((h, w), "float32"), per_image.cast(pa.list_(pa.list_(pa.float32())))
    )
    label = datasets.ClassLabel(names=list(class_names)) if class_names else datasets.Value("int64")
    features = datasets.Features({"image": datasets.Array2D(shape=(h, w), dtype="float32"), "label": label})
    table = pa.table({"image": storage, "label": pa.array(labels.astype(np.int64))})
    return datasets.Dataset(table.cast(features.arrow_schema))
