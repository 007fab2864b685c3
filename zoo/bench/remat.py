"""``zoo bench remat``: every remat policy side by side on one model, in one process.

The policies are measured by :func:`zoo.train.remat_search.search`, the chooser behind
``zoo train --remat auto``: for each, the step ``zoo train --remat POLICY`` runs (the run's
stages on the preset, with the default recipe's optimizer; the state donated) is lowered and
compiled, its bytes read from XLA's ``memory_analysis()``, and then the policies take turns in
timed rounds on one state (one untimed and one timed step each per round), so that all of them
see the same machine load. The residual inspector (:mod:`zoo.residuals`) says how many
activation bytes each keeps on device and on host. Ratios are relative to ``none`` (always
measured); the step ratio is the median over rounds of the per-round ratio. With ``--budget``
the candidates and the choice are ``--remat auto``'s (:func:`bench_remat`).

With depths (``--depths 16,64``) the benchmark instead compiles the step at each depth
without running it, to show how temp memory and compile time grow with the layer count
(:mod:`zoo.bench.remat_depths`).
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import numpy as np

from zoo import bench
from zoo.bench.common import median_ratio, positive_int, scatter_plot
from zoo.bench.remat_depths import bench_depths, parse_depths
from zoo.bench.step import FALLBACK_BATCH, Progress, bench_config, bench_start, step_recipe, warmed_inputs
from zoo.configs import add_model_flags, add_precision_flag, model_flag_overrides
from zoo.errors import ZooError
from zoo.models import canonical
from zoo.models.registry import check_backend
from zoo.remat import get_policy, parse_bytes, policy_names
from zoo.residuals import residual_report
from zoo.train import stages
from zoo.train.auto_remat import candidates_for, host_memory_is_separate
from zoo.train.remat_search import candidates, pick, placement_of, search

BASELINE = "none"


def parse_policies(policies: str | Iterable[str] | None) -> list[str]:
    """Policy names (comma string or list) -> validated names, ``none`` first. Unknown names
    raise a ZooError listing the valid ones."""
    if policies is None:
        names = policy_names()
    elif isinstance(policies, str):
        names = [p.strip() for p in policies.split(",") if p.strip()]
    else:
        names = list(policies)
    if not names:
        raise ZooError("no remat policies given; valid: " + ", ".join(policy_names()))
    names = [get_policy(n).name for n in names]
    if BASELINE not in names:
        names.insert(0, BASELINE)
    return list(dict.fromkeys(names))


def bench_remat(
    model,
    policies=None,
    backend: str = "nnx",
    batch: int | None = None,
    seq: int | None = None,
    num_layers: int | None = None,
    repeats: int = 5,
    plot: str | None = None,
    seed: int = 0,
    progress: Progress = None,
    budget: int | str | None = None,
    overrides: dict | None = None,
    precision: str | None = None,
) -> dict:
    """Compile, measure and time one train step per policy. See the module docstring.
    ``precision`` (:mod:`zoo.precision`; default float32) is every step's precision policy.

    ``overrides`` are model config fields (``{"attention": "chunked", "mlp_chunk": 16}``); the
    preset's default bench shape still applies.

    With ``budget`` (bytes, or ``"256MiB"``), the candidates are those ``zoo train --remat
    auto`` searches (on an accelerator, every placement of the state too), each row says
    whether its step ``fits``, and ``chosen`` is :func:`zoo.train.remat_search.pick`'s: the
    choice ``zoo train --remat auto --memory-budget`` makes for this model and batch, by the
    same chooser, shown without training."""
    backend = check_backend(backend)
    cfg = bench_config(model, num_layers, overrides)
    names = parse_policies(policies)
    batch, seq, x, y = warmed_inputs(model, cfg, backend, batch, seq, seed, progress, "remat bench")
    recipe = step_recipe(backend, BASELINE, precision)
    start = bench_start(cfg, recipe, canonical.init_params(cfg, seed), seed)
    engine = stages.engine(recipe, start, None, recipe.train.steps)  # zoo train's, as compile_step's
    budget = None if budget is None else parse_bytes(budget)
    among = candidates_for(engine, names) if budget is not None else candidates(names, [placement_of(engine)])
    rows = search(
        engine,
        start.params,
        {"x": x, "y": y, "mask": np.ones((x.shape[0],), np.float32)},
        budget,
        among,
        host_separate=host_memory_is_separate(),
        rounds=repeats,
        time_all=True,
        progress=progress,
    )
    result = {
        "model": model if isinstance(model, str) else cfg.kind,
        "backend": backend,
        "precision": precision or "float32",
        "batch": batch,
        "seq": seq,
        "num_layers": cfg.num_layers,
        "repeats": repeats,
        "device": jax.devices()[0].platform,
        "rows": _bench_rows(cfg, backend, batch, seq, seed, precision, rows),
    }
    if budget is not None:
        best = pick(rows)
        result["budget"], result["chosen"] = budget, best and best["policy"]
        result["chosen_offload"] = best and best["offload"]
    if plot:
        result["plot"] = plot_remat(result, plot)
    return result


def _bench_rows(cfg, backend: str, batch: int, seq, seed: int, precision, rows: list[dict]) -> list[dict]:
    """The search's rows with the bench's columns: ratios to ``none`` (the step's, the median
    over rounds of the per-round ratio) and what the residual inspector says each keeps."""
    base, reports, out = rows[0], {}, []  # base: none, at the first placement
    for row in rows:
        if row["policy"] not in reports:
            reports[row["policy"]] = residual_report(
                cfg, row["policy"], backend=backend, batch=batch, seq=seq, seed=seed, precision=precision
            )
        report = reports[row["policy"]]
        row = {
            **row,
            "residual_device_bytes": report["total_device_bytes"],
            "residual_host_bytes": report["total_host_bytes"],
        }
        temps = row.get("temp_bytes"), base.get("temp_bytes")
        row["temp_ratio"] = round(temps[0] / temps[1], 4) if temps[0] is not None and temps[1] else None
        both = row.get("round_ms") and base.get("round_ms")
        row["step_ratio"] = round(median_ratio(row["round_ms"], base["round_ms"]), 4) if both else None
        out.append(_ordered(row))
    return out


_KEY_ORDER = (
    "policy",
    "temp_bytes",
    "temp_ratio",
    "step_ms",
    "step_ratio",
    "compile_s",
    "residual_device_bytes",
    "residual_host_bytes",
)


def _ordered(row: dict) -> dict:
    return {**{k: row.get(k) for k in _KEY_ORDER}, **{k: v for k, v in row.items() if k not in _KEY_ORDER}}


def plot_remat(result: dict, path: str) -> str:
    """Scatter of compiled temp memory against step time, one labelled point per policy."""
    rows = [r for r in result["rows"] if r.get("temp_bytes") is not None and r["step_ms"] is not None]
    points = [(r["policy"], r["temp_bytes"] / 2**20, r["step_ms"]) for r in rows]
    seq = f" x {result['seq']}" if result.get("seq") else ""
    title = (
        f"{result['model']} ({result['backend']}, L={result['num_layers']}, "
        f"batch {result['batch']}{seq}, {result.get('device', 'cpu')}): remat policies"
    )
    return scatter_plot(
        path, points, xlabel="compiled temp memory (MiB)", ylabel="median train-step time (ms)", title=title
    )


# --- CLI ---------------------------------------------------------------------------------------


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def _run_cli(args) -> int:
    from zoo.ui import emit_json, err_console

    progress = (
        None if args.quiet else (lambda m: err_console.print(m, style="dim", markup=False, highlight=False))
    )
    if args.depths:
        result = bench_depths(
            args.model,
            policies=[p for p in (args.policies or "full,nested").split(",") if p.strip()],
            depths=parse_depths(args.depths),
            backend=args.backend,
            batch=args.batch,
            seq=args.seq,
            progress=progress,
            overrides=model_flag_overrides(args),
            precision=args.precision,
        )
        printer = _print_depths
    else:
        result = bench_remat(
            args.model,
            policies=args.policies,
            backend=args.backend,
            batch=args.batch,
            seq=args.seq,
            num_layers=args.layers,
            repeats=args.repeats,
            plot=args.plot,
            progress=progress,
            budget=args.budget,
            overrides=model_flag_overrides(args),
            precision=args.precision,
        )
        printer = _print_policies
    if args.json:
        emit_json(result)
    else:
        printer(args, result)
    return 0


def _print_depths(args, result: dict) -> None:
    from zoo.ui import print_table

    print_table(
        f"zoo bench remat {args.model} --depths {args.depths} ({result['backend']}, "
        f"batch {result['batch']}, seq {result['seq']}, {result['device']}; compile only)",
        ["policy", "layers", "temp MiB", "compile s", "params MiB", "resid dev MiB", "resid host MiB"],
        [
            (
                r["policy"],
                r["num_layers"],
                _mib(r["temp_bytes"]),
                f"{r['compile_s']:.2f}",
                _mib(r["param_bytes"]),
                _mib(r.get("residual_device_bytes")),
                _mib(r.get("residual_host_bytes")),
            )
            for r in result["rows"]
        ],
    )
    print_table(
        "growth from the shallowest to the deepest stack",
        ["policy", "layers", "temp x", "compile x", "resid dev x"],
        [
            (
                g["policy"],
                f"{g['from_layers']} -> {g['to_layers']}",
                g.get("temp_growth", "-"),
                g.get("compile_growth", "-"),
                g.get("residual_device_growth", "-"),
            )
            for g in result["growth"]
        ],
    )


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_policies(args, result: dict) -> None:
    from zoo.ui import print_table

    rows = result["rows"]
    chosen = (result.get("chosen"), result.get("chosen_offload"))
    placements = len({r["offload"] for r in rows}) > 1
    head = ""
    if args.budget:
        where = f" at offload {chosen[1]}" if placements and chosen[0] else ""
        head = f"; budget {result['budget'] / 2**20:.1f} MiB: {chosen[0] or 'nothing fits'}{where}"
    print_table(
        f"zoo bench remat {args.model} ({result['backend']}, {result['precision']}, L={result['num_layers']}, "
        f"batch {result['batch']}, seq {result['seq']}, {result['device']}, "
        f"median of {result['repeats']} rounds{head})",
        ["policy", *(["offload"] if placements else []), "need MiB", "temp MiB", "temp/none", "step ms"]
        + ["step/none", "compile s", "resid dev MiB", "resid host MiB", *(["fits"] if args.budget else [])],
        [
            (
                r["policy"] + (" <" if (r["policy"], r["offload"]) == chosen else ""),
                *([r["offload"]] if placements else []),
                _mib(r.get("need_bytes")),
                _mib(r.get("temp_bytes")),
                _num(r["temp_ratio"], ".3f"),
                _num(r["step_ms"], ".1f"),
                _num(r["step_ratio"], ".2f"),
                _num(r["compile_s"], ".2f"),
                _mib(r["residual_device_bytes"]),
                _mib(r["residual_host_bytes"]),
                *([("yes" if r.get("fits") else "no")] if args.budget else []),
            )
            for r in rows
        ],
    )
    if args.plot:
        from zoo.ui import console

        console.print(f"plot written to {result['plot']}", markup=False, highlight=False)


def add_bench(bench_sub) -> None:
    bench.register("remat", bench_remat)
    p = bench_sub.add_parser(
        "remat",
        help="remat policies side by side: temp memory, step time, compile time",
        description="Compile and time one train step per remat policy (ratios to 'none'), or "
        "with --depths, compile only at several layer counts.",
    )
    p.add_argument("model", help="model preset, e.g. transformer-s")
    p.add_argument(
        "--policies",
        default=None,
        help="comma-separated policies (default: all; 'none' is always added as the "
        "baseline; with --depths the default is full,nested)",
    )
    p.add_argument("--backend", default="nnx", choices=["nnx", "eqx"])
    p.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        help=f"batch size (default: 16 for transformer-s, else {FALLBACK_BATCH})",
    )
    p.add_argument(
        "--seq",
        type=positive_int,
        default=None,
        help="sequence length (default: 128 for transformer-s, else max_len)",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="override num_layers (the model refuses a count it cannot take)",
    )
    add_model_flags(p)
    add_precision_flag(p, "every step's precision policy (zoo.precision)")
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed rounds; in each, every policy takes one untimed and one timed step",
    )
    p.add_argument(
        "--depths", default=None, help="comma-separated layer counts, e.g. 16,64: compile-only depth sweep"
    )
    p.add_argument(
        "--plot", default=None, metavar="FILE.png", help="write a temp-memory vs step-time scatter plot"
    )
    p.add_argument(
        "--budget",
        metavar="BYTES",
        help="mark the steps that fit, e.g. 256MiB (arguments + outputs - aliased + temp, in device "
        "memory), and the fastest of them: zoo train --remat auto --memory-budget's chooser",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_run_cli)
