"""Live comparison with ``transformers`` and ``peft`` themselves, on freshly drawn random
models: import (both backends), ``from_pretrained`` of zoo's export, ``peft`` loading zoo's
adapter export. Runs when an interpreter with torch, transformers and peft is at hand: this
one, or the one ``ZOO_HF_PYTHON`` names (the ``/work/hfref``-style venv of
``tests/fixtures/hf/make_fixtures.py``); skipped with its reason otherwise (CI installs none).
``ZOO_HF_LIVE_LOG=FILE`` appends the figures (max |dlogits| / max |logits|, KL) as JSON lines."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from scipy.special import log_softmax

import zoo
from tests.numerics import assert_close
from tests.tiny import HF_FIXTURES, TINY_LM
from zoo.lora.adapter import LoraSpec
from zoo.models import hf_io
from zoo.models.canonical import init_adapters
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.train.hf import save_adapter

SIDE = Path(__file__).parent / "live" / "hf_torch_side.py"


def _python() -> tuple[str | None, str]:
    for python in filter(None, [os.environ.get("ZOO_HF_PYTHON"), sys.executable]):
        probe = subprocess.run(
            [python, "-c", "import torch, transformers, peft"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            return python, ""
    return None, "torch, transformers and peft do not import here (set ZOO_HF_PYTHON to a venv that has them)"


PYTHON, REASON = _python()
pytestmark = [pytest.mark.skipif(PYTHON is None, reason=REASON), pytest.mark.xdist_group("hf-live")]


def _torch(*args) -> None:
    subprocess.run([PYTHON, str(SIDE), *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("live")
    _torch("make", out)
    return out


def _figures(what: str, logits, ref) -> dict:
    logits, ref = np.asarray(logits, np.float64), np.asarray(ref, np.float64)
    logp, logq = log_softmax(logits, -1), log_softmax(ref, -1)  # float64
    kl = float(np.mean(np.sum(np.exp(logq) * (logq - logp), -1)))
    row = {"what": what, "rel": float(np.abs(logits - ref).max() / np.abs(ref).max()), "kl": kl}
    if os.environ.get("ZOO_HF_LIVE_LOG"):
        with open(os.environ["ZOO_HF_LIVE_LOG"], "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_fresh_models_and_exports_match_transformers(models, name, tmp_path):
    cfg, params = hf_io.load(models / name)
    ref = load_file(str(models / f"{name}.ref.safetensors"))
    ids = jnp.asarray(ref["ids"])
    n = max(ids.shape[1], cfg.d_ff)
    for backend in zoo.BACKENDS:
        logits = jax.jit(zoo.apply_fn(cfg, backend))(params, ids)
        _figures(f"{name} {backend} T={ids.shape[1]}", logits, ref["logits"])
        assert_close(np.asarray(logits), ref["logits"], n=n, what=f"{name} {backend}")
    hf_io.save(cfg, params, tmp_path / "export")
    _torch("logits", tmp_path / "export", models / f"{name}.ref.safetensors", tmp_path / "out.safetensors")
    again = load_file(str(tmp_path / "out.safetensors"))["logits"]
    _figures(f"{name} from_pretrained(export)", again, ref["logits"])
    assert_close(again, ref["logits"], n=n, what="from_pretrained of the export")


@pytest.mark.numerics
def test_peft_loads_the_adapter_export(models, tmp_path):
    cfg, params = hf_io.load(models / "llama")
    cfg = dataclasses.replace(
        cfg, lora=LoraSpec(4, 16.0, ("blocks.attn.q", "blocks.attn.v", "blocks.mlp.up"))
    )
    adapters = flat_by_path(init_adapters(cfg, 1))
    key = jax.random.key(2)
    adapters = {
        p: x + 0.1 * jax.random.normal(jax.random.fold_in(key, i), x.shape)
        for i, (p, x) in enumerate(adapters.items())
    }
    full = nest_by_path({**flat_by_path(params), **adapters})
    save_adapter(cfg, full, tmp_path / "adapter", base=str(models / "llama"))
    ref = load_file(str(models / "llama.ref.safetensors"))
    ours = jax.jit(zoo.apply_fn(cfg, "nnx"))(full, jnp.asarray(ref["ids"]))
    _torch(
        "logits",
        models / "llama",
        models / "llama.ref.safetensors",
        tmp_path / "out.safetensors",
        tmp_path / "adapter",
    )
    theirs = load_file(str(tmp_path / "out.safetensors"))["logits"]
    _figures("llama LoRA: peft(adapter export) vs zoo", ours, theirs)
    assert_close(np.asarray(ours), theirs, n=max(ref["ids"].shape[1], cfg.d_ff), what="peft vs zoo")


@pytest.mark.numerics
@pytest.mark.parametrize("head", ["tied", "untied-zero-bias"])
def test_a_transformer_trained_in_zoo_exports_as_gpt2(tmp_path, head):
    """Issue 41 item 6: ``python-docs-lm`` (no attention biases; written as zeros) after one
    step, tied (``model.tie_head=true``) or untied with a zero head bias (``lm_head.weight``):
    ``from_pretrained`` of ``zoo export --format hf`` gives zoo's logits."""
    from safetensors.numpy import save_file

    from zoo.cli import main

    tied = ["--set=model.tie_head=true"] if head == "tied" else []
    assert main(["train", "python-docs-lm", "--out", str(tmp_path / "run"), *TINY_LM, *tied]) == 0
    ck = zoo.load_checkpoint(tmp_path / "run")
    cfg, flat = ck.model_config, flat_by_path(ck.params)
    if head != "tied":
        flat["head.b"] = np.zeros_like(np.asarray(flat["head.b"]))
    hf_io.save(cfg, nest_by_path(flat), tmp_path / "export")
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    _torch("logits", tmp_path / "export", tmp_path / "ids.safetensors", tmp_path / "out.safetensors")
    theirs = load_file(str(tmp_path / "out.safetensors"))["logits"]
    ours = jax.jit(zoo.apply_fn(cfg, "nnx"))(nest_by_path(flat), jnp.asarray(ids))
    _figures(f"python-docs-lm {head}: from_pretrained(export) vs zoo", ours, theirs)
    assert_close(np.asarray(ours), theirs, n=max(16, cfg.d_ff), what=f"GPT-2 export, {head} head")


