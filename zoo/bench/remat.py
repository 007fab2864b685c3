"""``zoo bench remat``: every remat policy side by side on one model, in one process.

For each policy we build the step ``zoo train --remat POLICY`` runs (:mod:`zoo.bench.step`: the
run's stages on the preset, with the recipe's optimizer; the state donated), lower and compile
it, read XLA's ``memory_analysis()`` temp bytes, and ask the residual inspector (:mod:`zoo.residuals`) how many activation bytes the policy keeps
on device and on host. Then the policies take turns in timed rounds (one untimed and one timed
step each per round), so that all of them see the same machine load. Ratios are relative to
``none`` (always measured); the step ratio is the median over rounds of the per-round ratio.

With depths (``--depths 16,64``) the benchmark instead compiles the step at each depth
without running it, to show how temp memory and compile time grow with the layer count
(:mod:`zoo.bench.remat_depths`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import jax

from zoo import bench
from zoo.bench.common import median_ratio, memory_stats, positive_int, scatter_plot, time_in_rounds
from zoo.bench.remat_depths import bench_depths, parse_depths
from zoo.bench.step import FALLBACK_BATCH, Progress, bench_config, compile_step, say, warmed_inputs
from zoo.configs import add_model_flags, add_precision_flag, model_flag_overrides
from zoo.errors import ZooError
from zoo.models import canonical
from zoo.models.registry import check_backend
from zoo.remat import choose_under_budget, get_policy, parse_bytes, policy_names
from zoo.residuals import residual_report

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

    With ``budget`` (bytes, or ``"256MiB"``), each row says whether its step ``fits`` (compiled
    temp plus arguments within it) and ``chosen`` is the fastest that does: the choice
    ``zoo train --remat auto --memory-budget`` makes, shown without training."""
    backend = check_backend(backend)
    cfg = bench_config(model, num_layers, overrides)
    names = parse_policies(policies)
    batch, seq, x, y = warmed_inputs(model, cfg, backend, batch, seq, seed, progress, "remat bench")
    runs = {}
    for name in names:
        say(progress, f"remat bench: compiling {name}")
        runs[name] = _compiled_run(cfg, backend, name, batch, seq, seed, x, y, precision)
    result = {
        "model": model if isinstance(model, str) else cfg.kind,
        "backend": backend,
        "precision": precision or "float32",
        "batch": batch,
        "seq": seq,
        "num_layers": cfg.num_layers,
        "repeats": repeats,
        "device": jax.devices()[0].platform,
        "rows": _timed_rows(runs, repeats, progress),
    }
    if budget is not None:
        result["budget"] = parse_bytes(budget)
        result["chosen"], result["rows"] = choose_under_budget(result["rows"], result["budget"])
    if plot:
        result["plot"] = plot_remat(result, plot)
    return result


def _compiled_run(cfg, backend: str, name: str, batch: int, seq, seed: int, x, y, precision) -> dict:
    """Policy ``name``'s compiled step (``zoo train``'s), its first state and its untimed row
    (memory, compile time, what the residual inspector says it keeps)."""
    step = compile_step(
        cfg, x, y, backend=backend, remat=name, precision=precision, seed=seed,
        params=canonical.init_params(cfg, seed),
    )  # fmt: skip
    report = residual_report(cfg, name, backend=backend, batch=batch, seq=seq, seed=seed, precision=precision)
    stats = memory_stats(step.compiled)
    return {
        "step": step,
        "state": step.state,
        "row": {
            "policy": name,
            "temp_bytes": stats["temp_size_in_bytes"],
            "argument_bytes": stats["argument_size_in_bytes"],
            "compile_s": round(step.compile_s, 3),
            "lower_s": round(step.lower_s, 3),
            "residual_device_bytes": report["total_device_bytes"],
            "residual_host_bytes": report["total_host_bytes"],
            "program": step.program,
        },
    }


def _timed_rows(runs: dict, repeats: int, progress: Progress) -> list[dict]:
    """The policies take turns in timed rounds; each row gets its median step time and its
    ratios to the baseline."""
    times = time_in_rounds(
        {name: run["step"].stepper(run) for name, run in runs.items()},
        repeats,
        on_round=lambda r: say(progress, f"remat bench: timing round {r + 1}/{repeats}"),
    )
    base = runs[BASELINE]["row"]
    rows = []
    for name, run in runs.items():
        row = run["row"]
        row["step_ms"] = round(1e3 * statistics.median(times[name]), 3)
        row["step_ratio"] = round(median_ratio(times[name], times[BASELINE]), 4)
        row["temp_ratio"] = round(row["temp_bytes"] / base["temp_bytes"], 4) if base["temp_bytes"] else None
        row["loss"] = float(run["out"]["loss"])
        rows.append(_ordered(row))
    return rows


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
    return {**{k: row[k] for k in _KEY_ORDER}, **{k: v for k, v in row.items() if k not in _KEY_ORDER}}


def plot_remat(result: dict, path: str) -> str:
    """Scatter of compiled temp memory against step time, one labelled point per policy."""
    points = [(r["policy"], r["temp_bytes"] / 2**20, r["step_ms"]) for r in result["rows"]]
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


def _print_policies(args, result: dict) -> None:
    from zoo.ui import print_table

    chosen = (
        f"; budget {result['budget'] / 2**20:.1f} MiB: {result['chosen'] or 'nothing fits'}"
        if args.budget
        else ""
    )
    print_table(
        f"zoo bench remat {args.model} ({result['backend']}, {result['precision']}, L={result['num_layers']}, "
        f"batch {result['batch']}, seq {result['seq']}, {result['device']}, "
        f"median of {result['repeats']} rounds{chosen})",
        [
            "policy",
            "temp MiB",
            "temp/none",
            "step ms",
            "step/none",
            "compile s",
            "resid dev MiB",
            "resid host MiB",
        ],
        [
            (
                r["policy"] + (" <" if r["policy"] == result.get("chosen") else ""),
                _mib(r["temp_bytes"]),
                f"{r['temp_ratio']:.3f}",
                f"{r['step_ms']:.1f}",
                f"{r['step_ratio']:.2f}",
                f"{r['compile_s']:.2f}",
                _mib(r["residual_device_bytes"]),
                _mib(r["residual_host_bytes"]),
            )
            for r in result["rows"]
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
        type=int,
        default=None,
        help=f"batch size (default: 16 for transformer-s, else {FALLBACK_BATCH})",
    )
    p.add_argument(
        "--seq", type=int, default=None, help="sequence length (default: 128 for transformer-s, else max_len)"
    )
    p.add_argument("--layers", type=int, default=None, help="override num_layers")
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
        help="mark the policies whose step fits (temp + arguments), e.g. 256MiB, and the fastest "
        "of them: what zoo train --remat auto --memory-budget would choose",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_run_cli)
