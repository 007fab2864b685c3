"""The per-layer choice of norm form, measured: both forms of every distinct dense site shape
of a model timed once on this device, the faster cached for the ghost step to read
(:mod:`zoo.dp.ghost.forms`), and the table of what each choice saved.

The shapes are those the rules see in the book-keeping step (:func:`site_shapes`: one
abstract probe pass, so LoRA adapters, a tied head and users' records grouped as positions are
all found as they run). A form is timed as the rule runs it: the norms and the clipped sum of
one layer (:class:`zoo.dp.ghost.rules.Dense` forced to the form), on random operands of the
step's dtype, median of a few calls after a compiling one.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from zoo.dp.ghost import forms
from zoo.dp.ghost.forms import FORMS, Shape
from zoo.dp.ghost.rules import RULES, compute_dtype
from zoo.dp.ghost.stages import GhostPlan, probe_pass

MEASURED_KINDS = ("dense", "unembed")  # a conv or a token table keeps its formula
TIMED_CALLS = 5


def site_shapes(gp: GhostPlan, params, x, y) -> list[dict]:
    """``{"site", "layers", "shape"}`` for every active dense site of the plan on ``x`` (units
    of ``gp.records`` rows), the :class:`~zoo.dp.ghost.forms.Shape` as its rule reads it."""
    _, caps, deltas = jax.eval_shape(lambda p, xs, ys: probe_pass(gp, p, xs, ys), params, x, y)
    units = x.shape[0] // gp.records
    rows = []
    for site in gp.active:
        if site.kind not in MEASURED_KINDS or "w" not in site.leaves:
            continue
        a, d = caps[site.key], deltas[site.key]
        lead = 1 if site.stacked else 0  # the layer axis of a stacked site
        layers = a.shape[0] if site.stacked else 1
        positions = 1
        for n in a.shape[lead + 1 : -1]:
            positions *= n
        if positions == 1 and gp.records == 1:
            continue  # no sequence axis: the flat rule, nothing to choose
        dtype = compute_dtype(a, d).name
        seq = positions * gp.records
        shape = Shape(site.kind, units, seq, a.shape[-1], d.shape[-1], dtype, True)
        rows.append({"site": site.key, "layers": layers, "shape": shape})
    return rows


def time_form(shape: Shape, form: str, calls: int = TIMED_CALLS, seed: int = 0) -> float:
    """Median ms of one layer's norms and clipped sum in ``form`` at ``shape`` on this device."""
    ka, kd = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(ka, (shape.batch, shape.seq, shape.d_in), shape.dtype)
    d = jax.random.normal(kd, (shape.batch, shape.seq, shape.d_out), shape.dtype)
    weights, use = jnp.ones((shape.batch,), jnp.float32), jnp.ones((shape.batch,), bool)

    @jax.jit
    def run(a, d, weights, use):
        rule = RULES[shape.kind](a, d, ("w",), None, form)
        return rule.sq()["w"], rule.grad(weights, use)["w"]

    jax.block_until_ready(run(a, d, weights, use))
    times = []
    for _ in range(calls):
        tic = time.perf_counter()
        jax.block_until_ready(run(a, d, weights, use))
        times.append(time.perf_counter() - tic)
    return 1e3 * statistics.median(times)


def measure(shapes, remeasure: bool = False, progress=None) -> dict:
    """``{Shape: {"form", "ms"}}``: each distinct shape timed in both forms (or read from the
    cache, unless ``remeasure``), the faster written to the cache."""
    out = {}
    for shape in dict.fromkeys(shapes):
        entry = None if remeasure else forms.measured(shape)
        if not forms.timed(entry):  # none cached, or without both times: time it
            if progress is not None:
                progress(f"ghost forms: timing {shape.kind} {shape.seq} x {shape.d_in} -> {shape.d_out}")
            ms = {form: round(time_form(shape, form), 3) for form in FORMS}
            entry = {"form": min(FORMS, key=lambda f: (ms[f], f != shape.formula())), "ms": ms}
            _write(forms.key(shape), {**entry, "shape": shape.__dict__})
        out[shape] = entry
    return out


def _write(key: str, entry: dict) -> None:
    forms.CACHE.put(key, entry)  # merged into the file as it is now; a reader sees it whole


def choice_table(rows: list[dict], timings: dict | None = None) -> dict:
    """The per-site choice with its cost, and the totals of the chosen forms against all-Gram and
    all-materialised (GFLOP of multiply-adds x 2; ms where ``timings`` has them), per site
    summed over its layers. Without timings the choice is the formula's."""
    out, totals = [], {"chosen": [0.0, 0.0], "gram": [0.0, 0.0], "materialise": [0.0, 0.0]}
    for row in rows:
        shape, layers = row["shape"], row["layers"]
        entry = (timings or {}).get(shape)
        chosen = entry["form"] if entry else forms.choose(shape)
        gflop = {f: 2e-9 * layers * shape.flops(f) for f in FORMS}
        ms = {f: layers * entry["ms"][f] for f in FORMS} if forms.timed(entry) else None
        for name, form in (("chosen", chosen), ("gram", "gram"), ("materialise", "materialise")):
            totals[name][0] += gflop[form]
            totals[name][1] += ms[form] if ms else 0.0
        shown = {**row, "shape": dict(shape.__dict__)}  # JSON as it is
        out.append({**shown, "formula": shape.formula(), "chosen": chosen, "gflop": gflop, "ms": ms})
    return {"rows": out, "totals": totals, "timed": timings is not None}
