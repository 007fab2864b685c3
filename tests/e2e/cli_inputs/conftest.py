"""The LoRA run over an imported GPT-2 that this folder's Hugging Face cases share."""

from __future__ import annotations

import pytest

from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import TINY
from zoo.cli import main


# Session scope: built once on the worker of the "hf" group, where the export and the
# fine-tuning cases that read it run.
@pytest.fixture(scope="session")
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
