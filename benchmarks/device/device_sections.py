"""The five sections of ``benchmarks/device/device_check.py``: gradients, memory, time, DP cost and
attention. Each returns a list of JSON-ready rows; a row that raises records its error and is
skipped (a JAX 0.12-only policy or API missing on the device's JAX 0.11 must not end the run).

Only public zoo entry points are used (``zoo.load_model``, ``zoo.apply_fn``, ``zoo.get_config``,
``zoo.remat``, ``zoo.bench.common``, ``zoo.bench.step``, ``zoo.bench.dp``), so model files may move underneath.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

import zoo
from zoo.bench import floats
from zoo.bench.common import memory_stats
from zoo.bench.step import compile_step
from zoo.losses import per_example_loss
from zoo.remat import policy_names

# --- the suite's float rule (zoo.bench.floats, the formula tests/numerics.py asserts with) ---


def float_rule(actual, expected, n: int, dtype) -> dict:
    """``{excess, where, tolerance}``: the worst |actual - expected| over the rule's tolerance
    (<= 1 passes), the element it was found at, and the tolerance. Non-finite values or shapes
    that differ give ``inf``."""
    excess, where, tol = floats.worst(actual, expected, n, dtype)
    return {"excess": excess, "where": where, "tolerance": tol}


def guarded(row: dict, fn) -> dict:
    """Run ``fn() -> dict`` into ``row``; an exception becomes ``status: skipped`` with its text."""
    try:
        row.update(fn())
        row.setdefault("status", "ok")
    except Exception as e:  # noqa: BLE001 - one row's failure (e.g. a 0.12-only API) is reported
        row.update(status="skipped", error=f"{type(e).__name__}: {e}"[:600])
    return row


def _inputs(cfg, batch: int, seq: int | None):
    x = zoo.example_batch(cfg, batch, seq_len=seq)
    return x, zoo.example_labels(cfg, x)


def _cast(params, dtype):
    return jax.tree.map(lambda a: a.astype(dtype), params)


# --- 1. gradients ------------------------------------------------------------------------


def gradient_variants(size: dict) -> list[tuple[str, str, dict]]:
    """``(label, policy, config overrides)``: every registered policy, then chunked attention
    and the chunked MLP under each of ``size["chunk_policies"]``. All are compared with dense
    ``none``."""
    chunked = {"attention": "chunked", "attention_chunk": size["attention_chunk"]}
    mlp = {"mlp_chunk": size["mlp_chunk"]}
    rows = [(p, p, {}) for p in policy_names() if p != "none"]
    for label, over in (("chunked attention", chunked), ("mlp_chunk", mlp)):
        rows += [(label if p == "none" else f"{label} + {p}", p, over) for p in size["chunk_policies"]]
    return rows


def _grads(cfg, policy: str, params, x, y):
    apply = zoo.apply_fn(cfg, "nnx")

    def loss(p):
        return per_example_loss(apply(p, x, policy), y).mean()

    # float32 means float32: on NVIDIA GPUs the default precision runs float32 matmuls as TF32,
    # whose 10-bit mantissa the float rule's eps(float32) does not allow for.
    with jax.default_matmul_precision("highest"):
        return jax.block_until_ready(jax.jit(jax.grad(loss))(params))


def _planted(grads):
    """A wrong gradient: the leaf holding the tree's largest entry, 1.5 times too large."""
    leaves, treedef = jax.tree.flatten(grads)
    i = max(range(len(leaves)), key=lambda j: float(jnp.max(jnp.abs(leaves[j].astype(jnp.float32)))))
    leaves[i] = leaves[i] * 1.5
    return jax.tree.unflatten(treedef, leaves)


