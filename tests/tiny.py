"""The suite's tiny training runs in one place: the ``zoo train`` flags that make a run compile
and finish in seconds, and the tiny Hugging Face checkpoints that fine-tuning runs start from.

A test that needs a tiny run takes these rather than a copy of its own, so that making every
tiny run cheaper (or adding a flag they all need) is one edit. A test whose assertions read its
own sizes (a schedule of evals and checkpoints, a compile count, a memory peak, a number of
steps) keeps its own values beside the assertion that reads them.
"""

from __future__ import annotations

from pathlib import Path

# Checkpoints of a few KB each (GPT-2, Llama, tied, bf16, ...), written by make_fixtures.py there.
HF_FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def sets(values: dict[str, object]) -> list[str]:
    """``{"dp.epsilon": None, "train.steps": 2}`` -> ``--set`` flags (``none`` unsets a field)."""
    return [f"--set={key}={'none' if value is None else value}" for key, value in values.items()]


# One step of a recipe whose model is given elsewhere (an import, --init-from): windows of 16
# tokens, a batch of 4, one eval batch and no warmup; a JSON summary and no progress bar.
TINY = [
    "--set=data.seq_len=16",
    "--set=train.batch_size=4",
    "--set=train.eval_batches=1",
    "--set=optim.warmup_steps=0",
    "--steps=1",
    "--no-progress",
    "--json",
]
# A language model of one narrow layer, for the recipes that build their own (python-docs-lm).
LM = ["--set=model.num_layers=1", "--set=model.d_model=32", "--set=model.d_ff=64", "--set=model.max_len=16"]
TINY_LM = [*LM, *TINY]

# DP at a given noise multiplier: no search for the noise that meets an epsilon, the quicker
# RDP accountant.
FIXED_NOISE = {"dp.epsilon": None, "dp.noise_multiplier": 2.0, "dp.accountant": "rdp"}
# Two steps of a DP recipe at FIXED_NOISE, its noise seeded, one eval batch.
TINY_DP = [
    "--steps",
    "2",
    "--no-progress",
    "--json",
    *sets({**FIXED_NOISE, "dp.noise_seed": 0, "train.eval_batches": 1}),
]
