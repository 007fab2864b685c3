"""hf:NAME[:CONFIG]: fails fast offline; the conversion path, checked with a stand-in for the Hub."""

from __future__ import annotations

import time

import datasets
import numpy as np
import pytest

import zoo.data.hub as hub
from zoo.data import CharTokenizer, DatasetError, load_dataset

ALTERNATIVES = ("digits", "python-docs", "text:PATH", "csv:PATH", "parquet:PATH")


def _never_called(*args, **kwargs):
    raise AssertionError("datasets.load_dataset must not be reached")


def test_hf_mnist_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DatasetError) as err:
        load_dataset("hf:mnist", task="classify")
    assert time.monotonic() - start < 10
    assert "hf:mnist" in str(err.value) and "digits" in str(err.value)


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_flag_fails_fast(monkeypatch, var):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv(var, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # flag set after `datasets` was imported
    monkeypatch.setattr(hub.datasets, "load_dataset", _never_called)
    start = time.monotonic()
    with pytest.raises(DatasetError) as err:
        load_dataset("hf:mnist", task="classify")
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert "hf:mnist" in msg and var in msg and all(alt in msg for alt in ALTERNATIVES)


def test_real_offline_datasets_error_is_wrapped(monkeypatch):
    """With `datasets` itself offline its ConnectionError becomes a DatasetError naming the alternatives."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)

    def offline(name, config=None, **kwargs):
        raise ConnectionError(f"Couldn't reach {name!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(hub.datasets, "load_dataset", offline)
    with pytest.raises(DatasetError) as err:
        load_dataset("hf:karpathy/tiny_shakespeare", task="lm")
    assert "hf:karpathy/tiny_shakespeare" in str(err.value) and "digits" in str(err.value)


def test_unreachable_hub_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://zoo-hub-probe.invalid")
    monkeypatch.setattr(hub.datasets, "load_dataset", _never_called)
    start = time.monotonic()
    with pytest.raises(DatasetError) as err:
        load_dataset("hf:mnist", task="classify")
    assert time.monotonic() - start < 10
    assert "zoo-hub-probe.invalid" in str(err.value) and "digits" in str(err.value)


def test_network_errors_inside_datasets_are_offline_errors(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "unreachable_reason", lambda *a, **k: None)

    class ConnectTimeout(Exception):  # what an HTTP client raises, not an OSError
        pass

    def flaky(name, config=None, **kwargs):
        raise RuntimeError("download failed") from ConnectTimeout("timed out")

    monkeypatch.setattr(hub.datasets, "load_dataset", flaky)
    with pytest.raises(DatasetError, match="parquet:PATH"):
        load_dataset("hf:mnist", task="classify")


def _fake_mnist(n: int, seed: int):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )
    from PIL import Image

    rows = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p) for p in pixels], "label": labels.tolist()}, features=features
    )
    return rows, pixels, labels


def test_hf_classify_converts_images(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "unreachable_reason", lambda *a, **k: None)
    train, pixels, labels = _fake_mnist(40, 0)
    test, _, _ = _fake_mnist(5, 1)
    calls = []

    def fake(name, config=None, **kwargs):
        calls.append((name, config))
        return datasets.DatasetDict({"train": train, "test": test})

    monkeypatch.setattr(hub.datasets, "load_dataset", fake)
    ds = load_dataset("hf:someone/mini-mnist:cfg", task="classify", eval_fraction=0.25, classes=(1, 2, 3))
    assert calls == [("someone/mini-mnist", "cfg")]
    assert ds.feature_shape == (28, 28) and ds.num_features == 784 and ds.num_classes == 3
    keep = np.isin(labels, (1, 2, 3))
    x = np.concatenate([ds.x_train, ds.x_eval])
    y = np.asarray([1, 2, 3])[np.concatenate([ds.y_train, ds.y_eval])]
    scaled = (pixels[keep] / 255.0).astype(np.float32).reshape(-1, 784)
    expected = {(r.tobytes(), int(lab)) for r, lab in zip(scaled, labels[keep], strict=True)}
    assert {(r.tobytes(), int(lab)) for r, lab in zip(x, y, strict=True)} == expected
    assert len(x) == int(keep.sum())


def test_hf_lm_reads_train_text(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "unreachable_reason", lambda *a, **k: None)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 5
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": [text]}),
            "validation": datasets.Dataset.from_dict({"text": ["QQQ"]}),
        }
    )
    monkeypatch.setattr(hub.datasets, "load_dataset", lambda name, config=None, **kw: splits)
    ds = load_dataset("hf:karpathy/tiny_shakespeare", task="lm")
    assert ds.tokenizer.decode(np.concatenate([ds.x_train, ds.x_eval])) == text
    assert "Q" not in ds.tokenizer.chars


def test_hf_lm_reads_users_from_a_user_column(monkeypatch):
    """A Hub dataset's rows with a user column, under DP: whole users held out, and every
    window cut from one user's own text (its rows joined), naming that user."""
    from tests.data.test_users import LETTERS, user_text

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "unreachable_reason", lambda *a, **k: None)
    rows = [(line, f"u{u}") for u in range(len(LETTERS)) for line in user_text(u).splitlines()]
    table = {"text": [t for t, _ in rows], "user": [u for _, u in rows]}
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(table)})
    monkeypatch.setattr(hub.datasets, "load_dataset", lambda name, config=None, **kw: splits)
    tok = CharTokenizer.utf8_bytes()
    ds = load_dataset("hf:someone/notes", task="lm", private=True, user_column="user", tokenizer=tok)
    held = set(tok.decode(np.asarray(ds.x_eval))) - {"\n"}
    kept = sorted({u for _, u in rows} - {f"u{LETTERS.index(c)}" for c in held})  # ids: name order
    assert (
        held
        and kept
        and set(tok.decode(np.asarray(ds.x_train))) - {"\n"} == {LETTERS[int(u[1:])] for u in kept}
    )
    count = ds.task_type.num_records(ds, 8)
    batch = ds.task_type.examples(ds, np.arange(count), np.ones(count, np.float32), 8)
    owners = ds.task_type.record_users(ds, 8)
    for owner, window in zip(owners, np.concatenate([batch["x"], batch["y"][:, -1:]], axis=1), strict=True):
        assert set(tok.decode(window)) - {"\n"} == {LETTERS[int(kept[owner][1:])]}


@pytest.mark.parametrize("flag", [None, "HF_HUB_OFFLINE"])
def test_a_local_dataset_folder_needs_no_hub(monkeypatch, tmp_path, flag):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    if flag:  # set after `datasets` was imported: a Hub name would be refused straight away
        monkeypatch.setenv(flag, "1")
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "unreachable_reason", lambda *a, **k: "cannot connect (a stand-in)")
    (tmp_path / "local").mkdir()
    pq.write_table(pa.table({"text": ["hello there, friend\n"] * 40}), tmp_path / "local" / "train.parquet")
    ds = load_dataset(f"hf:{tmp_path / 'local'}", task="lm", tokenizer=CharTokenizer.utf8_bytes())
    assert ds.x_train.size + ds.x_eval.size == 40 * len("hello there, friend\n") + 39
