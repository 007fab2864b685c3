"""Issue 41, items 1-4: runs that exited 0 having done the wrong thing. An import without a
tokenizer fitted a character vocabulary onto its pretrained embedding (under DP: off the
private text), ``hf:LOCAL_DIR`` reused a stale import, and ``eval_bits_per_char`` was bits per
token (or per byte)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.e2e.clikit import refused
from zoo.cli import main

FIXTURES = Path(__file__).parents[2] / "fixtures" / "hf"
TINY = [
    "--set=data.seq_len=16",
    "--set=train.batch_size=4",
    "--set=train.eval_batches=1",
    "--set=optim.warmup_steps=0",
    "--steps=1",
    "--no-progress",
    "--json",
]

pytestmark = pytest.mark.xdist_group("hf")


@pytest.fixture
def untokenized(tmp_path, capsys):
    """``zoo import`` of a folder with config.json and model.safetensors only, and a text."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "gpt2" / name, src / name)
    assert main(["import", str(src), "--out", str(tmp_path / "imp"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    return tmp_path, result


def test_import_says_it_found_no_tokenizer(untokenized):
    _, result = untokenized
    assert result["tokenizer"].startswith("none")
    assert "data.vocabulary=hf:" in result["finetune"]


@pytest.mark.parametrize("recipe", ["hf-lm-dp-lora", "hf-lm-lora"])
def test_an_import_without_a_tokenizer_needs_a_declared_vocabulary(capsys, untokenized, recipe):
    """Item 1 (DP: the vocabulary would be read off the private text) and item 2 (the text's
    characters would become the first rows of the pretrained embedding)."""
    root, _ = untokenized
    argv = ["train", recipe, "--init-from", str(root / "imp"), "--dataset", f"text:{root / 't.txt'}"]
    refused(capsys, [*argv, "--out", str(root / "run"), *TINY], "carries no tokenizer", "data.vocabulary")
    assert not (root / "run").exists()


def test_hf_local_dir_imports_again_when_its_weights_change(tmp_path, monkeypatch, capsys):
    """Item 3: the cache is keyed on the folder's files, and a reuse says so."""
    import zoo
    from zoo.train.hf import import_cached

    monkeypatch.setenv("ZOO_HF_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama-kv1", src)
    first = import_cached(str(src))
    with pytest.warns(UserWarning, match="reusing its import"):
        assert import_cached(str(src)) == first
    shutil.copy(FIXTURES / "llama-kv2" / "model.safetensors", src / "model.safetensors")
    shutil.copy(FIXTURES / "llama-kv2" / "config.json", src / "config.json")
    second = import_cached(str(src))
    assert second != first
    assert zoo.load_checkpoint(second).model_config.num_kv_heads == 2
    assert zoo.load_checkpoint(first).model_config.num_kv_heads == 1


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bits_per_char_of_a_bytes_run_counts_characters_not_bytes(tmp_path, capsys):
    """Item 4: "zoo é " is 6 characters in 7 UTF-8 bytes, so bits per character is 7/6 of the
    loss in bits per byte (the span's first character may be cut: 1 in 48)."""
    (tmp_path / "t.txt").write_text("zoo é " * 400)
    argv = [
        "train",
        "python-docs-lm-dp",
        "--dataset",
        f"text:{tmp_path / 't.txt'}",
        "--out",
        str(tmp_path / "r"),
    ]
    sets = ["--set=dp.enabled=false", "--set=model.max_len=16", "--set=model.num_layers=1"]
    assert main([*argv, *sets, *TINY]) == 0
    summary = _summary(capsys)
    per_byte = summary["eval_loss"] / math.log(2)
    assert summary["eval_bits_per_char"] == pytest.approx(per_byte * 7 / 6, rel=1 / 40)
    assert summary["eval_bits_per_char"] != pytest.approx(per_byte, rel=1 / 20)


def test_bits_per_char_of_an_hf_tokenizer_run_counts_characters_not_tokens(tmp_path, capsys):
    """Item 4 on ``hf-lm-lora``: a repeated line of C characters in T tokens gives bits per
    character = bits per token * T / C."""
    from tokenizers import Tokenizer

    line = "the quick brown fox jumps over the lazy zoo\n"
    (tmp_path / "t.txt").write_text(line * 60)
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    argv = [
        "train",
        "hf-lm-lora",
        "--init-from",
        str(tmp_path / "imp"),
        "--dataset",
        f"text:{tmp_path / 't.txt'}",
    ]
    assert main([*argv, "--out", str(tmp_path / "r"), *TINY]) == 0
    summary = _summary(capsys)
    reference = Tokenizer.from_file(str(FIXTURES / "llama3-tied" / "tokenizer.json"))
    tokens = len(reference.encode(line * 60, add_special_tokens=False).ids) / 60
    per_token = summary["eval_loss"] / math.log(2)
    assert tokens < len(line) / 1.5  # BPE: the two figures differ
    assert summary["eval_bits_per_char"] == pytest.approx(per_token * tokens / len(line), rel=0.05)