def gradients(size: dict, plant_bug=None, say=None, only: str | None = None, jobs: int = 1) -> list[dict]:
    """Every variant's gradient (or those named in ``only``) against ``none`` under the float
    rule, per model and dtype. ``plant_bug`` names a variant whose gradient is made wrong.

    float32: n = batch x tokens x d_ff, the largest reduction behind a weight gradient. bf16:
    n = 1, i.e. K x eps(bf16) = 6% of the tree's scale: dots accumulate in float32, so two bf16
    programs differ by where they round a stored value, not by a bf16 sum (with n as for
    float32 the tolerance would exceed the gradient itself and nothing could fail). With
    ``size["pairs"]`` (``--small``) each variant runs on one (model, dtype) pair, in turn."""
    pairs = [(m, d) for m in size["models"] for d in ("float32", "bfloat16")]
    variants = gradient_variants(size)
    if only:
        wanted = [v.strip() for v in only.split(",")]
        unknown = set(wanted) - {v[0] for v in variants}
        if unknown:
            raise ValueError(
                f"unknown gradient variant(s) {sorted(unknown)}; valid: {[v[0] for v in variants]}"
            )
        variants = [v for v in variants if v[0] in wanted]
    plan = [(pair, v) for pair in pairs for v in variants]
    if size.get("round_robin"):
        plan = [(pairs[i % len(pairs)], v) for i, v in enumerate(variants)]
    refs = {pair: _reference(size, *pair) for pair in dict.fromkeys(pair for pair, _ in plan)}

    def one(item):
        (model, dtype), (label, policy, over) = item
        if say:
            say(f"gradients: {model} {dtype} {label}")
        row = {"model": model, "dtype": dtype, "variant": label, "policy": policy}
        return guarded(row, lambda: _check(refs[(model, dtype)], label, policy, over, plant_bug))

    # Compiling is most of the time and XLA compiles outside the GIL: ``jobs`` at once.
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, plan))


def _reference(size: dict, model: str, dtype: str) -> dict:
    """What every variant of one (model, dtype) is compared with: ``none``'s gradient."""
    cfg = zoo.get_config(model, **size["overrides"])
    x, y = _inputs(cfg, size["batch"], size["seq"])
    params = _cast(zoo.to_canonical(zoo.load_model(cfg)), jnp.dtype(dtype))
    n = size["batch"] * size["seq"] * cfg.d_ff if dtype == "float32" else 1
    grads = _grads(cfg, "none", params, x, y)
    return {
        "size": size,
        "model": model,
        "dtype": dtype,
        "params": params,
        "x": x,
        "y": y,
        "n": n,
        "grads": grads,
    }


def _check(ref: dict, label: str, policy: str, over: dict, plant_bug: str | None) -> dict:
    cfg = zoo.get_config(ref["model"], **ref["size"]["overrides"], **over)
    grads = _grads(cfg, policy, ref["params"], ref["x"], ref["y"])
    if plant_bug == label:
        grads = _planted(grads)
    result = float_rule(grads, ref["grads"], ref["n"], jnp.dtype(ref["dtype"]))
    return {**result, "n": ref["n"], "passed": bool(result["excess"] <= 1.0)}


# --- 2. memory ---------------------------------------------------------------------------

# Each offload policy against the policy that keeps the same names on the device.
OFFLOAD_TWIN = {"offload-layer-input": "full", "offload-minimal": "minimal"}


