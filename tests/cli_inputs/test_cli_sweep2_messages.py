"""Issue 41, items 10-25: messages that misled or said nothing, now one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from clikit import refused

from zoo.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"

pytestmark = pytest.mark.xdist_group("hf")


def test_import_out_empty_is_refused_not_the_current_directory(tmp_path, capsys, monkeypatch):
    """Item 18: ``--out ""`` wrote ``checkpoints/`` into the current directory."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["import", str(FIXTURES / "gpt2"), "--out", ""], "--out is empty")
    assert list(tmp_path.iterdir()) == []


TINY = [
    "--set=data.seq_len=16",
    "--set=train.batch_size=4",
    "--set=train.eval_batches=1",
    "--set=optim.warmup_steps=0",
    "--steps=1",
    "--no-progress",
    "--json",
]


@pytest.fixture(scope="module")
def gpt2_lora(tmp_path_factory):
    """An import of the GPT-2 fixture and a LoRA run over it (``hf-lm-lora``'s targets: q, v,
    the MLP), the text tokenized with the Llama fixture's tokenizer.json."""
    root = tmp_path_factory.mktemp("gpt2-lora")
    (root / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    assert main(["import", str(FIXTURES / "gpt2"), "--out", str(root / "imp")]) == 0
    argv = ["train", "hf-lm-lora", "--init-from", str(root / "imp"), "--dataset", f"text:{root / 't.txt'}"]
    vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
    assert main([*argv, vocab, *TINY, "--out", str(root / "lora")]) == 0
    return root


def test_gpt2_adapters_on_the_fused_qkv_point_to_those_that_export(gpt2_lora, capsys, tmp_path):
    """Item 10: the list of adapter targets that export was empty for GPT-2 (Conv1D modules
    were skipped); the MLP's and attn.o's export now (tests/test_hf_live.py runs peft on them)."""
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
