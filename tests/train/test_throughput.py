"""zoo.train.throughput: the one FLOP count of a training step against counts made by hand from
the presets' published shapes (GPT-2 124M's tied head, Llama 3.2 1B tied and untied), and the
one peak lookup on stubbed devices (a TPU whose JAX has ``get_tpu_info``, one whose JAX lacks
it, a GPU, a CPU)."""

from __future__ import annotations

import types

import pytest

import zoo
from zoo import lora
from zoo.configs import LoraConfig
from zoo.freeze import resolve_freeze
from zoo.models import canonical
from zoo.train import throughput

# GPT-2 small: 12 layers of d 768 (q, k, v, o: 4 d^2; MLP: 2 d x 3072), the 50,257 x 768 token
# table once as the tied head. Positions, biases and norms do no matmul.
GPT2_WEIGHTS = 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 50257 * 768
# Llama 3.2 1B: 16 layers of d 2048, 32 query heads and 8 KV heads of 64 (q, o: 2048 x 2048; k, v:
# 2048 x 512), SwiGLU of 8192 (gate, up, down), the 128,256 x 2048 head.
LLAMA_WEIGHTS = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 128256 * 2048


def test_gpt2_124m_counts_its_tied_head_once():
    cfg = zoo.get_config("gpt2-124m")
    assert GPT2_WEIGHTS == 123_532_032
    assert throughput.matrix_weights(cfg) == GPT2_WEIGHTS
    attention = 12 * 12 * 8 * 1024**2 * 768  # 12 L B T^2 (heads x head width)
    assert throughput.step_flops(cfg, 8, 1024) == 6 * GPT2_WEIGHTS * 8 * 1024 + attention
    # the table's padding rows are no work of the model's
    padded = zoo.get_config("gpt2-124m", vocab_multiple=128)
    assert throughput.step_flops(padded, 8, 1024) == throughput.step_flops(cfg, 8, 1024)


@pytest.mark.parametrize("tied", [True, False], ids=["tied (the preset)", "untied"])
def test_llama_1b_counts_the_head_once_and_the_untied_table_as_a_lookup(tied):
    cfg = zoo.get_config("llama-1b", tie_head=tied)
    assert throughput.matrix_weights(cfg) == LLAMA_WEIGHTS == 1_235_746_816
    attention = 12 * 16 * 2 * 2048**2 * (32 * 64)
    assert throughput.step_flops(cfg, 2, 2048) == 6 * LLAMA_WEIGHTS * 2 * 2048 + attention


# A frozen weight needs no gradient of its own: 4 FLOPs per weight per token where a gradient
# passes through it to something that trains below, 2 (its forward) where none does.
LLAMA_LAYER = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
LLAMA_TABLE = 128256 * 2048


def test_a_frozen_prefix_over_frozen_embeddings_counts_its_forward_and_a_frozen_head_4():
    cfg = zoo.get_config("llama-1b")  # the head is the (frozen) token table
    plan = resolve_freeze(canonical.canonical_shapes(cfg), ["embed", "blocks[0:8]"])
    by_hand = (8 * 2 * LLAMA_LAYER + 8 * 6 * LLAMA_LAYER + 4 * LLAMA_TABLE) * 2 * 2048
    by_hand += 4 * 2 * 2048**2 * 2048 * (8 * 1 + 8 * 3)  # attention: forward only below layer 8
    assert throughput.step_flops(cfg, 2, 2048, plan) == by_hand
    # with the embeddings trained, a gradient passes through every frozen layer: 4, and 12
    plan = resolve_freeze(canonical.canonical_shapes(cfg), ["blocks[0:8]"])
    by_hand = (8 * 4 * LLAMA_LAYER + 8 * 6 * LLAMA_LAYER + 6 * LLAMA_TABLE) * 2 * 2048
    assert throughput.step_flops(cfg, 2, 2048, plan) == by_hand + 12 * 16 * 2 * 2048**2 * 2048


def lora_run(name: str, targets: tuple[str, ...], rank: int = 8):
    """``(config with adapters, freeze plan)`` as a LoRA run builds them (zoo.train.stages)."""
    cfg = zoo.get_config(name)
    setup = lora.resolve(cfg, LoraConfig(rank=rank, alpha=16.0, targets=targets))
    adapted = lora.adapted_config(cfg, setup)
    return adapted, lora.freeze_plan(adapted, setup)


def test_lora_counts_the_frozen_base_at_4_and_its_adapters_at_6():
    cfg, plan = lora_run("gpt2-124m", ("attn.q", "attn.v"))
    adapters = 12 * 2 * (768 * 8 + 8 * 768)  # lora_a [768, 8] and lora_b [8, 768], q and v, 12 layers
    by_hand = (4 * GPT2_WEIGHTS + 6 * adapters) * 8 * 1024 + 12 * 12 * 8 * 1024**2 * 768
    assert throughput.step_flops(cfg, 8, 1024, plan) == by_hand
    # the adapters are no weights of the model's (matrix_weights), but work of the step's
    assert throughput.matrix_weights(cfg) == GPT2_WEIGHTS


