"""``zoo bench remat --depths``: ``zoo train``'s step (:mod:`zoo.bench.step`) compiled (never
run) at several layer counts for each policy, to show how temp memory and compile time grow
with depth."""

from __future__ import annotations

from collections.abc import Sequence

import jax

from zoo.bench.common import memory_stats
from zoo.bench.step import Progress, bench_config, compile_step, say, warmed_inputs
from zoo.errors import ZooError
from zoo.models.registry import check_backend
from zoo.remat import get_policy, policy_names
from zoo.residuals import residual_report


def parse_depths(depths: str | Sequence[int]) -> list[int]:
    """``"16,64"`` or ``[16, 64]`` -> positive layer counts; anything else is a ZooError."""
    if isinstance(depths, str):
        try:
            depths = [int(d) for d in depths.split(",") if d.strip()]
        except ValueError:
            raise ZooError(f"--depths must be comma-separated layer counts, got {depths!r}") from None
    depths = list(depths)
    if not depths or any(d <= 0 for d in depths):
        raise ZooError(f"depths must be positive layer counts, got {depths}")
    return depths


def bench_depths(
    model,
    policies=("full", "nested"),
    depths=(16, 64),
    backend: str = "nnx",
    batch: int | None = None,
    seq: int | None = None,
    seed: int = 0,
    residuals: bool = True,
    progress: Progress = None,
    overrides: dict | None = None,
    precision: str | None = None,
) -> dict:
    """Compile (without running) the train step at each depth for each policy, under
    ``precision`` (:mod:`zoo.precision`, float32 by default).

    Rows: ``{policy, num_layers, temp_bytes, compile_s, lower_s, param_bytes,
    residual_device_bytes, residual_host_bytes}``. ``param_bytes`` is given because the
    gradient (one param-sized temp buffer) also grows with depth, whatever the policy.
    ``growth``: per policy, each figure at the deepest depth divided by the same figure at the
    shallowest.
    """
    backend = check_backend(backend)
    names = [get_policy(p).name for p in (policies.split(",") if isinstance(policies, str) else policies)]
    depths = parse_depths(depths)
    cfg0 = bench_config(model, None, overrides)
    batch, seq, x, y = warmed_inputs(model, cfg0, backend, batch, seq, seed, progress, "remat depth sweep")
    rows = []
    for name in names:
        for depth in depths:
            say(progress, f"remat depth sweep: {name} at L={depth}")
            cfg = bench_config(model, depth, overrides)
            rows.append(_depth_row(cfg, backend, name, depth, batch, seq, seed, x, y, residuals, precision))
    return {
        "model": model if isinstance(model, str) else cfg0.kind,
        "backend": backend,
        "precision": precision or "float32",
        "batch": batch,
        "seq": seq,
        "depths": depths,
        "device": jax.devices()[0].platform,
        "rows": rows,
        "growth": _growth(rows, names, depths),
    }


def _depth_row(cfg, backend, name, depth, batch, seq, seed, x, y, residuals: bool, precision) -> dict:
    """One policy at one depth, compiled from shapes only (nothing is allocated or run)."""
    step = compile_step(cfg, x, y, backend=backend, remat=name, precision=precision, seed=seed)
    stats = memory_stats(step.compiled)
    row = {
        "policy": name,
        "num_layers": depth,
        "temp_bytes": stats["temp_size_in_bytes"],
        "argument_bytes": stats["argument_size_in_bytes"],
        "compile_s": round(step.compile_s, 3),
        "lower_s": round(step.lower_s, 3),
        # the gradient is a temp buffer of this size, and it grows with depth too
        "param_bytes": sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(step.state.params)),
        "program": step.program,
    }
    if residuals:
        report = residual_report(
            cfg, name, backend=backend, batch=batch, seq=seq, seed=seed, precision=precision
        )
        row["residual_device_bytes"] = report["total_device_bytes"]
        row["residual_host_bytes"] = report["total_host_bytes"]
        row["groups"] = report["groups"]
        row["levels"] = report["levels"]
    return row


def _growth(rows: list[dict], names: list[str], depths: list[int]) -> list[dict]:
    """Per policy: each figure at the deepest depth divided by the same at the shallowest."""
    growth = []
    lo, hi = min(depths), max(depths)
    for name in names:
        first = next(r for r in rows if r["policy"] == name and r["num_layers"] == lo)
        last = next(r for r in rows if r["policy"] == name and r["num_layers"] == hi)
        entry = {"policy": name, "from_layers": lo, "to_layers": hi}
        for key, label in (
            ("temp_bytes", "temp_growth"),
            ("compile_s", "compile_growth"),
            ("residual_device_bytes", "residual_device_growth"),
        ):
            if first.get(key):
                entry[label] = round(last[key] / first[key], 3)
        growth.append(entry)
    return growth


def compile_scaling(model, policies=None, depths=(4, 48), **kwargs) -> dict:
    """Compile time (and temp memory) of the train step at each depth, for every policy:
    :func:`bench_depths` with the policy list defaulting to all registered policies."""
    return bench_depths(model, policies=policies or policy_names(), depths=depths, **kwargs)
