"""Sections 3-5 of ``benchmarks/device/device_check.py``: step time and MFU per policy, DP cost, and
chunked against dense attention. Rows as in :mod:`device_sections`."""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
from device_sections import guarded, memory_row

import zoo
from zoo.bench.common import compile_timed, median_ratio, memory_stats, state_stepper, time_in_rounds
from zoo.models.attention import attention as attend
from zoo.train import throughput


def _xla_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def step_times(size: dict, keep: dict, say=None) -> list[dict]:
    """Median step time of every policy at ``size["time_depth"]`` layers in every precision
    (steps from the memory section where it ran in this process, else compiled here), all
    timed in the same rounds: its ratio to ``none`` (same precision), a bf16 row's to the same
    policy in float32, and MFU (``zoo.train.throughput``: zoo's one FLOP count, the device's
    peak)."""
    depth = size["time_depth"]
    runs, rows = {}, []
    for precision in size["precisions"]:
        for policy in size["policies"]:
            key = (policy, depth, precision)
            if key not in keep:
                if say:
                    say(f"time: compiling {policy} at L={depth}, {precision}")
                guarded({}, lambda key=key: memory_row(size, *key[:2], keep, key[2]))
            if key in keep:
                runs[key] = keep[key]
            else:
                rows.append(
                    {
                        "policy": policy,
                        "precision": precision,
                        "status": "skipped",
                        "error": "did not compile",
                    }
                )
    if say:
        say(f"time: {size['rounds']} rounds of {len(runs)} steps")
    times = time_in_rounds({f"{k[0]} {k[2]}": r["stepper"] for k, r in runs.items()}, size["rounds"])
    for (policy, _, precision), run in runs.items():
        rows.append({**_time_row(run, times, policy, precision, depth), "status": "ok"})
    return rows


def _time_row(run: dict, times: dict, policy: str, precision: str, depth: int) -> dict:
    cfg, x = run["cfg"], run["x"]
    flops = throughput.step_flops(cfg, x.shape[0], x.shape[1])
    mine = times[f"{policy} {precision}"]
    step_s = statistics.median(mine)
    row = {
        "policy": policy,
        "precision": precision,
        "num_layers": depth,
        "steps": len(mine),
        "step_ms": 1e3 * step_s,
    }
    if f"none {precision}" in times:
        row["ratio_to_none"] = median_ratio(mine, times[f"none {precision}"])
    if precision != "float32" and f"{policy} float32" in times:
        row["ratio_to_float32"] = median_ratio(mine, times[f"{policy} float32"])
    peak = throughput.peak_flops(precision)
    row.update(model_flops=flops, achieved_tflops=flops / step_s / 1e12, peak_flops=peak)
    row["mfu"] = flops / step_s / peak if peak else None
    row.update(guarded({}, lambda: {"xla_flops": _xla_flops(run["compiled"])}))
    return row


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


def dp_bf16(size: dict, say=None) -> list[dict]:
    """DP cost in bf16 (``zoo.precision``) per model: the ghost-clipped DP-SGD step and the
    non-private step, both bf16, and the ghost step in float32, timed in the same rounds:
    ghost / non-private in bf16, and ghost bf16 / ghost float32. ``size["bf16_models"]``
    (default: every model of the section) names the models."""
    import optax

    from zoo.dp.plan import fixed_batch_plan
    from zoo.precision import Precision
    from zoo.train import stages
    from zoo.train.engine import GradientSettings, make_engine

    rows = []
    for model in size.get("bf16_models", list(size["models"])):
        spec = size["models"][model]
        if say:
            say(f"dp: {model} at batch {spec['batch']}, bfloat16")

        def run(model=model, spec=spec):
            cfg = zoo.get_config(model, **spec.get("overrides", {}))
            start = stages.config_start(cfg, zoo.to_canonical(zoo.load_model(cfg)))
            x = zoo.example_batch(cfg, spec["batch"], seq_len=spec.get("seq"))
            batch = {"x": x, "y": zoo.example_labels(cfg, x), "mask": jnp.ones((spec["batch"],), jnp.float32)}
            steppers = {}
            for name, dp, precision in (
                ("non-private", None, "bfloat16"),
                ("ghost", "ghost", "bfloat16"),
                ("ghost float32", "ghost", "float32"),
            ):
                plan = dp and fixed_batch_plan(spec["batch"], noise_multiplier=1.0, clipping=dp)
                grad = GradientSettings("nnx", optax.sgd(1e-3), precision=Precision(precision))
                engine = make_engine(start, grad, dp=plan)
                state = {"state": engine.init_state(start.params, 0, jax.random.key(0)), "out": None}
                steppers[name] = state_stepper(lambda s, b, e=engine: _advance(e, s, b), state, batch)
            times = time_in_rounds(steppers, size["rounds"], size["steps"])
            return {
                "precision": "bfloat16",
                "ghost_ms": 1e3 * statistics.median(times["ghost"]),
                "non_private_ms": 1e3 * statistics.median(times["non-private"]),
                "ghost_over_non_private": median_ratio(times["ghost"], times["non-private"]),
                "ghost_bf16_over_float32": median_ratio(times["ghost"], times["ghost float32"]),
            }

        rows.append(guarded({"model": model, "batch": spec["batch"], "precision": "bfloat16"}, run))
    return rows


def _advance(engine, carried, batch):
    """One step of ``engine`` on ``(state, frozen)``: ``((state, frozen), metrics)``."""
    state, frozen = carried
    state, metrics = engine.train_step(state, frozen, batch)
    return (state, frozen), metrics


def attention(size: dict, say=None) -> list[dict]:
    """Value and gradient of causal attention alone, dense against chunked, at ``seq``:
    compiled temp bytes and median time of interleaved rounds."""
    b, t, h, d = size["batch"], size["seq"], size["heads"], size["head_dim"]
    key = jax.random.key(0)
    q, k, v = (jax.random.normal(kk, (b, t, h * d), jnp.float32) for kk in jax.random.split(key, 3))
    variants = {
        "dense": lambda q, k, v: attend(q, k, v, h),
        "chunked": lambda q, k, v: attend(q, k, v, h, kind="chunked", chunk=size["chunk"]),
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