def test_lora_in_the_top_layers_leaves_the_layers_below_a_forward_pass():
    cfg, plan = lora_run("gpt2-124m", ("blocks[6:12].attn.q",))
    layer, adapter = 4 * 768 * 768 + 2 * 768 * 3072, 2 * 768 * 8
    # layers 0-5 (their zero, frozen adapter rows included) forward only; 6-11: the base 4, the
    # adapters 6; the tied head 4
    per_token = 6 * 2 * (layer + adapter) + 6 * (4 * layer + 6 * adapter) + 4 * 50257 * 768
    attention = 4 * 8 * 1024**2 * 768 * (6 * 1 + 6 * 3)
    assert throughput.step_flops(cfg, 8, 1024, plan) == per_token * 8 * 1024 + attention


def test_a_frozen_stack_behind_a_trained_input_projection_still_passes_its_gradient():
    cfg = zoo.get_config("mlp-s")  # in_proj [64, 128], one block [128, 128], head [128, 10]
    plan = resolve_freeze(canonical.canonical_shapes(cfg), ["blocks"])
    assert throughput.step_flops(cfg, 32, 1, plan) == (6 * 64 * 128 + 4 * 128 * 128 + 6 * 128 * 10) * 32
    plan = resolve_freeze(canonical.canonical_shapes(cfg), ["in_proj", "blocks"])
    assert throughput.step_flops(cfg, 32, 1, plan) == (2 * 64 * 128 + 2 * 128 * 128 + 6 * 128 * 10) * 32


def test_a_plan_that_freezes_nothing_is_the_plain_count():
    cfg = zoo.get_config("gpt2-124m")
    plan = resolve_freeze(canonical.canonical_shapes(cfg), [])
    assert throughput.step_flops(cfg, 8, 1024, plan) == throughput.step_flops(cfg, 8, 1024)


def test_a_conv_kind_is_refused_in_one_line():
    with pytest.raises(ValueError, match="conv1.w has 4 axes: FLOPs per token count dense layers only"):
        throughput.matrix_weights(zoo.get_config("cnn-mnist"))


def device(kind: str, platform: str = "tpu"):
    return types.SimpleNamespace(device_kind=kind, platform=platform)


def tpu_info(cores: int, ops: float, bandwidth: float, hbm: int):
    """What ``get_tpu_info()`` returned on the TPU v5e with JAX 0.10.2 (per TensorCore)."""
    fields = dict(num_cores=cores, bf16_ops_per_second=ops, mem_bw_bytes_per_second=bandwidth)
    return types.SimpleNamespace(**fields, hbm_capacity_bytes=hbm)


def test_a_tpu_reads_its_peak_from_jaxs_tpu_info(monkeypatch):
    monkeypatch.setattr(throughput, "_tpu_info", lambda: tpu_info(1, 197e12, 820e9, 17_200_000_000))
    v5e = throughput.chip(device("TPU v5 lite"))
    assert (v5e.bfloat16, v5e.bandwidth, v5e.hbm_bytes, v5e.source) == (
        197e12,
        820e9,
        17_200_000_000,
        "get_tpu_info",
    )
    assert throughput.peak_flops("float32", device("TPU v5 lite")) == 197e12
    # a megacore device: two TensorCores, each half the chip
    monkeypatch.setattr(throughput, "_tpu_info", lambda: tpu_info(2, 229.5e12, 1.38e12, 51_500_000_000))
    assert throughput.peak_flops("bfloat16", device("TPU v5")) == 459e12
    assert throughput.mfu(459e12, 2.0, "bfloat16", device("TPU v5")) == 0.5


def test_without_tpu_info_the_table_by_device_kind_answers(monkeypatch):
    monkeypatch.setattr(throughput, "_tpu_info", lambda: None)  # an older JAX, or a chip it does not know
    v5e = throughput.chip(device("TPU v5 lite"))
    assert (v5e.bfloat16, v5e.bandwidth, v5e.source) == (197e12, 820e9, "table")
    h100 = device("NVIDIA H100 80GB HBM3", "gpu")
    assert (throughput.peak_flops("bfloat16", h100), throughput.peak_flops("float32", h100)) == (
        989e12,
        494e12,
    )
    cpu = device("cpu", "cpu")
    assert throughput.chip(cpu) is None and throughput.mfu(1e12, 1.0, "bfloat16", cpu) is None


def test_on_this_cpu_there_is_no_peak_and_tpu_info_is_not_an_error():
    assert throughput.chip() is None  # the suite runs on a CPU: MFU is not reported
    assert throughput._tpu_info() is None  # get_tpu_info raises off a TPU; the lookup says "not known"