def device_peak() -> int | None:
    """``peak_bytes_in_use`` of the first device, or None where the backend (CPU) has none."""
    stats = jax.devices()[0].memory_stats()
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def memory_row(
    size: dict, policy: str, depth: int, keep: dict | None = None, precision: str = "float32"
) -> dict:
    """Compile and run two steps of the memory model at ``depth`` under ``policy`` and the
    ``precision`` policy (``zoo.precision``: float32 params, bf16 compute for "bfloat16"): the
    step ``zoo train --remat POLICY --precision P`` runs (``zoo.bench.step.compile_step``).
    ``keep`` (in-process runs) receives the compiled step and its state for the time section."""
    cfg = zoo.get_config(size["model"], **size["overrides"], num_layers=depth)
    x, y = _inputs(cfg, size["batch"], size["seq"])
    params = zoo.to_canonical(zoo.load_model(cfg))
    step = compile_step(cfg, x, y, remat=policy, precision=precision, params=params)
    compiled, compile_s = step.compiled, step.compile_s
    analysis = memory_stats(compiled)
    state = {"state": step.state, "out": None}
    stepper = step.stepper(state)
    stepper(2)
    report = zoo.residual_report(cfg, policy, batch=size["batch"], seq=size["seq"], precision=precision)
    if keep is not None:
        keep[(policy, depth, precision)] = {"compiled": compiled, "stepper": stepper, "cfg": cfg, "x": x}
    return {
        "peak_bytes": device_peak(),
        "analysis_bytes": analysis["temp_size_in_bytes"]
        + analysis["argument_size_in_bytes"]
        + analysis["output_size_in_bytes"]
        - analysis["alias_size_in_bytes"],
        "temp_bytes": analysis["temp_size_in_bytes"],
        "argument_bytes": analysis["argument_size_in_bytes"],
        "host_temp_bytes": analysis["host_temp_size_in_bytes"],
        "residual_device_bytes": report["total_device_bytes"],
        "residual_host_bytes": report["total_host_bytes"],
        "compile_s": round(compile_s, 3),
        "loss_finite": bool(np.isfinite(float(state["out"]["loss"]))),
    }


def _child(script: str, small: bool, policy: str, depth: int, jobs: int, precision: str) -> dict:
    """One memory row in a process of its own: ``peak_bytes_in_use`` never resets."""
    env = {
        **os.environ,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / jobs:.3f}",
    }
    spec = {"policy": policy, "depth": depth, "precision": precision}
    argv = [sys.executable, script, "--memory-child", json.dumps(spec)]
    done = subprocess.run(argv + (["--small"] if small else []), capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    out = json.loads(lines[-1])
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def memory(
    size: dict, isolate: bool, script: str, small: bool, jobs: int, keep: dict, say=None
) -> list[dict]:
    """Per precision, policy and depth: the device peak (``memory_stats``; each row in its own
    process when ``isolate``) beside ``memory_analysis``, host bytes, and what each offload
    saves; bf16 rows also their temp bytes over the float32 row's."""
    plan = [(p, d, prec) for prec in size["precisions"] for d in size["depths"] for p in size["policies"]]

    def one(item):
        policy, depth, precision = item
        if say:
            say(f"memory: {policy} at L={depth}, {precision}")
        row = {"policy": policy, "num_layers": depth, "precision": precision, "isolated": isolate}
        if isolate:
            return guarded(row, lambda: _child(script, small, policy, depth, jobs, precision))
        return guarded(row, lambda: memory_row(size, policy, depth, keep, precision))

    with ThreadPoolExecutor(max(1, jobs if isolate else 1)) as pool:
        rows = list(pool.map(one, plan))
    for row in rows:
        _compare_to_float32(row, rows)
        twin = OFFLOAD_TWIN.get(row["policy"])
        base = next((r for r in rows if _same_step(r, row, policy=twin)), None)
        if twin and base and row["status"] == "ok" and base["status"] == "ok":
            key = "peak_bytes" if row["peak_bytes"] is not None else "analysis_bytes"
            row.update(
                offload_vs=twin,
                saved_basis=key,
                saved_bytes=base[key] - row[key],
                saves_device_memory=bool(base[key] > row[key]),
            )
    return rows


def _same_step(r: dict, row: dict, **changed) -> bool:
    """Whether ``r`` is ``row``'s step (policy, depth, precision) with ``changed`` fields."""
    keys = ("policy", "num_layers", "precision")
    return all(r[k] == changed.get(k, row[k]) for k in keys)


def _compare_to_float32(row: dict, rows: list[dict]) -> None:
    """A bf16 row's temp (and residual) bytes over those of the same step in float32."""
    base = next((r for r in rows if _same_step(r, row, precision="float32")), None)
    if row["precision"] == "float32" or base is None:
        return
    if row["status"] == base["status"] == "ok" and base["temp_bytes"]:
        row["temp_of_float32"] = row["temp_bytes"] / base["temp_bytes"]
        if base["residual_device_bytes"]:
            row["residual_device_of_float32"] = row["residual_device_bytes"] / base["residual_device_bytes"]
