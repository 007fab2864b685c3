"""The residual report: :func:`residual_report` puts :func:`~zoo.residuals.find.find_residuals`
to work on one block, the whole model and (for grouped stacks) one replayed group, and turns
what it finds into rows and totals (see :mod:`zoo.residuals` for what the rows mean)."""

from __future__ import annotations

import math

import jax
import numpy as np

from zoo import names
from zoo.api import apply_fn
from zoo.losses import per_example_loss
from zoo.models import canonical
from zoo.models.registry import ModelConfig, check_backend, get_config
from zoo.precision import Precision, get_precision
from zoo.remat import RematPolicy, get_policy
from zoo.residuals.find import DEVICE, HOST, Found, Origin, find_residuals
from zoo.scan import layer_body, scan_levels, stack_levels


def _row(found: Found, scope: str) -> dict:
    each = math.prod(found.shape) * np.dtype(found.dtype).itemsize
    count = found.count
    return {
        "name": found.origin.name,
        "shape": list(found.shape),
        "dtype": found.dtype,
        "bytes_each": int(each),
        "bytes": int(each * count),
        "memory_kind": found.memory_kind,
        "count": int(count),
        "kind": found.origin.kind,
        "scope": scope,
        "source": found.origin.source,
    }


def _merge(rows: list[dict]) -> list[dict]:
    """Merge rows that describe the same residual (same name, shape, placement, scope)."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (
            row["name"],
            tuple(row["shape"]),
            row["dtype"],
            row["memory_kind"],
            row["kind"],
            row["scope"],
            row["source"],
        )
        if key in merged:
            merged[key]["count"] += row["count"]
            merged[key]["bytes"] += row["bytes"]
        else:
            merged[key] = dict(row)
    return list(merged.values())


# --- models -> pure functions ------------------------------------------------------------------


def _dotted(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value")


def _block_param_paths(cfg: ModelConfig, backend: str, layer) -> list[str]:
    """Canonical names (``attn.q.w``...) of one layer's parameter leaves, in leaf order."""
    leaves = jax.tree_util.tree_flatten_with_path(layer)[0]
    canon = [p[1:] for p in canonical.leaf_paths(cfg, backend) if p[0] == "blocks"]
    if len(canon) == len(leaves):
        return [".".join(p) for p in canon]
    return [_dotted(path) for path, _ in leaves]


class _Stack:
    """The model's stack, abstractly: shapes only, everything traced with ShapeDtypeStructs.
    Params and the block input are in the precision's compute dtype: what the step computes with."""

    def __init__(
        self, cfg: ModelConfig, backend: str, batch: int, seq: int | None, seed: int, precision: Precision
    ):
        self.params = jax.eval_shape(lambda: precision.to_compute(canonical.init_params(cfg, seed)))
        captured = {}

        def blocks_of(p):
            captured["layer_fn"], stacked = canonical.from_canonical(cfg, backend, p).stack()
            return stacked

        self.stacked = jax.eval_shape(blocks_of, self.params)
        self.layer_fn = captured["layer_fn"]  # closes over static structure only, no traced values
        self.layer0 = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), self.stacked
        )
        self.h = jax.ShapeDtypeStruct(cfg.block_input_shape(batch, seq), precision.compute_dtype)
        self.block_paths = _block_param_paths(cfg, backend, self.layer0)

    def block_inputs(self, i: int) -> Origin:
        """The origin of a block function's flattened input ``i``: a parameter, or the block input."""
        if i < len(self.block_paths):
            return Origin(f"param {self.block_paths[i]}", "param")
        return Origin(names.LAYER_INPUT, "activation", "block input", named=True)


def _block_rows(stack: _Stack, pol: RematPolicy) -> list[dict]:
    """One block, in isolation: the scan body differentiated for one layer and its input."""
    body = layer_body(stack.layer_fn, pol)
    found = find_residuals(
        body, stack.layer0, stack.h, input_origin=stack.block_inputs, loop_invariant_kind=True
    )
    return _merge([_row(f, "block") for f in found])


def _model_rows(
    cfg: ModelConfig, backend: str, pol: RematPolicy, stack: _Stack, x, y, precision
) -> list[dict]:
    """The whole model: vjp of the mean loss with respect to every parameter."""
    apply = apply_fn(cfg, backend, precision=precision)

    def loss(p, x, y):
        return per_example_loss(apply(p, x, pol), y).mean()

    param_paths = [_dotted(path) for path, _ in jax.tree_util.tree_flatten_with_path(stack.params)[0]]

    def loss_inputs(i: int) -> Origin:
        if i < len(param_paths):
            return Origin(f"param {param_paths[i]}", "param")
        return Origin("batch input" if i == len(param_paths) else "labels", "input")

    found = find_residuals(loss, stack.params, const_args=(x, y), input_origin=loss_inputs)
    return [_row(f, "stack" if f.stacked else "outside") for f in found]


