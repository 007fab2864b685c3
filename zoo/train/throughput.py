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
import math
from dataclasses import dataclass

import jax

from zoo.freeze import parse_pattern
from zoo.models import canonical
from zoo.models.registry import STACK


def _counted_config(cfg, adapters: bool = False):
    """``cfg`` without what the count leaves out: the table's padding rows, and LoRA's
    adapters unless ``adapters`` (a count that knows what trains counts them)."""
    drop = {k: v for k, v in (("lora", None), ("vocab_multiple", 1)) if hasattr(cfg, k)}
    drop = {k: v for k, v in drop.items() if not (adapters and k == "lora")}
    return dataclasses.replace(cfg, **drop) if drop else cfg


@dataclass(frozen=True)
class _Matrix:
    """One matmul of a token's forward pass: the leaf whose weights it multiplies (``path``),
    how many a layer (``weights``), whether it repeats per layer of the stack (``stacked``),
    and, for one that does not, whether it sits in front of the stack (``inputs``: an input
    projection) rather than after it (the head, a tied head included)."""

    path: str
    weights: int
    stacked: bool
    inputs: bool


def matrix_weights(cfg) -> int:
    """The weights one token's forward pass multiplies as matrices: each dense kernel (the
    ``w`` leaves of two axes, a layer's per layer), and the head once, whether it is a leaf of
    its own or the token table (a tied head). A token table that is not the head is a lookup,
    not a matmul, and positional tables, biases and norm scales do no matmul; none counts.
    LoRA's adapters and ``vocab_multiple``'s padding rows are left out.

    Raises ValueError for a kind with a weight of more than two axes (a conv kernel, whose
    FLOPs depend on its output positions, not on tokens)."""
    counted = _counted_config(cfg)
    layers = getattr(counted, "num_layers", 0)
    return sum(m.weights * (layers if m.stacked else 1) for m in _matrices(counted))


@functools.lru_cache(maxsize=64)
def _matrices(counted) -> tuple[_Matrix, ...]:
    shapes = jax.eval_shape(lambda: canonical.init_params(counted, 0))
    inputs = _input_leaves(counted)
    found, tied_table, has_head = [], 0, False
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
        if parts[-1] == "w" and len(axes) == 2:
            stacked = parts[0] == STACK
            size = leaf.size // (leaf.shape[0] if stacked else 1)
            found.append(_Matrix(".".join(parts), size, stacked, ".".join(parts) in inputs))
    if counted.task == "lm" and not has_head and tied_table:  # the token table is the head
        found.append(_Matrix("embed.w", tied_table, False, False))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _input_leaves(cfg) -> frozenset[str]:
    """The leaves in front of the stack: those its kind names as its input layers (the
    patterns of ``cfg.frozen_prefix()`` other than the stack's own: embeddings, an input
    projection)."""
    patterns = [parse_pattern(text) for text in cfg.frozen_prefix()]
    paths = canonical.canonical_shapes(cfg)
    return frozenset(
        p for p in paths if not p.startswith(STACK + ".") and any(q.selects(p) for q in patterns)
    )


def step_flops(cfg, batch: int, seq: int = 1, freeze=None) -> float:
    """FLOPs of one training step (forward and backward) on ``batch`` rows of ``seq`` tokens.
    With everything trained (``freeze`` None):

        6 * N * batch * seq  +  12 * L * batch * seq**2 * width

    N is :func:`matrix_weights` (2 FLOPs per weight per token forward, 4 backward); the second
    term is the attention scores ``q k^T`` and their use ``p v`` (2 * 2 * seq**2 * width per
    layer and row forward, three times that with the backward), with ``width`` the query
    heads times the head width and L the layers; kinds without attention have none. The
    causal half is not subtracted: dense attention computes it.

    With ``freeze`` (the run's :class:`zoo.freeze.FreezePlan`, LoRA's adapters included when
    ``cfg`` has them) the backward counts what the gradient needs. The 4 backward FLOPs per
    weight are 2 for the weight's gradient and 2 for its input's. A frozen weight needs no
    gradient of its own: it counts 4 per token (2 where no gradient passes through it
    either: nothing that trains lies at its layer or below, as in a frozen prefix over
    frozen embeddings, which autodiff never differentiates). A trained weight counts 6, and
    so does each adapter (``lora_a``, ``lora_b``) in the layers it trains in. A layer's
    attention counts its forward 4 only, or all 12 where a gradient passes through it.
    "Below" is by layer: the input layers (:func:`_input_leaves`), then each layer of the
    stack, then the rest (final norm, head). Within the lowest layer that trains every
    frozen weight counts 4, an upper bound (a LoRA adapter on ``attn.q`` in layer 0 makes
    layer 0's ``attn.k`` count 4 where its input needs no gradient): at most one layer's
    difference. A trained weight counts 6 even where its input is data (an MLP's first
    layer): the convention every MFU figure follows."""
    counted = _counted_config(cfg, adapters=freeze is not None)
    layers = getattr(counted, "num_layers", 0)
    trains, lowest = _training(counted, freeze, layers)
    per_token = 0.0
    for m in _matrices(counted):
        for level in range(layers) if m.stacked else [-1 if m.inputs else layers]:
            per_token += m.weights * (6 if trains(m.path, level) else 4 if lowest <= level else 2)
    flops = per_token * batch * seq
    if getattr(cfg, "attention", None) is not None:
        forward = 4.0 * batch * seq * seq * cfg.num_heads * cfg.d_head
        flops += sum(forward * (3 if lowest <= level else 1) for level in range(cfg.num_layers))
    return flops


def _training(counted, freeze, layers: int):
    """``(trains(path, level), lowest level that trains)``: whether the weights of ``path``
    train at ``level`` (a layer of the stack, -1 in front of it, ``layers`` after it), and
    the lowest level of any leaf that trains (tables, norms and biases included; inf: none)."""
    if freeze is None:
        return (lambda path, level: True), -1
    missing = {m.path for m in _matrices(counted)} - set(freeze.shapes)
    if missing:
        raise ValueError(f"the freeze plan has no {sorted(missing)}: it is not this config's")
    inputs = _input_leaves(counted)

    def trains(path: str, level: int) -> bool:
        status = freeze.trainable(path)
        return status.whole if status.layers is None else level in status.layers

    lowest = math.inf
    for path in freeze.shapes:
        status = freeze.trainable(path)
        if status.none:
            continue
        level = min(status.layers) if status.layers is not None else -1 if path in inputs else layers
        lowest = min(lowest, level)
    return trains, lowest


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
