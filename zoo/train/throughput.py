"""Tokens per second and MFU: the FLOPs one training step is counted as, and the chip's peak.

Every MFU figure zoo and its benchmarks print divides :func:`step_flops` by the step's time and
by :func:`peak_flops`, so two figures of one step agree however they were made. It sits in
``train/`` (below ``bench/`` and the CLI) so that a run's progress and summary can report MFU
as the benchmarks do.

The count is the model's, not the program's: what the step would cost with no recomputation
(remat replays are not counted), no padding (``vocab_multiple``'s rows and splash's padded
length are not counted) and the causal half of the attention scores counted all the same, as
in the PaLM paper's MFU and nanoGPT's ``estimate_mfu``. The peak is the device's dense matmul
rate: on a TPU what ``jax.experimental.pallas.tpu.get_tpu_info()`` says where this JAX has it
(JAX 0.10.2 on a TPU v5e: ``bf16_ops_per_second`` 197e12, ``mem_bw_bytes_per_second``
820e9), else a row of :data:`CHIPS` matched on ``device_kind``; a CPU has none (MFU None).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import jax

from zoo.models import canonical


def _counted_config(cfg):
    """``cfg`` without what the count leaves out: LoRA's adapters and the table's padding rows."""
    drop = {k: v for k, v in (("lora", None), ("vocab_multiple", 1)) if hasattr(cfg, k)}
    return dataclasses.replace(cfg, **drop) if drop else cfg


def matrix_weights(cfg) -> int:
    """The weights one token's forward pass multiplies as matrices: each dense kernel (the
    ``w`` leaves of two axes, a layer's per layer), and the head once, whether it is a leaf of
    its own or the token table (a tied head). A token table that is not the head is a lookup,
    not a matmul, and positional tables, biases and norm scales do no matmul; none counts.
    LoRA's adapters and ``vocab_multiple``'s padding rows are left out.

    Raises ValueError for a kind with a weight of more than two axes (a conv kernel, whose
    FLOPs depend on its output positions, not on tokens)."""
    return _matrix_weights(_counted_config(cfg))


@functools.lru_cache(maxsize=64)
def _matrix_weights(counted) -> int:
    shapes = jax.eval_shape(lambda: canonical.init_params(counted, 0))
    total, tied_table, has_head = 0, 0, False
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        parts = tuple(jax.tree_util.keystr(path, simple=True, separator=".").split("."))
        has_head = has_head or parts[0] == "head"
        if counted.is_table(parts):
            tied_table = leaf.size if parts == ("embed", "w") else tied_table
            continue
        axes = [a for a in counted.logical_axes(parts, leaf.ndim) if a != "layers"]
        if parts[-1] == "w" and len(axes) > 2:
            where = f"{type(counted).__name__} {'.'.join(parts)}"
            raise ValueError(f"{where} has {len(axes)} axes: FLOPs per token count dense layers only")
        total += leaf.size if parts[-1] == "w" and len(axes) == 2 else 0
    return total + (tied_table if counted.task == "lm" and not has_head else 0)


def step_flops(cfg, batch: int, seq: int = 1) -> float:
    """FLOPs of one training step (forward and backward) on ``batch`` rows of ``seq`` tokens:

        6 * N * batch * seq  +  12 * L * batch * seq**2 * width

    N is :func:`matrix_weights` (2 FLOPs per weight per token forward, 4 backward); the second
    term is the attention scores ``q k^T`` and their use ``p v`` (2 * 2 * seq**2 * width per
    layer and row forward, three times that with the backward), with ``width`` the query
    heads times the head width and L the layers; kinds without attention have none. The
    causal half is not subtracted: dense attention computes it."""
    flops = 6.0 * matrix_weights(cfg) * batch * seq
    if getattr(cfg, "attention", None) is not None:
        width = cfg.num_heads * cfg.d_head
        flops += 12.0 * cfg.num_layers * batch * seq * seq * width
    return flops


@dataclass(frozen=True)
class Chip:
    """What one device can do: its dense matmul peak (FLOP/s) in bf16 and in float32, its HBM
    bandwidth (bytes/s) and capacity (bytes, None where not known), and where that came from
    (``"get_tpu_info"`` or ``"table"``)."""

    kind: str
    bfloat16: float
    float32: float
    bandwidth: float
    hbm_bytes: int | None
    source: str

    def peak(self, dtype: str = "bfloat16") -> float:
        return {"bfloat16": self.bfloat16, "float32": self.float32}[str(dtype)]


# Per device (``device_kind`` substring): dense bf16 FLOP/s, float32 FLOP/s, HBM bytes/s, from
# vendor datasheets without sparsity; leads where get_tpu_info is missing, not measurements.
# float32 matmuls run as TF32 on NVIDIA GPUs and as bf16 passes on a TPU under JAX's default
# precision, so the float32 rate is the one that applies there.
CHIPS = {
    "H200": (989e12, 494e12, 4.8e12),
    "H100": (989e12, 494e12, 3.35e12),
    "A100": (312e12, 156e12, 2.0e12),
    "L4": (121e12, 60e12, 300e9),
    "TPU v4": (275e12, 275e12, 1.2e12),
    "TPU v5 lite": (197e12, 197e12, 820e9),
    "TPU v5p": (459e12, 459e12, 2.76e12),
    "TPU v6 lite": (918e12, 918e12, 1.64e12),
}


def _tpu_info():
    """JAX's own description of this TPU (``get_tpu_info``; per TensorCore), or None where
    this JAX has no such function or does not know the chip."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.get_tpu_info()
    except (ImportError, AttributeError, ValueError, NotImplementedError):
        return None


def chip(device=None) -> Chip | None:
    """:class:`Chip` of ``device`` (default ``jax.devices()[0]``): on a TPU from
    ``get_tpu_info()`` (its per-TensorCore figures times the device's cores), else the
    :data:`CHIPS` row whose name ``device_kind`` contains; None for a device neither knows
    (a CPU)."""
    device = device or jax.devices()[0]
    info = _tpu_info() if device.platform == "tpu" else None
    if info is not None:
        cores = max(1, int(info.num_cores))
        ops = float(info.bf16_ops_per_second) * cores
        bandwidth = float(info.mem_bw_bytes_per_second) * cores
        return Chip(
            device.device_kind, ops, ops, bandwidth, int(info.hbm_capacity_bytes) * cores, "get_tpu_info"
        )
    for name, (bf16, f32, bandwidth) in CHIPS.items():
        if name.lower() in device.device_kind.lower():
            return Chip(device.device_kind, bf16, f32, bandwidth, None, "table")
    return None


def peak_flops(dtype: str = "bfloat16", device=None) -> float | None:
    """The device's dense matmul peak in FLOP/s for compute in ``dtype`` (None: not known)."""
    found = chip(device)
    return None if found is None else found.peak(dtype)


def mfu(flops: float, seconds: float, dtype: str = "bfloat16", device=None) -> float | None:
    """Model FLOPs utilisation: ``flops`` (:func:`step_flops`) done in ``seconds``, over the
    device's peak (None where the peak is not known)."""
    peak = peak_flops(dtype, device)
    return None if peak is None or seconds <= 0 else flops / seconds / peak