def _replay_rows(stack: _Stack, levels: tuple[int, ...] | None) -> list[dict]:
    """Grouped stacks (nested, recursive): the backward pass replays one group at a time, and
    while it does it holds the residuals of that group's inner scans: at every level below the
    outermost, the block inputs of one group of that level (under ``full``)."""
    rows = []
    for depth in range(1, len(levels or ())):
        inner = levels[depth:]
        rows_in_group = math.prod(inner)
        group_params = jax.tree_util.tree_map(
            lambda a, n=rows_in_group: jax.ShapeDtypeStruct((n, *a.shape[1:]), a.dtype), stack.stacked
        )
        replay = find_residuals(
            lambda g, c, inner=inner: scan_levels(stack.layer_fn, g, c, inner),
            group_params,
            stack.h,
            input_origin=stack.block_inputs,
        )
        rows += [_row(f, "replay") for f in replay]
    return rows


_SCOPE_ORDER = {"stack": 0, "replay": 1, "outside": 2, "block": 0}
_KIND_ORDER = {"activation": 0, "constant": 1, "input": 2, "param": 3}


def _name_order(name: str) -> int:
    return names.ALL.index(name) if name in names.ALL else len(names.ALL)


def _order(row: dict):
    return (
        _SCOPE_ORDER[row["scope"]],
        _KIND_ORDER[row["kind"]],
        _name_order(row["name"]),
        -row["bytes"],
        row["name"],
    )


def _totals(rows: list[dict]) -> dict:
    """Activation bytes by placement and scope (parameters and inputs are listed, not counted)."""

    def total(mem, scope=None):
        return sum(
            r["bytes"]
            for r in rows
            if r["kind"] == "activation"
            and r["memory_kind"] == mem
            and (scope is None or r["scope"] == scope)
        )

    return {
        "total_device_bytes": total(DEVICE),
        "total_host_bytes": total(HOST),
        "stack_device_bytes": total(DEVICE, "stack"),
        "stack_host_bytes": total(HOST, "stack"),
        "replay_device_bytes": total(DEVICE, "replay"),
        "outside_device_bytes": total(DEVICE, "outside"),
        "param_bytes_listed": sum(r["bytes"] for r in rows if r["kind"] == "param"),
    }


# --- the report --------------------------------------------------------------------------------


def residual_report(
    model_name_or_cfg,
    policy,
    *,
    backend: str = "nnx",
    batch: int = 8,
    seq: int | None = None,
    seed: int = 0,
    precision: Precision | str | None = None,
    **overrides,
) -> dict:
    """What ``policy`` keeps for the backward pass of ``model`` at this batch shape.

    ``overrides`` are config fields (``num_layers=16``...); ``precision`` the policy of
    :mod:`zoo.precision` the step runs under (default float32). Returns a JSON-ready dict; see the
    :mod:`zoo.residuals` docstring for the meaning of ``per_block``, the row ``scope`` and ``kind``.
    """
    cfg = get_config(model_name_or_cfg, **overrides)
    backend = check_backend(backend)
    pol = get_policy(policy)
    seq = cfg.seq_or_default(seq)  # None for a model without positions
    # Only shapes matter: everything below is traced with ShapeDtypeStructs, nothing runs.
    precision = get_precision(precision)
    stack = _Stack(cfg, backend, batch, seq, seed, precision)
    per_block = sorted(_block_rows(stack, pol), key=_order)
    x, y = batch_shapes(cfg, batch, seq)
    levels = stack_levels(pol, cfg.num_layers)
    rows = _model_rows(cfg, backend, pol, stack, x, y, precision) + _replay_rows(stack, levels)
    rows = sorted(_merge(rows), key=_order)
    return {
        "model": model_name_or_cfg if isinstance(model_name_or_cfg, str) else cfg.kind,
        "backend": backend,
        "policy": pol.name,
        "precision": precision.name,
        "batch": batch,
        "seq": seq,
        "num_layers": cfg.num_layers,
        "groups": levels[0] if pol.nested else None,
        "levels": list(levels) if levels else None,
        "per_block": per_block,
        "residuals": rows,
        **_totals(rows),
    }


def batch_shapes(cfg: ModelConfig, batch: int, seq: int | None):
    """Abstract (input, labels) of a batch, matching :func:`zoo.example_batch`."""
    return cfg.input_spec(batch, seq), cfg.labels_spec(batch, seq)
