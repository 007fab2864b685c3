"""Residual inspector: what a remat policy makes the backward pass keep, by name and byte.

Residuals are the values the forward pass hands to the backward pass. We find them the way
``jax.vjp`` does: trace ``vjp(f)`` to a jaxpr and read which forward values the pullback
closes over. Each residual is then followed back to where it was made, through
``reduce_precision`` (which ``checkpoint_name`` leaves behind), through ``device_put`` (how an
offloaded residual reaches ``pinned_host``), through ``jit`` calls, and into ``lax.scan``
bodies, so a value stacked over L layers is still reported under its activation name
(:mod:`zoo.names`) with ``count = L``.

Two views are reported:

``per_block``
    One scanned block on its own: the exact function the layer scan runs
    (:func:`zoo.scan.layer_body`), differentiated with respect to one layer's parameters and
    the block input. This is the quickest way to see what a policy does to a block.

``residuals``
    The whole model: ``vjp`` of the mean cross-entropy with respect to all parameters. Rows
    come in three scopes: ``stack`` (saved once per scan step: count L, or the outermost
    level's group inputs for ``nested`` and ``recursive``), ``outside`` (embedding, final
    LayerNorm, head and loss, and values that the scan hoists out of the loop because they do
    not depend on the layer, like the causal mask), and, for grouped stacks only, ``replay``:
    the block inputs that the backward pass rebuilds and holds while it works through one
    group of every inner level (L/G inputs for ``nested``; 2 per level for ``recursive`` at a
    power-of-two depth).

Residuals that are the parameters themselves (or a reshape/transpose of them) have
``kind = "param"``; batch inputs and labels have ``kind = "input"``. Both are listed but left
out of the totals: they live in memory for the whole step whatever the policy, and the scan
keeps the stacked parameters as they are rather than copying them per step. The totals are
the activation memory a policy controls.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from zoo import names
from zoo.losses import per_example_loss
from zoo.models import canonical
from zoo.models.registry import ModelConfig, check_backend, get_config
from zoo.remat import get_policy
from zoo.residuals.find import DEVICE, HOST, _Found, _Origin, find_residuals
from zoo.scan import layer_body, scan_levels, stack_levels


def _row(found: _Found, scope: str) -> dict:
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
    canon = [p[1:] for p in canonical._template(cfg, backend).paths if p[0] == "blocks"]
    if len(canon) == len(leaves):
        return [".".join(p) for p in canon]
    return [_dotted(path) for path, _ in leaves]


# --- the report --------------------------------------------------------------------------------


def residual_report(
    model_name_or_cfg,
    policy,
    *,
    backend: str = "nnx",
    batch: int = 8,
    seq: int | None = None,
    seed: int = 0,
    **overrides,
) -> dict:
    """What ``policy`` keeps for the backward pass of ``model`` at this batch shape.

    ``overrides`` are config fields (``num_layers=16``...). Returns a JSON-ready dict; see the
    module docstring for the meaning of ``per_block``, the row ``scope`` and ``kind``.
    """
    cfg = get_config(model_name_or_cfg, **overrides)
    backend = check_backend(backend)
    pol = get_policy(policy)
    seq = cfg.seq_or_default(seq)  # None for a model without positions
    num_layers = cfg.num_layers
    # Only shapes matter: everything below is traced with ShapeDtypeStructs, nothing runs.
    params = jax.eval_shape(lambda: canonical.init_params(cfg, seed))
    captured = {}

    def blocks_of(p):
        captured["layer_fn"], stacked = canonical.from_canonical(cfg, backend, p).stack()
        return stacked

    stacked = jax.eval_shape(blocks_of, params)
    layer_fn = captured["layer_fn"]  # closes over static structure only, no traced values
    layer0 = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked)
    h = jax.ShapeDtypeStruct(cfg.block_input_shape(batch, seq), jnp.float32)
    block_paths = _block_param_paths(cfg, backend, layer0)

    def block_inputs(i: int) -> _Origin:
        if i < len(block_paths):
            return _Origin(f"param {block_paths[i]}", "param")
        return _Origin(names.LAYER_INPUT, "activation", "block input", named=True)

    # 1. one block, in isolation
    body = layer_body(layer_fn, pol)
    per_block = _merge(
        [
            _row(f, "block")
            for f in find_residuals(body, layer0, h, input_origin=block_inputs, loop_invariant_kind=True)
        ]
    )

    # 2. the whole model: vjp of the loss with respect to every parameter
    x, y = batch_shapes(cfg, batch, seq)
    from zoo.api import apply_fn

    apply = apply_fn(cfg, backend)

    def loss(p, x, y):
        return per_example_loss(apply(p, x, pol), y).mean()

    param_paths = [_dotted(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

    def loss_inputs(i: int) -> _Origin:
        if i < len(param_paths):
            return _Origin(f"param {param_paths[i]}", "param")
        return _Origin("batch input" if i == len(param_paths) else "labels", "input")

    found = find_residuals(loss, params, const_args=(x, y), input_origin=loss_inputs)
    rows = [_row(f, "stack" if f.stacked else "outside") for f in found]

    # 3. grouped stacks (nested, recursive): the backward pass replays one group at a time,
    #    and while it does it holds the residuals of that group's inner scans: at every level
    #    below the outermost, the block inputs of one group of that level (under ``full``).
    levels = stack_levels(pol, num_layers)
    for depth in range(1, len(levels or ())):
        inner = levels[depth:]
        rows_in_group = math.prod(inner)
        group_params = jax.tree_util.tree_map(
            lambda a, n=rows_in_group: jax.ShapeDtypeStruct((n, *a.shape[1:]), a.dtype), stacked
        )
        replay = find_residuals(
            lambda g, c, inner=inner: scan_levels(layer_fn, g, c, inner),
            group_params,
            h,
            input_origin=block_inputs,
        )
        rows += [_row(f, "replay") for f in replay]

    rows = _merge(rows)

    def order(r):
        return (
            _SCOPE_ORDER[r["scope"]],
            _KIND_ORDER[r["kind"]],
            _name_order(r["name"]),
            -r["bytes"],
            r["name"],
        )

    rows.sort(key=order)
    per_block.sort(key=order)

    def total(mem, scope=None):
        return sum(
            r["bytes"]
            for r in rows
            if r["kind"] == "activation"
            and r["memory_kind"] == mem
            and (scope is None or r["scope"] == scope)
        )

    return {
        "model": model_name_or_cfg if isinstance(model_name_or_cfg, str) else cfg.kind,
        "backend": backend,
        "policy": pol.name,
        "batch": batch,
        "seq": seq,
        "num_layers": num_layers,
        "groups": levels[0] if pol.nested else None,
        "levels": list(levels) if levels else None,
        "per_block": per_block,
        "residuals": rows,
        "total_device_bytes": total(DEVICE),
        "total_host_bytes": total(HOST),
        "stack_device_bytes": total(DEVICE, "stack"),
        "stack_host_bytes": total(HOST, "stack"),
        "replay_device_bytes": total(DEVICE, "replay"),
        "outside_device_bytes": total(DEVICE, "outside"),
        "param_bytes_listed": sum(r["bytes"] for r in rows if r["kind"] == "param"),
    }


_SCOPE_ORDER = {"stack": 0, "replay": 1, "outside": 2, "block": 0}
_KIND_ORDER = {"activation": 0, "constant": 1, "input": 2, "param": 3}


def _name_order(name: str) -> int:
    return names.ALL.index(name) if name in names.ALL else len(names.ALL)


def batch_shapes(cfg: ModelConfig, batch: int, seq: int | None):
    """Abstract (input, labels) of a batch, matching :func:`zoo.example_batch`."""
    return cfg.input_spec(batch, seq), cfg.labels_spec(batch, seq)
