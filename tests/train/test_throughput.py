"""zoo.train.throughput: the one FLOP count of a training step against counts made by hand from
the presets' published shapes (GPT-2 124M's tied head, Llama 3.2 1B tied and untied), and the
one peak lookup on stubbed devices (a TPU whose JAX has ``get_tpu_info``, one whose JAX lacks
it, a GPU, a CPU)."""

from __future__ import annotations

import types

import pytest

import zoo
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