@pytest.mark.numerics
def test_gpt2_adapters_export_for_peft_and_name_their_base(tmp_path):
    """Issue 41 items 10 and 11: GPT-2's Conv1D adapters (attn.o, mlp.up, mlp.down) export with
    ``fan_in_fan_out``, and ``AutoPeftModelForCausalLM`` finds the base from
    ``base_model_name_or_path``, which names the Hugging Face checkpoint."""
    from safetensors.numpy import save_file

    from zoo.cli import main

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    fixtures = HF_FIXTURES
    assert main(["import", str(fixtures / "gpt2"), "--out", str(tmp_path / "imp")]) == 0
    tiny = ["--set=data.seq_len=16", "--set=train.batch_size=4", "--set=train.eval_batches=1"]
    tiny += ["--steps=3", "--no-progress", "--json", "--set=optim.warmup_steps=0", "--set=optim.lr=0.05"]
    lora = ["--lora", "rank=2,alpha=4,targets=attn.o|mlp.up|mlp.down"]
    argv = ["train", "hf-lm-lora", "--init-from", str(tmp_path / "imp"), "--dataset", f"text:{text}"]
    vocab = f"--set=data.vocabulary=hf:{fixtures / 'llama3-tied'}"
    assert main([*argv, vocab, *lora, *tiny, "--out", str(tmp_path / "lora")]) == 0
    argv = ["export", str(tmp_path / "lora"), "--format", "hf", "--adapter", "--out", str(tmp_path / "ad")]
    assert main(argv) == 0
    fields = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert fields["fan_in_fan_out"] and fields["base_model_name_or_path"] == str(
        (fixtures / "gpt2").absolute()
    )
    ck = zoo.load_checkpoint(tmp_path / "lora")
    ids = np.random.default_rng(0).integers(0, 64, (2, 16)).astype(np.int32)
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    _torch("logits", "auto", tmp_path / "ids.safetensors", tmp_path / "out.safetensors", tmp_path / "ad")
    theirs = load_file(str(tmp_path / "out.safetensors"))["logits"]
    ours = jax.jit(zoo.apply_fn(ck.model_config, "nnx"))(ck.params, jnp.asarray(ids))
    _figures("GPT-2 LoRA: AutoPeftModelForCausalLM(adapter export) vs zoo", ours, theirs)
    assert_close(np.asarray(ours), theirs, n=max(16, ck.model_config.d_ff), what="peft GPT-2 vs zoo")
