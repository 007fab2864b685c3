"""``zoo bench dp``: what DP-SGD costs, every implementation side by side in one process.

Each row is one full jitted train step on the same model, the same initial params and the
same batch of B examples: gradients, then an SGD-with-momentum update (state donated). The
rows differ only in how the gradient is made:

``non-private``       the engine's ordinary step: gradient of the mean loss.
``zoo vmap``          the engine's DP step: :func:`zoo.dp.clipped_grad_sum` with all B
                      per-example gradients at once (``microbatch_size=None``), then
                      :func:`zoo.dp.privatize` (Gaussian noise, divide by the expected batch).
``zoo microbatch k``  the same with ``microbatch_size=k``: B / k microbatches under the one loop.

``--microbatch K`` (``microbatch=K``) benches a logical batch of B examples taken K at a time:
every zoo row is the engine's DP step with ``train.microbatch_size = K`` (one scan accumulates
the clipped sums, the noise is added once: :mod:`zoo.microbatch`) and the non-private row
accumulates its gradient over the same microbatches; other libraries' rows take the whole
batch, so they run only when named. ``--precision``, ``--remat``: every row's (docs/dp-mechanisms.md).
``jax_privacy``       ``jax_privacy.clipping.clipped_grad``'s clipped sum, the same ``privatize``.
``optax dpsgd``       ``jax.vmap(jax.grad)`` per-example gradients fed to ``optax.contrib.dpsgd``
                      (it clips, sums, adds noise and does SGD with momentum itself).
``ghost``             the engine's DP step with ghost clipping (``zoo.dp.ghost``): per-example
                      norms without per-example gradients, by the method ``auto`` picks (the
                      row's label names it: book-keeping, second backward, or vmap fallback).
``ghost backward``    ghost clipping by its second backward whatever the policy (opt-in ``ghost
                      bookkeeping``: by book-keeping); ``ghost layer-wise``: the engine's ghost
                      step, ``dp.clipping_style = "layer-wise"``. ``program``: the compiled
                      program's digest (equal digests: one program).

For every row we report the median step time and XLA's compiled temporary memory
(``memory_analysis().temp_size_in_bytes``), each also as a ratio to ``non-private``. Timing
runs the rows in interleaved rounds so that all of them see the same machine load; the step
ratio is the median over rounds of the row's time over the non-private time of that round.
Within a round a row takes one untimed step before its timed ones, so it is not charged for
the caches the previous row evicted.

A second table compiles (not runs) the DP step at microbatch sizes k and two batch sizes.

Adding a method: :func:`register_method` a ``builder(setup) -> (step, optimizer)``, ``step(state,
frozen, batch) -> (state, metrics)`` pure, for ``jax.jit``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Sequence

import jax

from zoo import bench
from zoo.bench import dp_rows
from zoo.bench.common import median_ratio, positive_int, state_stepper, time_in_rounds
from zoo.bench.dp_flops import flop_rows, print_flops, unrolled_stack
from zoo.bench.dp_forms import add_forms_arguments, forms_table, print_forms
from zoo.bench.dp_rows import (  # noqa: F401  (re-exported: the bench API)
    BASELINE,
    CLIP,
    GHOST,
    LR,
    MOMENTUM,
    SIGMA,
    Setup,
    Step,
    check_microbatch,
    compile_rows,
    compile_step,
    default_methods,
    fresh_state,
    methods,
    microbatch_sweep,
    register_method,
    setup_for,
    setup_from,
    synthetic_batch,
)
from zoo.errors import ZooError, choice_error
from zoo.models.registry import ModelConfig, check_backend, get_config
from zoo.precision import PRECISIONS, get_precision
from zoo.remat import get_policy, policy_names
from zoo.train import stages

# Bench batch per preset: big enough that per-example gradients dominate the DP step, small
# enough that the whole bench stays quick on a CPU.
DEFAULT_BATCH = {
    "mlp-s": 256,
    "mlp-m": 256,
    "mlp-mnist": 64,
    "transformer-digits": 128,
    "transformer-xs": 32,
    "transformer-s": 16,
}
FALLBACK_BATCH = 64

Progress = Callable[[str], None] | None


def _say(progress: Progress, message: str) -> None:
    None if progress is None else progress(message)


def _config(model: str | ModelConfig | stages.Start, batch: int | None, seq: int | None):
    cfg = model.cfg if isinstance(model, stages.Start) else get_config(model)
    name = model if isinstance(model, str) else None
    batch = batch or DEFAULT_BATCH.get(name, FALLBACK_BATCH)
    if batch < 1:
        raise ZooError(f"--batch must be a positive int, got {batch}")
    return cfg, batch, cfg.seq_or_default(seq)


_batch, _check_microbatch = synthetic_batch, check_microbatch  # the names benchmarks/ use


def _options(precision: str, remat: str, microbatch: int | None, batch: int) -> dict:
    """:func:`setup_from`'s options, each checked: a ZooError naming the valid values."""
    try:
        get_policy(remat)
        precision = get_precision(precision)
    except ValueError as error:
        raise ZooError(str(error)) from None
    step = None if microbatch is None else check_microbatch(microbatch, batch)
    return {"remat": remat, "precision": precision, "step_microbatch": step}


