"""The PyTorch half of ``tests/e2e/test_hf_live.py``, run in an interpreter with torch,
transformers and peft (``ZOO_HF_PYTHON``, e.g. the ``/work/hfref`` venv of
``tests/fixtures/hf/make_fixtures.py``). Commands: ``make DIR`` writes fresh random models and
their logits; ``logits SRC IDS OUT [ADAPTER]`` writes from_pretrained's (and peft's) logits."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

MODELS = {
    "gpt2": GPT2Config(vocab_size=96, n_positions=600, n_embd=48, n_layer=3, n_head=6),
    "llama": LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
            "rope_theta": 500000.0,
        },
    ),
}


def make(out: Path) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 96, (2, 512))
    for name, config in MODELS.items():
        model = AutoModelForCausalLM.from_config(config).float().eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
            logits = model(ids).logits
        model.save_pretrained(out / name)
        save_file(
            {"ids": ids.to(torch.int32), "logits": logits.contiguous()}, str(out / f"{name}.ref.safetensors")
        )


def logits(src: str, ids_file: str, out: str, adapter: str | None = None) -> None:
    if src == "auto":  # the adapter's own base_model_name_or_path (AutoPeftModelForCausalLM)
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(adapter).float().eval()
        adapter = None
    else:
        model = AutoModelForCausalLM.from_pretrained(src).float().eval()
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).eval()
    ids = load_file(ids_file)["ids"].long()
    with torch.no_grad():
        save_file({"logits": model(ids).logits.contiguous()}, out)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    make(Path(args[0])) if command == "make" else logits(*args)
