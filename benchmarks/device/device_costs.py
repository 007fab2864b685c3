"""Sections 3-5 of ``benchmarks/device/device_check.py``: step time and MFU per policy, DP cost, and
chunked against dense attention. Rows as in :mod:`device_sections`."""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
from device_sections import guarded, memory_row

import zoo
from zoo.bench.common import compile_timed, median_ratio, memory_stats, time_in_rounds
from zoo.models.attention import chunked_attention
from zoo.models.ops import causal_attention

# Dense peak FLOP/s per device kind (vendor datasheets, without sparsity): leads, not
# measurements. float32 matmuls on NVIDIA GPUs run as TF32 under JAX's default precision.
PEAK_FLOPS = {
    "H200": {"bfloat16": 989e12, "float32": 494e12},
    "H100": {"bfloat16": 989e12, "float32": 494e12},
    "A100": {"bfloat16": 312e12, "float32": 156e12},
    "L4": {"bfloat16": 121e12, "float32": 60e12},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12},
    "TPU v6 lite": {"bfloat16": 918e12, "float32": 918e12},
}


def peak_flops(dtype: str = "float32") -> float | None:
    """The table's peak for ``jax.devices()[0]``, or None for a device it does not know."""
    kind = jax.devices()[0].device_kind
    return next((v[dtype] for k, v in PEAK_FLOPS.items() if k.lower() in kind.lower()), None)


def model_flops(cfg, params, batch: int, seq: int) -> float:
    """Counted FLOPs of one training step (forward and backward, no recomputation): 6 per
    weight per token for the matrices of the stack and the head, and 12 B T^2 d per layer for
    q k^T and p v (the causal half not subtracted: dense attention computes it)."""
    matrices = sum(
        r.count
        for r in zoo.param_table(params)
        if len(r.shape) >= 2 and r.path.startswith(("blocks.", "head."))
    )
    return 6.0 * matrices * batch * seq + 12.0 * cfg.num_layers * batch * seq * seq * cfg.d_model


def _xla_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def step_times(size: dict, keep: dict, say=None) -> list[dict]:
    """Median step time of every policy at ``size["time_depth"]`` layers (steps from the
    memory section where it ran in this process, else compiled here), its ratio to ``none``
    and an MFU estimate from :func:`model_flops` against :data:`PEAK_FLOPS`."""
    depth = size["time_depth"]
    runs, rows = {}, []
    for policy in size["policies"]:
        if (policy, depth) not in keep:
            if say:
                say(f"time: compiling {policy} at L={depth}")
            guarded({}, lambda policy=policy: memory_row(size, policy, depth, keep))
        if (policy, depth) in keep:
            runs[policy] = keep[(policy, depth)]
        else:
            rows.append({"policy": policy, "status": "skipped", "error": "did not compile (see memory)"})
    if say:
        say(f"time: {size['rounds']} rounds of {len(runs)} policies")
    times = time_in_rounds({p: r["stepper"] for p, r in runs.items()}, size["rounds"])
    peak = peak_flops("float32")
    for policy, run in runs.items():
        cfg, x = run["cfg"], run["x"]
        params = zoo.to_canonical(zoo.load_model(cfg))
        flops = model_flops(cfg, params, x.shape[0], x.shape[1])
        step_s = statistics.median(times[policy])
        row = {"policy": policy, "num_layers": depth, "steps": len(times[policy]), "step_ms": 1e3 * step_s}
        if "none" in times:
            row["ratio_to_none"] = median_ratio(times[policy], times["none"])
        row.update(model_flops=flops, achieved_tflops=flops / step_s / 1e12, peak_flops=peak)
        row["mfu"] = flops / step_s / peak if peak else None
        row.update(guarded({}, lambda run=run: {"xla_flops": _xla_flops(run["compiled"])}))
        rows.append({**row, "status": "ok"})
    return rows


def dp_cost(size: dict, say=None) -> list[dict]:
    """``zoo bench dp`` (non-private, ghost, jax_privacy) per model: ghost / non-private and
    jax_privacy.clipped_grad / ghost, from median step times of interleaved rounds."""
    from zoo.bench.dp import BASELINE, GHOST, bench_dp

    jp = "jax_privacy clipped_grad"
    rows = []
    for model, spec in size["models"].items():
        if say:
            say(f"dp: {model} at batch {spec['batch']}")

        def run(model=model, spec=spec):
            cfg = zoo.get_config(model, **spec.get("overrides", {}))
            result = bench_dp(
                cfg,
                batch=spec["batch"],
                seq=spec.get("seq"),
                methods=[BASELINE, GHOST, jp],
                memory_sweep=False,
                rounds=size["rounds"],
                steps_per_round=size["steps"],
            )
            ms = {r["method"]: r for r in result["rows"]}
            return {
                "seq": result["seq"],
                "rounds": size["rounds"],
                "non_private_ms": ms[BASELINE]["step_ms"],
                "ghost_ms": ms[GHOST]["step_ms"],
                "jax_privacy_ms": ms[jp]["step_ms"],
                "ghost_over_non_private": ms[GHOST]["step_ratio"],
                "jax_privacy_over_ghost": ms[jp]["step_ms"] / ms[GHOST]["step_ms"],
                "temp_bytes": {k: v["temp_bytes"] for k, v in ms.items()},
            }

        rows.append(guarded({"model": model, "batch": spec["batch"]}, run))
    return rows


def attention(size: dict, say=None) -> list[dict]:
    """Value and gradient of causal attention alone, dense against chunked, at ``seq``:
    compiled temp bytes and median time of interleaved rounds."""
    b, t, h, d = size["batch"], size["seq"], size["heads"], size["head_dim"]
    key = jax.random.key(0)
    q, k, v = (jax.random.normal(kk, (b, t, h * d), jnp.float32) for kk in jax.random.split(key, 3))
    variants = {
        "dense": lambda q, k, v: causal_attention(q, k, v, h),
        "chunked": lambda q, k, v: chunked_attention(q, k, v, h, chunk=size["chunk"]),
    }
    rows, steppers = [], {}
    for name, fn in variants.items():
        if say:
            say(f"attention: {name} at T={t}")

        def build(name=name, fn=fn):
            grad = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
            compiled, _, compile_s = compile_timed(grad, q, k, v)
            steppers[name] = lambda n, c=compiled: [jax.block_until_ready(c(q, k, v)) for _ in range(n)]
            return {"temp_bytes": memory_stats(compiled)["temp_size_in_bytes"], "compile_s": compile_s}

        rows.append(
            guarded(
                {"attention": name, "seq": t, "chunk": size["chunk"] if name == "chunked" else None}, build
            )
        )
    times = time_in_rounds(steppers, size["rounds"]) if steppers else {}
    dense = next((r for r in rows if r["attention"] == "dense" and r["status"] == "ok"), None)
    for row in rows:
        if row["attention"] in times:
            row["step_ms"] = 1e3 * statistics.median(times[row["attention"]])
            if dense is not None:
                row["temp_of_dense"] = (
                    row["temp_bytes"] / dense["temp_bytes"] if dense["temp_bytes"] else None
                )
                row["time_of_dense"] = median_ratio(times[row["attention"]], times["dense"])
    return rows
