"""``zoo audit``: a lower bound on a recipe's epsilon, measured from one run with canaries."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from zoo.commands.train import add_recipe_flags, resolve_recipe
from zoo.train.rundir import new_run_dir
from zoo.ui import console, emit_json, print_table, rate_text, stage_lines

MODES = ("whitebox", "blackbox")  # zoo.audit.MODES, without importing the training stack


def run_audit(args) -> int:
    from zoo.audit.report import audit
    from zoo.audit.run import check_request
    from zoo.train import runlock, runlog

    recipe = resolve_recipe(args)
    if args.unit is not None:  # as --set dp.unit=UNIT would
        from zoo.configs import UNITS
        from zoo.errors import choice_error
        from zoo.recipes import override

        if args.unit not in UNITS:
            raise choice_error("--unit", args.unit, UNITS)
        recipe = override(recipe, {"dp": {"unit": args.unit}})
    check_request(recipe, args.canaries, args.mode, args.confidence, args.no_noise)
    out = Path(args.out) if args.out else new_run_dir(f"audit-{recipe.name}")
    stage, steps, err = stage_lines(args.no_progress), recipe.train.steps, Console(stderr=True)
    # one run at a time in a folder, as for zoo train: two audits (or an audit and a training
    # run) into one --out would write each other's scores
    with runlock.hold(out), runlog.progress_bar(err, rate_unit="steps/s") as progress:
        bar = progress.add_task(
            f"audit {recipe.name}", total=steps, loss="-", rate="-", visible=not args.no_progress
        )

        start = time.perf_counter()

        def report(step: int, loss: float) -> None:
            rate = step / (time.perf_counter() - start)
            progress.update(bar, completed=step, loss=f"{loss:.4f}", rate=rate_text(rate))
            # off a terminal the bar shows only at its end: a line every tenth of the steps
            if stage and not err.is_terminal and (step % max(1, steps // 10) == 0 or step == steps):
                stage(f"audit: step {step}/{steps}, {rate:.2g} steps/s, loss {loss:.4f}")

        summary = audit(
            recipe,
            out,
            canaries=args.canaries,
            mode=args.mode,
            confidence=args.confidence,
            no_noise=args.no_noise,
            progress=report,
            stage=stage,
        )
    if args.json:
        emit_json(summary)
        return 0
    rows = [(k, f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in summary.items() if k != "bounds"]
    rows += [(f"lower bound ({name} score)", f"{value:.4g}") for name, value in summary["bounds"].items()]
    print_table(f"{args.mode} audit of {recipe.name}", ["metric", "value"], rows)
    console.print(f"scores and plot in {out}", markup=False, highlight=False)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "audit",
        help="train a recipe once with canaries and report a lower bound on its epsilon",
        description=(
            "Train RECIPE once with M canaries, each in the training set with probability 1/2, "
            "and report the claimed epsilon next to the empirical lower bound "
            "(jax_privacy.auditing, Steinke et al. 2023 one-run audit)."
        ),
    )
    add_recipe_flags(p)
    p.add_argument(
        "--canaries", type=int, default=1000, metavar="M", help="number of canaries (default 1000)"
    )
    p.add_argument(
        "--mode",
        default="whitebox",
        metavar="|".join(MODES),
        help="whitebox: gradient canaries in the DP step (default); blackbox: canary examples, "
        "scored by their loss drop",
    )
    p.add_argument(
        "--confidence", type=float, default=0.95, help="confidence of the lower bound (default 0.95)"
    )
    p.add_argument(
        "--no-noise",
        action="store_true",
        help="audit only: clip but add no noise (the claimed epsilon is infinite); shows the audit's power",
    )
    p.add_argument(
        "--unit",
        metavar="record|user",
        help="the privacy unit audited (default: the recipe's dp.unit): under user, each canary is "
        "a user holding dp.records_per_user records, and the bound is on the user-level epsilon",
    )
    p.add_argument("--out", metavar="DIR", help="where audit.json, scores.npz and scores.png go")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_audit)
