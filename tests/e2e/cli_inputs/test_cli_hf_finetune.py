"""Training from a Hugging Face import, issue 41's cases ("item N" is the issue's): LoRA on a
half-precision import, a float16 one refused, a tokenizer against the import's rows, --init-from
of a LoRA run of another model, and the commands that read an import (params, eval, sample,
--resume) without showing its placeholder recipe."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.e2e.clikit import refused
from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import TINY
from zoo.cli import main

pytestmark = pytest.mark.xdist_group("hf")


@pytest.mark.parametrize(
    ("dtype", "recipe", "backend"),
    [
        ("bfloat16", "hf-lm-lora", "nnx"),
        ("bfloat16", "hf-lm-dp-lora", "nnx"),
        ("bfloat16", "hf-lm-lora", "eqx"),
    ],
)
def test_lora_on_a_half_precision_import_trains(tmp_path, capsys, dtype, recipe, backend):
    """Item 5: float32 adapters on a bf16/fp16 base kept the block's output float32, and the
    scan refused its carry."""
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    imp = tmp_path / "imp"
    assert main(["import", str(FIXTURES / "llama-bf16"), "--out", str(imp), "--dtype", dtype]) == 0
    argv = ["train", recipe, "--init-from", str(imp), "--dataset", f"text:{tmp_path / 't.txt'}"]
    vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
    capsys.readouterr()
    assert main([*argv, vocab, "--backend", backend, "--out", str(tmp_path / "r"), *TINY]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert np.isfinite(summary["eval_loss"]) and np.isfinite(summary.get("train_loss", 0.0))
    assert ("train_loss" in summary) != ("epsilon" in summary)  # DP releases no batch loss


def test_training_a_float16_import_is_one_line(tmp_path, capsys):
    """Item 5, float16: the scan now runs, but with no loss scaling the first gradients are NaN
    (grad_norm nan, measured), so training from a float16 checkpoint is refused."""
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    imp = tmp_path / "imp"
    assert main(["import", str(FIXTURES / "llama-bf16"), "--out", str(imp), "--dtype", "float16"]) == 0
    capsys.readouterr()
    argv = ["train", "hf-lm-lora", "--init-from", str(imp), "--dataset", f"text:{tmp_path / 't.txt'}"]
    vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
    refused(
        capsys, [*argv, vocab, "--out", str(tmp_path / "r"), *TINY], "float16 weights", "--dtype bfloat16"
    )


def test_a_tokenizer_larger_than_the_import_and_bytes_on_a_bpe_import(gpt2_lora, capsys, tmp_path):
    """Item 16: "model.vocab_size=64 was set explicitly" (the user set nothing), and bytes on an
    import called its BPE "a character vocabulary"."""
    import json

    doc = json.loads((FIXTURES / "llama3-tied" / "tokenizer.json").read_text())
    doc["model"]["vocab"].update({f"zz{i}": 64 + i for i in range(36)})
    (tmp_path / "big.json").write_text(json.dumps(doc))
    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "imp"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", *TINY, "--out", str(tmp_path / "r")]
    capsys.readouterr()
    line = refused(capsys, [*argv, f"--set=data.vocabulary=hf:{tmp_path / 'big.json'}"], "has 64 rows")
    assert "set explicitly" not in line
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    argv[3] = str(tmp_path / "imp")
    line = refused(
        capsys, [*argv, "--set=data.vocabulary=bytes"], "has a tokenizer (tokenizer.json) of its own"
    )
    assert "character vocabulary" not in line


def test_init_from_a_lora_run_of_another_model_points_to_export_merge(gpt2_lora, capsys, tmp_path):
    """Item 14: the same adapters over another model printed 1.9 KB of shape mismatches."""
    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "lora"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", *TINY, "--out", str(tmp_path / "r")]
    capsys.readouterr()
    line = refused(capsys, argv, "has adapters of its own", "zoo export RUN --merge --out DIR")
    assert len(line) < 400 and "shape" not in line


def test_an_imports_placeholder_data_does_not_leak(gpt2_lora, capsys, tmp_path):
    """Item 12: ``zoo params`` and ``zoo eval`` of an import, and ``--resume`` on one, said
    "'digits' supports only task='classify'" or listed the placeholder recipe's differences."""
    import json

    imp = gpt2_lora / "imp"
    capsys.readouterr()
    assert main(["params", str(imp), "--json"]) == 0
    table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert table["trainable"] == sum(row["count"] for row in table["rows"]) > 0
    assert main(["params", str(imp), "--freeze", "embed"]) == 0
    assert "digits" not in capsys.readouterr().err
    line = refused(capsys, ["eval", str(imp)], "is an import of a Hugging Face checkpoint", "--init-from")
    assert "digits" not in line
    copy = tmp_path / "imp"
    shutil.copytree(imp, copy)
    argv = ["train", "hf-lm-lora", "--resume", "--out", str(copy), "--dataset", f"text:{gpt2_lora / 't.txt'}"]
    line = refused(capsys, argv, "is an import of the Hugging Face checkpoint", "no training state to resume")
    assert "digits" not in line


def test_sample_on_an_import_without_a_tokenizer_says_so(gpt2_lora, capsys):
    """Item 13: it said the import "is not a language model checkpoint"."""
    capsys.readouterr()
    argv = ["sample", str(gpt2_lora / "imp"), "--prompt", "the", "--max-new-tokens", "2"]
    line = refused(capsys, argv, "is a language model without a tokenizer", "tokenizer.json")
    assert "not a language model" not in line
