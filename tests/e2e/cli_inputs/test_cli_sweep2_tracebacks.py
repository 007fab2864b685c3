"""Issue 41, items 5-9: commands that ended in a traceback now run, or refuse in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


LM = ["--set=model.num_layers=1", "--set=model.d_model=32", "--set=model.d_ff=64", "--set=model.max_len=16"]


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


def test_an_idx_file_shorter_than_its_header_is_one_line(tmp_path, capsys):
    """Item 8: ``ValueError: buffer is smaller than requested size``."""
    from zoo.data.idx import FILES

    (tmp_path / "mine").mkdir()
    for name in FILES.values():
        (tmp_path / "mine" / name).write_bytes(bytes([0, 0, 8, 3, 0, 0]))  # 3 dims, 2 bytes of 12
    argv = ["train", "mnist-mlp", "--dataset", f"idx:{tmp_path / 'mine'}", "--out", str(tmp_path / "r")]
    refused(capsys, [*argv, "--steps=1"], "names 3 dimensions (16 bytes)", "only 6 bytes", "cut short")


@pytest.mark.parametrize("missing", ["factor", "original_max_position_embeddings", "vocab_size"])
def test_an_hf_config_missing_a_field_is_one_line(tmp_path, capsys, missing):
    """Item 9: a ``llama3`` rope config without one of its fields (or the config without
    ``vocab_size``) ended in ``KeyError``."""
    import json
    import shutil

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama3-tied", src)
    fields = json.loads((src / "config.json").read_text())
    rope = fields.get("rope_parameters") or fields.get("rope_scaling")
    if missing in rope:
        del rope[missing]
        words = ["rope_scaling of type 'llama3' lacks", missing]
    else:
        del fields[missing]
        words = [f"the field {missing!r} is missing"]
    (src / "config.json").write_text(json.dumps(fields))
    refused(capsys, ["import", str(src), "--out", str(tmp_path / "imp")], "config.json", *words)