def bench_dp(
    model: str | ModelConfig | stages.Start,
    backend: str = "nnx",
    batch: int | None = None,
    seq: int | None = None,
    microbatch: int | None = None,
    sweep: Sequence[int] | None = None,
    memory_sweep: bool = True,
    methods: Sequence[str] | None = None,
    freeze: Sequence[str] = (),
    rounds: int = 11,
    steps_per_round: int = 3,
    seed: int = 0,
    progress: Progress = None,
    precision: str = "float32",
    remat: str = "none",
    forms: str | None = None,
    forms_only: bool = False,
    flops: bool = False,
) -> dict:
    """Measure every method (see the module docstring) and the microbatch memory sweep.

    ``model`` is a preset, a config, or a model start of the run stages (a recipe's,
    :func:`zoo.train.stages.model_start`: its params and freeze plan; ``freeze`` and ``seed``'s
    params then do not apply). ``microbatch``: every row takes the batch that many examples at
    a time (the module docstring); None: whole, and the ``zoo microbatch`` row's k is B/8.
    ``sweep`` (the k values of the memory table) defaults to B/32, B/8, B/2, each compiled at
    batch B and 2B. ``precision`` and ``remat`` are every row's policies. ``forms``
    (``"formula"``, ``"measure"``; :mod:`zoo.bench.dp_forms`) adds ghost clipping's norm form per
    dense site, ``forms_only`` returns that table alone; ``flops``: every row compiled, not run,
    with XLA's counted FLOPs (:mod:`zoo.bench.dp_flops`).
    """
    backend = check_backend(backend)
    cfg, batch, seq = _config(model, batch, seq)
    options = _options(precision, remat, microbatch, batch)
    microbatch = check_microbatch(microbatch or max(1, batch // 8), batch)
    rows = dp_rows.methods()  # the table as it is now
    names = list(methods) if methods else default_methods(options["step_microbatch"] is not None)
    if BASELINE not in names:
        names.insert(0, BASELINE)
    for name in names:
        if name not in rows:
            raise choice_error("dp bench method", name, rows)
    if isinstance(model, stages.Start):
        if freeze:
            raise ValueError(
                f"freeze patterns {list(freeze)} apply to a preset; a model start has its freeze plan"
            )
        setup, params = setup_from(model, backend, batch, microbatch, **options)
    else:
        setup, params = setup_for(cfg, backend, batch, microbatch, freeze, seed, **options)
    data = jax.device_put(_batch(cfg, batch, seq, seed))
    table = forms_table(forms, setup, params, data, progress)
    if forms_only:
        return {"model": model if isinstance(model, str) else cfg.kind, "forms": table}

    with unrolled_stack() if flops else contextlib.nullcontext():
        runs = compile_rows(names, rows, setup, params, data, seed, progress)
    if flops:
        name = model if isinstance(model, str) else cfg.kind
        return {"model": name, "batch": batch, "seq": seq, "rows": flop_rows(runs, BASELINE)}

    rows = _timed_rows(runs, data, microbatch, rounds, steps_per_round, progress)
    result = {
        "model": model if isinstance(model, str) else cfg.kind,
        "backend": backend,
        "batch": batch,
        "seq": seq,
        "microbatch": microbatch,
        "step_microbatch": options["step_microbatch"],  # --microbatch: every row's; None: whole
        "precision": options["precision"].name,
        "remat": remat,
        "trainable_params": setup.engine.freeze.trainable_count,
        "frozen_params": setup.engine.freeze.frozen_count,
        "device": jax.devices()[0].platform,
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "rows": rows,
    }
    if table is not None:
        result["forms"] = table
    if memory_sweep:
        known = {(batch, None): runs["zoo vmap"]["temp"]} if "zoo vmap" in runs else {}
        if "zoo microbatch" in runs:
            known[(batch, microbatch)] = runs["zoo microbatch"]["temp"]
        result["microbatch_sweep"] = microbatch_sweep(
            setup, params, cfg, seq, sweep, seed, progress, known=known
        )
    return result


def _timed_rows(runs: dict, data, microbatch: int, rounds: int, steps_per_round: int, progress) -> list:
    """The compiled rows take turns in timed rounds; each gets its median step time and its
    ratios to the non-private row."""
    times = time_in_rounds(
        {name: state_stepper(run["compiled"], run, run["frozen"], data) for name, run in runs.items()},
        rounds,
        steps_per_round,
        on_round=lambda r: _say(progress, f"dp bench: timing round {r + 1}/{rounds}"),
    )
    base_temp = runs[BASELINE]["temp"]
    rows = []
    for name, run in runs.items():
        step_ms = 1e3 * statistics.median(times[name])
        ratio = median_ratio(times[name], times[BASELINE])
        label = f"zoo microbatch k={microbatch}" if name == "zoo microbatch" else name
        rows.append(
            {
                "method": label,
                "ran": run["ran"],  # a ghost row: what its step runs (book-keeping, ...)
                "program": run["program"],
                "step_ms": round(step_ms, 3),
                "step_ratio": round(ratio, 3),
                "temp_bytes": run["temp"],
                "temp_ratio": round(run["temp"] / base_temp, 3) if base_temp else None,
                "compile_s": round(run["compile_s"], 3),
                "round_ms": [round(1e3 * t, 3) for t in times[name]],  # per round: for other ratios
            }
        )
    return rows


# ----------------------------------------------------------------------------- CLI


_mib = "{:.2f}".format  # of n / 2**20


def _run_cli(args) -> int:
    from zoo.bench.common import int_list
    from zoo.ui import emit_json, err_console, print_table

    progress = (
        None if args.quiet else (lambda m: err_console.print(m, style="dim", markup=False, highlight=False))
    )
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
    result = bench_dp(
        args.model,
        backend=args.backend,
        batch=args.batch,
        seq=args.seq,
        microbatch=args.microbatch,
        sweep=int_list(args.sweep),
        memory_sweep=not args.no_sweep,
        methods=methods,
        freeze=args.freeze or (),
        rounds=args.rounds,
        steps_per_round=args.steps,
        progress=progress,
        precision=args.precision,
        remat=args.remat,
        forms=args.forms or ("formula" if args.forms_only else None),
        forms_only=args.forms_only,
        flops=args.flops,
    )
    if args.json:
        emit_json(result)
        return 0
    if "forms" in result:
        print_forms(result["forms"], f"ghost clipping: norm form per dense site ({args.forms or 'formula'})")
    if args.forms_only:
        return 0
    if args.flops:
        title = f"zoo bench dp {result['model']} (batch {result['batch']} x {result['seq']}): XLA's counted FLOPs, compile only"
        print_flops(result, title)
        return 0
    seq = f" x {result['seq']}" if result["seq"] else ""
    micro = f" in microbatches of {result['step_microbatch']}" if result["step_microbatch"] else ""
    print_table(
        f"zoo bench dp {result['model']} ({result['backend']}, batch {result['batch']}{seq}{micro}, "
        f"{result['precision']}, remat {result['remat']}, {result['device']}; "
        f"median of {result['rounds']} rounds)",
        ["method", "step ms", "step x", "temp MiB", "temp x", "compile s", "program"],
        [
            (
                f"{r['method']} ({r['ran']})" if r["ran"] else r["method"],
                f"{r['step_ms']:.2f}",
                f"{r['step_ratio']:.2f}",
                _mib(r["temp_bytes"] / 2**20),
                f"{r['temp_ratio']:.2f}" if r["temp_ratio"] is not None else "-",
                f"{r['compile_s']:.1f}",
                r["program"],
            )
            for r in result["rows"]
        ],
    )
    if "microbatch_sweep" in result:
        print_table(
            "DP step compiled temp memory (MiB) by microbatch size k (compile only)",
            ["batch", "k", "temp MiB"],
            [
                (
                    r["batch"],
                    f"{r['microbatch']}{' (all, vmap)' if r['vmap_all'] else ''}",
                    _mib(r["temp_bytes"] / 2**20),
                )
                for r in result["microbatch_sweep"]
            ],
        )
    return 0


def add_bench(bench_sub) -> None:
    bench.register("dp", bench_dp)
    p = bench_sub.add_parser(
        "dp",
        help="DP-SGD step cost: ours (vmap, microbatched), jax_privacy, optax dpsgd",
        description="Time and compile one train step per DP-SGD implementation (ratios to the "
        "non-private step), then the DP step's temp memory by microbatch size.",
    )
    p.add_argument("model", help="model preset, e.g. mlp-s, transformer-digits")
    p.add_argument("--backend", default="nnx", choices=["nnx", "eqx"])
    p.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        help=f"batch size (default per preset, e.g. 256 for mlp-s; else {FALLBACK_BATCH})",
    )
    p.add_argument("--seq", type=positive_int, default=None, help="sequence length (default: max_len)")
    p.add_argument(
        "--microbatch",
        type=int,
        default=None,
        metavar="K",
        help="every row takes the batch K examples at a time (train.microbatch_size; the non-private "
        "row accumulates its gradient); default: the whole batch, and the zoo microbatch row at B/8",
    )
    p.add_argument("--precision", default="float32", choices=PRECISIONS, help="every row's precision policy")
    p.add_argument(
        "--remat",
        default="none",
        help=f"every row's remat policy: {', '.join(policy_names())} (default none)",
    )
    add_forms_arguments(p)
    p.add_argument(
        "--flops",
        action="store_true",
        help="compile every row (stack unrolled) and print XLA's FLOPs; run none",
    )
    p.add_argument(
        "--sweep",
        default=None,
        metavar="K1,K2,K3",
        help="microbatch sizes of the memory table (default B/32,B/8,B/2)",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the microbatch memory table")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated subset of: {', '.join(methods())} (non-private always runs)",
    )
    p.add_argument(
        "--freeze",
        action="append",
        metavar="PATTERN",
        help="freeze canonical params matching PATTERN (repeatable)",
    )
    p.add_argument("--rounds", type=positive_int, default=11, help="timed rounds (medians are reported)")
    p.add_argument("--steps", type=positive_int, default=3, help="steps per timed round")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_run_cli)


def main(argv: list[str] | None = None) -> int:
    """``python -m zoo.bench.dp MODEL ...``: the same as ``zoo bench dp MODEL ...``."""
    parser = argparse.ArgumentParser(prog="zoo bench")
    add_bench(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["dp", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
