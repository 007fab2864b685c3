"""``eval_bits_per_char`` counts characters, whatever the vocabulary: not UTF-8 bytes (a
``bytes`` run) and not tokens (an HF tokenizer's) (issue 41, item 4)."""

from __future__ import annotations

import json
import math

import pytest

from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import TINY
from zoo.cli import main


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
