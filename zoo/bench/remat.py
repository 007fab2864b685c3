"""``zoo bench remat``: every remat policy side by side on one model, in one process.

For each policy we build the same jitted AdamW train step (mean cross-entropy, params and
optimizer state donated), lower and compile it, read XLA's ``memory_analysis()`` temp bytes,
and ask the residual inspector (:mod:`zoo.residuals`) how many activation bytes the policy keeps
on device and on host. Then the policies take turns in timed rounds (one untimed and one timed
step each per round), so that all of them see the same machine load. Ratios are relative to
``none`` (always measured); the step ratio is the median over rounds of the per-round ratio.

With depths (``--depths 16,64``) the benchmark instead compiles the step at each depth
without running it, to show how temp memory and compile time grow with the layer count
(:func:`bench_depths`, :func:`compile_scaling`).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence

import jax

from zoo import bench
from zoo.api import example_batch, example_labels
from zoo.bench.common import (
    compile_timed,
    median_ratio,
    memory_stats,
    positive_int,
    scatter_plot,
    state_stepper,
    time_in_rounds,
    train_step,
)
from zoo.configs import add_model_flags, model_flag_overrides
from zoo.errors import ZooError
from zoo.models import canonical
from zoo.models.registry import check_backend, get_config
from zoo.remat import choose_under_budget, get_policy, parse_bytes, policy_names
from zoo.residuals import residual_report

BASELINE = "none"
# Bench shapes per preset: big enough that activations dominate, small enough that the whole
# default bench (8 policies) runs in a few minutes on two CPU cores.
DEFAULT_SHAPES = {"transformer-s": {"batch": 16, "seq": 128}}
FALLBACK_BATCH = 8

Progress = Callable[[str], None] | None


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


def parse_depths(depths: str | Sequence[int]) -> list[int]:
    if isinstance(depths, str):
        try:
            depths = [int(d) for d in depths.split(",") if d.strip()]
        except ValueError:
            raise ZooError(f"--depths must be comma-separated layer counts, got {depths!r}") from None
    depths = list(depths)
    if not depths or any(d <= 0 for d in depths):
        raise ZooError(f"depths must be positive layer counts, got {depths}")
    return depths


def _shape(model: str, cfg, batch: int | None, seq: int | None) -> tuple[int, int | None]:
    defaults = DEFAULT_SHAPES.get(model, {}) if isinstance(model, str) else {}
    batch = batch or defaults.get("batch", FALLBACK_BATCH)
    return batch, cfg.seq_or_default(seq or defaults.get("seq"))


def _config(model, num_layers: int | None, overrides: dict | None = None):
    return get_config(model, **(overrides or {}), **({"num_layers": num_layers} if num_layers else {}))


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


def _warm_up(cfg, backend: str, x, y, seed: int) -> None:
    """Compile one small step first, so that one-time start-up costs (XLA and JAX caches)
    are not charged to whichever policy happens to compile first."""
    step, optimizer = train_step(cfg, backend, "full")
    params = jax.eval_shape(lambda: canonical.init_params(cfg, seed))
    compile_timed(step, params, jax.eval_shape(optimizer.init, params), x[:1], y[:1])


def _warmed_inputs(model, cfg, backend: str, batch, seq, seed: int, progress, label: str):
    """The bench shape, an example batch and its labels, after the warm-up compile."""
    batch, seq = _shape(model, cfg, batch, seq)
    x = example_batch(cfg, batch, seed=seed, seq_len=seq)
    y = example_labels(cfg, x)
    _say(progress, f"{label}: warm-up compile")
    _warm_up(cfg, backend, x, y, seed)
    return batch, seq, x, y


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
) -> dict:
    """Compile, measure and time one train step per policy. See the module docstring.

    ``overrides`` are model config fields (``{"attention": "chunked", "mlp_chunk": 16}``); the
    preset's default bench shape still applies.

    With ``budget`` (bytes, or ``"256MiB"``), each row says whether its step ``fits`` (compiled
    temp plus arguments within it) and ``chosen`` is the fastest that does: the choice
    ``zoo train --remat auto --memory-budget`` makes, shown without training."""
    backend = check_backend(backend)
    cfg = _config(model, num_layers, overrides)
    names = parse_policies(policies)
    batch, seq, x, y = _warmed_inputs(model, cfg, backend, batch, seq, seed, progress, "remat bench")
    runs = {}
    for name in names:
        _say(progress, f"remat bench: compiling {name}")
        step, optimizer = train_step(cfg, backend, name)
        params = canonical.init_params(cfg, seed)
        opt_state = optimizer.init(params)
        compiled, lower_s, compile_s = compile_timed(step, params, opt_state, x, y)
        report = residual_report(cfg, name, backend=backend, batch=batch, seq=seq, seed=seed)
        runs[name] = {
            "compiled": compiled,
            "state": (params, opt_state),
            "row": {
                "policy": name,
                "temp_bytes": memory_stats(compiled)["temp_size_in_bytes"],
                "argument_bytes": memory_stats(compiled)["argument_size_in_bytes"],
                "compile_s": round(compile_s, 3),
                "lower_s": round(lower_s, 3),
                "residual_device_bytes": report["total_device_bytes"],
                "residual_host_bytes": report["total_host_bytes"],
            },
        }

    def stepper(run):
        def train(state, x, y):  # (params, opt_state) -> (params, opt_state), loss
            params, opt_state, loss = run["compiled"](*state, x, y)
            return (params, opt_state), loss

        return state_stepper(train, run, x, y)

    times = time_in_rounds(
        {name: stepper(run) for name, run in runs.items()},
        repeats,
        on_round=lambda r: _say(progress, f"remat bench: timing round {r + 1}/{repeats}"),
    )
    base = runs[BASELINE]["row"]
    rows = []
    for name, run in runs.items():
        row = run["row"]
        row["step_ms"] = round(1e3 * statistics.median(times[name]), 3)
        row["step_ratio"] = round(median_ratio(times[name], times[BASELINE]), 4)
        row["temp_ratio"] = round(row["temp_bytes"] / base["temp_bytes"], 4) if base["temp_bytes"] else None
        row["loss"] = float(run["out"])
        rows.append(row)
    result = {
        "model": model if isinstance(model, str) else cfg.kind,
        "backend": backend,
        "batch": batch,
        "seq": seq,
        "num_layers": cfg.num_layers,
        "repeats": repeats,
        "device": jax.devices()[0].platform,
        "rows": [_ordered(r) for r in rows],
    }
    if budget is not None:
        result["budget"] = parse_bytes(budget)
        result["chosen"], result["rows"] = choose_under_budget(result["rows"], result["budget"])
    if plot:
        result["plot"] = plot_remat(result, plot)
    return result


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
) -> dict:
    """Compile (without running) the train step at each depth for each policy.

    Rows: ``{policy, num_layers, temp_bytes, compile_s, lower_s, param_bytes,
    residual_device_bytes, residual_host_bytes}``. ``param_bytes`` is given because the
    gradient (one param-sized temp buffer) also grows with depth, whatever the policy. ``growth``: per policy, each figure at the deepest depth divided
    by the same figure at the shallowest.
    """
    backend = check_backend(backend)
    names = [get_policy(p).name for p in (policies.split(",") if isinstance(policies, str) else policies)]
    depths = parse_depths(depths)
    cfg0 = _config(model, None, overrides)
    batch, seq, x, y = _warmed_inputs(model, cfg0, backend, batch, seq, seed, progress, "remat depth sweep")
    rows = []
    for name in names:
        for depth in depths:
            _say(progress, f"remat depth sweep: {name} at L={depth}")
            cfg = _config(model, depth, overrides)
            step, optimizer = train_step(cfg, backend, name)
            params = jax.eval_shape(functools.partial(canonical.init_params, cfg, seed))
            opt_state = jax.eval_shape(optimizer.init, params)
            compiled, lower_s, compile_s = compile_timed(step, params, opt_state, x, y)
            row = {
                "policy": name,
                "num_layers": depth,
                "temp_bytes": memory_stats(compiled)["temp_size_in_bytes"],
                "argument_bytes": memory_stats(compiled)["argument_size_in_bytes"],
                "compile_s": round(compile_s, 3),
                "lower_s": round(lower_s, 3),
                # the gradient is a temp buffer of this size, and it grows with depth too
                "param_bytes": sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(params)),
            }
            if residuals:
                report = residual_report(cfg, name, backend=backend, batch=batch, seq=seq, seed=seed)
                row["residual_device_bytes"] = report["total_device_bytes"]
                row["residual_host_bytes"] = report["total_host_bytes"]
                row["groups"] = report["groups"]
                row["levels"] = report["levels"]
            rows.append(row)
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
    return {
        "model": model if isinstance(model, str) else cfg0.kind,
        "backend": backend,
        "batch": batch,
        "seq": seq,
        "depths": depths,
        "device": jax.devices()[0].platform,
        "rows": rows,
        "growth": growth,
    }


def compile_scaling(model, policies=None, depths=(4, 48), **kwargs) -> dict:
    """Compile time (and temp memory) of the train step at each depth, for every policy:
    :func:`bench_depths` with the policy list defaulting to all registered policies."""
    return bench_depths(model, policies=policies or policy_names(), depths=depths, **kwargs)


# --- CLI ---------------------------------------------------------------------------------------


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def _run_cli(args) -> int:
    from zoo.ui import emit_json, err_console, print_table

    progress = (
        None if args.quiet else (lambda m: err_console.print(m, style="dim", markup=False, highlight=False))
    )
    model, overrides = args.model, model_flag_overrides(args)
    if args.depths:
        policies = args.policies or "full,nested"
        result = bench_depths(
            model,
            policies=[p for p in policies.split(",") if p.strip()],
            depths=parse_depths(args.depths),
            backend=args.backend,
            batch=args.batch,
            seq=args.seq,
            progress=progress,
            overrides=overrides,
        )
        if args.json:
            emit_json(result)
            return 0
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
        return 0
    result = bench_remat(
        model,
        policies=args.policies,
        backend=args.backend,
        batch=args.batch,
        seq=args.seq,
        num_layers=args.layers,
        repeats=args.repeats,
        plot=args.plot,
        progress=progress,
        budget=args.budget,
        overrides=overrides,
    )
    if args.json:
        emit_json(result)
        return 0
    chosen = (
        f"; budget {result['budget'] / 2**20:.1f} MiB: {result['chosen'] or 'nothing fits'}"
        if args.budget
        else ""
    )
    print_table(
        f"zoo bench remat {args.model} ({result['backend']}, L={result['num_layers']}, "
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
    return 0


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
