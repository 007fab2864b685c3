"""Sharding rules: from each canonical leaf's logical axes (the model registry) to mesh axes.

A rules table maps logical axes to mesh axes, as MaxText's ``logical_axis_rules`` does:
``heads``, ``kv_heads`` and ``mlp`` go on ``tensor`` (Megatron: the column-parallel input
projections and the row-parallel output projections of attention and MLP). ``fsdp`` then
takes the largest remaining dimension it divides. The stacked ``layers`` axis is never
sharded, so the scan slices one layer's shards and XLA gathers them inside the loop body.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec

from zoo.errors import ZooError
from zoo.models.canonical import canonical_shapes
from zoo.models.paths import nest_by_path
from zoo.models.registry import ModelConfig
from zoo.parallel.mesh import FSDP, TENSOR, MeshSpec

# Logical axis -> mesh axis, for the axes that a rule places (everything else: fsdp or none).
TENSOR_RULES = {"heads": TENSOR, "kv_heads": TENSOR, "mlp": TENSOR}
NEVER_SHARDED = ("layers", "lora_rank")
# Config fields whose count a tensor split must divide: a head is never cut in two.
_HEAD_COUNTS = {"heads": "num_heads", "kv_heads": "num_kv_heads"}


def leaf_spec(
    axes: tuple[str | None, ...],
    shape: tuple[int, ...],
    mesh: MeshSpec,
    path: str = "",
    cfg=None,
    table: bool = False,
) -> PartitionSpec:
    """The partition spec of one leaf with logical ``axes`` and ``shape`` on ``mesh``.

    A lookup ``table`` (embeddings) keeps its rows whole where another dimension fits: the
    gradient of a lookup is a scatter into rows, which XLA cannot split by row cheaply."""
    spec: list[str | None] = [None] * len(shape)
    if mesh.tensor > 1:
        for i, axis in enumerate(axes):
            if TENSOR_RULES.get(axis) != TENSOR:
                continue
            units = getattr(cfg, _HEAD_COUNTS[axis], shape[i]) if axis in _HEAD_COUNTS else shape[i]
            if shape[i] % mesh.tensor or units % mesh.tensor:
                what = f"{_HEAD_COUNTS[axis]}={units}" if axis in _HEAD_COUNTS else f"size {shape[i]}"
                raise ZooError(
                    f"mesh tensor={mesh.tensor} does not divide {path}'s {axis!r} axis ({what}); "
                    f"choose tensor among the divisors of {units}: {_divisors(units)}"
                )
            spec[i] = TENSOR
    if mesh.fsdp > 1:
        free = [
            i
            for i, axis in enumerate(axes)
            if spec[i] is None and axis not in NEVER_SHARDED and shape[i] % mesh.fsdp == 0
        ]
        if table and len(free) > 1:
            free = [i for i in free if i != 0]
        if free:
            spec[max(free, key=lambda i: (shape[i], -i))] = FSDP
    return canonical_spec(spec)


def canonical_spec(entries) -> PartitionSpec:
    """A spec without trailing ``None``s: the form XLA hands back, so that the shardings a
    step returns compare equal to those it was given (or jit would compile the step again)."""
    entries = list(entries)
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def param_specs(cfg: ModelConfig, mesh: MeshSpec) -> dict:
    """Nested canonical tree of ``PartitionSpec``, one per leaf of ``cfg``."""
    flat = {}
    for dotted, shape in canonical_shapes(cfg).items():
        path = tuple(dotted.split("."))
        axes = cfg.logical_axes(path, len(shape))
        flat[dotted] = leaf_spec(axes, shape, mesh, dotted, cfg, table=cfg.is_table(path))
    return nest_by_path(flat)
