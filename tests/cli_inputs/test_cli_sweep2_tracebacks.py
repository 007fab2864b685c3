"""Issue 41, items 5-9: commands that ended in a traceback now run, or refuse in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clikit import refused

from zoo.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
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
    assert np.isfinite(summary["eval_loss"]) and np.isfinite(summary["train_loss"])


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
