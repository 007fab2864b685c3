"""``zoo.data.tokens.store``: raw ``.bin`` files and stores read back window for window, by
memory map; sizes, vocabularies and checksums checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zoo.data import load_dataset
from zoo.data.batches import eval_batches, read_windows, sample_batch
from zoo.data.errors import DataDependentWarning, DatasetError
from zoo.data.ids import IdVocabulary
from zoo.data.tokens import dtype_for, open_store
from zoo.data.tokens.build import tokenize
from zoo.data.tokens.store import META, file_sha256


def test_the_dtype_is_uint16_while_every_id_fits():
    assert [dtype_for(n).name for n in (257, 65_536, 65_537, 128_256)] == [
        "uint16",
        "uint16",
        "uint32",
        "uint32",
    ]


@pytest.mark.parametrize("vocab", [50_257, 100_000])
def test_a_raw_bin_written_by_numpy_is_read_back_window_for_window(tmp_path, vocab):
    ids = np.random.default_rng(0).integers(0, vocab, 5_003).astype(dtype_for(vocab))
    ids.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py: arr.tofile()
    ds = load_dataset(
        f"bin:{tmp_path / 'train.bin'}", task="lm", tokenizer=IdVocabulary(vocab), eval_fraction=0.1
    )
    assert isinstance(ds.store.train, np.memmap) and ds.x_train.dtype == ids.dtype
    cut = 5_003 - round(5_003 * 0.1)  # the in-memory path's cut: the last eval_fraction of the tokens
    assert (ds.num_train, ds.num_eval) == (cut, 5_003 - cut)
    length = 65
    for split, tokens in (("train", ids[:cut]), ("eval", ids[cut:])):
        starts = np.arange(0, len(tokens) - length + 1, 7)
        windows = read_windows(ds.x_train if split == "train" else ds.x_eval, starts, length, vocab)
        assert windows.dtype == np.int32
        for start, window in zip(starts, windows, strict=True):
            assert window.tolist() == tokens[start : start + length].tolist()


def test_a_train_and_an_eval_file(tmp_path):
    train, held = np.arange(300, dtype=np.uint16) % 257, np.arange(40, dtype=np.uint16)
    train.tofile(tmp_path / "train.bin")
    held.tofile(tmp_path / "val.bin")
    spec = f"bin:{tmp_path / 'train.bin'},{tmp_path / 'val.bin'}"
    ds = load_dataset(spec, task="lm", tokenizer=IdVocabulary(257))
    assert ds.x_train.tolist() == train.tolist() and ds.x_eval.tolist() == held.tolist()


def test_bad_bins_are_refused_in_one_line(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(DatasetError, match="3 bytes is not a whole number of uint16 ids"):
        load_dataset(f"bin:{path}", task="lm", tokenizer=IdVocabulary(300))
    with pytest.raises(DatasetError, match="without their vocabulary; declare it with data.vocabulary"):
        load_dataset(f"bin:{path}", task="lm")
    with pytest.raises(DatasetError, match="file not found"):
        load_dataset(f"bin:{tmp_path / 'none.bin'}", task="lm", tokenizer=IdVocabulary(300))
    with pytest.raises(DatasetError, match="supports only task='lm'"):
        load_dataset(f"bin:{path}", task="classify")


def test_ids_past_the_vocabulary_read_as_unknown_with_a_data_dependent_notice(tmp_path):
    ids = np.array([1, 2, 300, 4, 5, 6, 7, 8, 9, 10], np.uint16)
    ids.tofile(tmp_path / "t.bin")
    with pytest.warns(DataDependentWarning, match="ids up to 300 but the vocabulary has 257"):
        ds = load_dataset(
            f"bin:{tmp_path / 't.bin'}", task="lm", tokenizer=IdVocabulary(257), eval_fraction=0.2
        )
    assert read_windows(ds.x_train, np.array([0]), 5, 257).tolist() == [[1, 2, 0, 4, 5]]


def test_a_store_maps_its_splits_and_reads_only_its_metadata(tmp_path, monkeypatch):
    (tmp_path / "c").mkdir()
    for i in range(4):
        (tmp_path / "c" / f"{i}.txt").write_text(f"document {i} " * 20)
    tokenize(f"text:{tmp_path / 'c'}", tmp_path / "s", "bytes", eval_fraction=0.25)
    read = []
    real = file_sha256
    monkeypatch.setattr("zoo.data.tokens.store.file_sha256", lambda p: read.append(p) or real(p))
    store = open_store(tmp_path / "s")
    assert read == [] and isinstance(store.train, np.memmap) and isinstance(store.eval, np.memmap)
    store.verify()  # reads every file, and they match
    assert len(read) == 5


def test_a_changed_byte_is_found_by_verify(tmp_path):
    (tmp_path / "c").mkdir()
    for i in range(4):
        (tmp_path / "c" / f"{i}.txt").write_text(f"document {i} " * 20)
    tokenize(f"text:{tmp_path / 'c'}", tmp_path / "s", "bytes", eval_fraction=0.25)
    store = open_store(tmp_path / "s")
    data = bytearray((tmp_path / "s" / "train.bin").read_bytes())
    data[10] ^= 1  # same size: only the checksum tells
    (tmp_path / "s" / "train.bin").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"train.bin: its sha256 is \w+, not the \w+ recorded"):
        store.verify()
    (tmp_path / "s" / "eval.bin").write_bytes(b"\x01\x00")  # cut short: refused when opened
    with pytest.raises(DatasetError, match="eval.bin: 2 bytes, but the store records"):
        open_store(tmp_path / "s")


def test_a_damaged_store_json_is_named(tmp_path):
    (tmp_path / "c").mkdir()
    for i in range(3):
        (tmp_path / "c" / f"{i}.txt").write_text("text " * 10)
    tokenize(f"text:{tmp_path / 'c'}", tmp_path / "s", "bytes", eval_fraction=0.4)
    meta = json.loads((tmp_path / "s" / META).read_text())
    del meta["splits"]
    (tmp_path / "s" / META).write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="store.json: incomplete or damaged"):
        open_store(tmp_path / "s")
    (tmp_path / "s" / META).write_text("{}")
    with pytest.raises(DatasetError, match="not a token store"):
        open_store(tmp_path / "s")
    with pytest.raises(DatasetError, match="no store.json"):
        open_store(tmp_path / "c")


def changed_store(tmp_path: Path, split: str, id_: int) -> Path:
    """A store whose ``split`` file holds ``id_`` at every 7th token, same size, store.json
    untouched (a file changed after zoo tokenize wrote it)."""
    (tmp_path / "c").mkdir()
    for i in range(4):
        (tmp_path / "c" / f"{i}.txt").write_text(f"document {i} " * 40)
    tokenize(f"text:{tmp_path / 'c'}", tmp_path / "s", "bytes", eval_fraction=0.25)
    path = tmp_path / "s" / f"{split}.bin"
    ids = np.fromfile(path, np.uint16)
    ids[::7] = id_
    ids.tofile(path)
    return tmp_path / "s"


def first_batch(ds, split: str) -> dict:
    if split == "train":
        return sample_batch(ds, "train", 4, np.random.default_rng(0), seq_len=8)
    return next(eval_batches(ds, 4, seq_len=8))


@pytest.mark.parametrize("split", ["train", "eval"])
def test_an_id_past_the_vocabulary_is_refused_without_dp_and_read_as_unknown_under_dp(tmp_path, split):
    store = changed_store(tmp_path, split, 300)
    plain = load_dataset(f"tokens:{store}", task="lm")  # opening reads no id: it opens
    with pytest.raises(
        DatasetError, match=rf"{split}.bin: id 300 at token [\d,]+ is past the vocabulary of 257"
    ):
        first_batch(plain, split)
    private = load_dataset(f"tokens:{store}", task="lm", private=True)  # one rule for every window
    batch = first_batch(private, split)
    assert (batch["x"] >= 0).all() and (batch["x"] < 257).all()
    window = read_windows(
        getattr(private, f"x_{split}"), np.array([0]), 8, 257, private.store.refusing(split)
    )
    assert (
        window[0, 0] == window[0, 7] == 0
        and window[0, 1:7].tolist() == getattr(plain, f"x_{split}")[1:7].tolist()
    )


def test_a_recorded_largest_id_past_the_vocabulary_is_refused_at_open(tmp_path):
    store = changed_store(tmp_path, "train", 1)
    meta = json.loads((store / META).read_text())
    (store / META).write_text(json.dumps({**meta, "max_id": 257}))
    with pytest.raises(
        DatasetError, match="store.json: its largest id 257 is past its vocabulary of 257 ids"
    ):
        open_store(store)


def test_a_uint32_id_past_int32_is_caught_before_the_cast():
    tokens = np.array([5, 2**31 + 5, 7, 9], np.uint32)  # as int32 it would be negative, below any bound
    assert read_windows(tokens, np.array([0]), 4, 70_000).tolist() == [[5, 0, 7, 9]]
    with pytest.raises(DatasetError, match="id 2,147,483,653 at token 1"):
        read_windows(tokens, np.array([0]), 4, 70_000, Path("train.bin"))


def test_a_store_of_text_files_gives_each_file_as_a_user(tmp_path):
    """tokens:DIR of ``text:DIR`` held out by whole documents: with ``user_column = "file"``
    every window is cut from one training file and names it, and no file is in both splits.
    Planted: the store's train split as one segment (no document starts) mixes files."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    letters, seq = "abcdefghij", 8
    for i, letter in enumerate(letters):
        (corpus / f"{i:02d}.txt").write_text((letter * (5 + 3 * i) + "\n") * (2 + i))
    tokenize(f"text:{corpus}", tmp_path / "store", "bytes", eval_fraction=0.2, split="documents")
    ds = load_dataset(f"tokens:{tmp_path / 'store'}", task="lm", private=True, user_column="file")
    decode = ds.tokenizer.decode
    held = set(decode(np.asarray(ds.x_eval))) - {"\n"}
    kept = [letter for letter in letters if letter not in held]  # the users, in file order
    assert len(held) == 2 and set(decode(np.asarray(ds.x_train))) - {"\n"} == set(kept)
    count = ds.task_type.num_records(ds, seq)
    batch = ds.task_type.examples(ds, np.arange(count), np.ones(count, np.float32), seq)
    windows = np.concatenate([batch["x"], batch["y"][:, -1:]], axis=1)
    owners = ds.task_type.record_users(ds, seq)
    assert sorted(set(owners.tolist())) == list(range(len(kept)))
    for owner, window in zip(owners, windows, strict=True):
        assert set(decode(window)) - {"\n"} == {kept[owner]}


def test_users_by_file_need_a_store_of_files_held_out_whole(tmp_path):
    (tmp_path / "one.txt").write_text("a few words of text\n" * 20)
    tokenize(f"text:{tmp_path / 'one.txt'}", tmp_path / "store", "bytes", split="tail")
    with pytest.raises(DatasetError, match="users by file need a store of text: files held out whole"):
        load_dataset(f"tokens:{tmp_path / 'store'}", task="lm", private=True, user_column="file")
