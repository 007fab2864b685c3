"""``zoo export --format hf``, issue 41's cases ("item N" is the issue's): the adapters that
export and the config naming their base, ``--adapter`` without ``--format hf``, the import's
tokenizer carried, what a GPT-2 cannot hold, and an --out that cannot be written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.clikit import refused
from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import LM, TINY
from zoo.cli import main

pytestmark = pytest.mark.xdist_group("hf")


def test_gpt2_adapters_on_the_fused_qkv_point_to_those_that_export(gpt2_lora, capsys, tmp_path):
    """Item 10: the list of adapter targets that export was empty for GPT-2 (Conv1D modules
    were skipped); the MLP's and attn.o's export now (tests/e2e/test_hf_live.py runs peft on them)."""
    capsys.readouterr()
    argv = ["export", str(gpt2_lora / "lora"), "--format", "hf", "--adapter", "--out", str(tmp_path / "a")]
    line = refused(capsys, argv, "blocks.attn.q has no PEFT module of its own", "without --adapter")
    assert "blocks.attn.o, blocks.mlp.down, blocks.mlp.up" in line


def test_the_adapter_config_names_the_hugging_face_base(gpt2_lora, tmp_path, capsys):
    """Item 11: ``base_model_name_or_path`` named the zoo LoRA run; now the import's source."""
    import json

    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "imp"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"]
    argv += ["--lora", "rank=2,alpha=4,targets=mlp.up", *TINY, "--out", str(tmp_path / "lora")]
    assert main(argv) == 0
    out = tmp_path / "adapter"
    assert main(["export", str(tmp_path / "lora"), "--format", "hf", "--adapter", "--out", str(out)]) == 0
    fields = json.loads((out / "adapter_config.json").read_text())
    assert fields["base_model_name_or_path"] == str((FIXTURES / "gpt2").absolute())
    assert fields["fan_in_fan_out"] is True and fields["target_modules"] == ["c_fc"]


def test_export_adapter_without_format_hf_is_refused(gpt2_lora, capsys, tmp_path):
    """Item 17: ``--adapter`` without ``--format hf`` was ignored (exit 0, a zoo export)."""
    argv = ["export", str(gpt2_lora / "lora"), "--adapter", "--out", str(tmp_path / "e")]
    refused(capsys, argv, "--adapter", "add --format hf")
    assert not (tmp_path / "e").exists()


def test_hf_export_of_an_import_carries_its_tokenizer(capsys, tmp_path):
    """Item 25: the HF export left out the import's tokenizer.json."""
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    assert main(["export", str(tmp_path / "imp"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    exported = (tmp_path / "hf" / "tokenizer.json").read_text()
    assert exported == (FIXTURES / "llama3-tied" / "tokenizer.json").read_text()


def test_gpt2_export_of_a_trained_head_bias_or_a_classifier_is_one_line(tmp_path, capsys):
    """Item 6: ``KeyError: 'blocks.attn.q.b'``. Missing attention biases are written as zeros
    (tests/e2e/test_hf_live.py compares transformers' logits); what GPT-2 cannot hold is named."""
    assert main(["train", "python-docs-lm", "--out", str(tmp_path / "lm"), *LM, *TINY]) == 0
    argv = ["export", str(tmp_path / "lm"), "--format", "hf", "--out", str(tmp_path / "e1")]
    capsys.readouterr()
    refused(capsys, argv, "has a bias (head.b", "model.tie_head=true")
    assert not (tmp_path / "e1").exists()
    assert (
        main(
            ["train", "python-docs-lm", "--out", str(tmp_path / "t"), *LM, "--set=model.tie_head=true", *TINY]
        )
        == 0
    )
    assert main(["export", str(tmp_path / "t"), "--format", "hf", "--out", str(tmp_path / "e2")]) == 0
    fields = json.loads((tmp_path / "e2" / "config.json").read_text())
    assert fields["model_type"] == "gpt2" and fields["tie_word_embeddings"] is True
    digits = ["--steps=1", "--no-progress", "--json", "--set=train.eval_batches=1"]
    assert main(["train", "digits-transformer", "--out", str(tmp_path / "d"), *digits]) == 0
    argv = ["export", str(tmp_path / "d"), "--format", "hf", "--out", str(tmp_path / "e3")]
    capsys.readouterr()
    refused(capsys, argv, "a classifier (num_classes=10)", "no GPT-2 form")


@pytest.mark.parametrize("case", ["a-file", "under-a-file", "proc"])
def test_an_hf_export_out_that_cannot_be_written_is_one_line(tmp_path, capsys, case):
    """Item 7: NotADirectoryError / FileNotFoundError; now as the zoo-format export says it."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out, words = {
        "a-file": (afile, "it is a file"),
        "under-a-file": (afile / "hf", "is a file, not a directory"),
        "proc": (Path("/proc/zoo-x"), "/proc does not take new folders"),
    }[case]
    assert main(["import", str(FIXTURES / "gpt2"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    argv = ["export", str(tmp_path / "imp"), "--format", "hf", "--out", str(out)]
    refused(capsys, argv, "cannot be written", words, "choose another --out")
    assert afile.read_text() == "keep me"
