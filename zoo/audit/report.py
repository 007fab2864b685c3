"""``audit``: plan, train, score and write an audit's files (the CLI's engine room)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from zoo.audit.run import check_request, plan_audit, train_with_canaries
from zoo.audit.score import METHOD, blackbox_scores, lower_bounds, whitebox_scores
from zoo.dp.groups import style_summary
from zoo.recipes import Recipe

RESULT = "audit.json"
SCORES = "scores.npz"
PLOT = "scores.png"


def audit(
    recipe: Recipe,
    out_dir: str | Path,
    *,
    canaries: int = 1000,
    mode: str = "whitebox",
    confidence: float = 0.95,
    no_noise: bool = False,
    progress=None,
    tamper=None,
    plot: bool = True,
    stage=None,
) -> dict:
    """Train ``recipe`` once with ``canaries`` canaries and return the audit's summary.

    ``progress(step, loss)`` is called after every step, ``stage(message)`` as each part
    (planning, training, scoring, writing) starts. ``tamper(engine) -> engine``
    replaces the planned training engine; tests use it to plant known bugs in the DP step
    (no recipe or flag reaches it).
    """
    check_request(recipe, canaries, mode, confidence, no_noise)
    _say(stage, f"audit: building the run of {recipe.name} with {canaries} canaries (data, DP plan, engine)")
    plan = plan_audit(recipe, canaries, mode, no_noise)
    _say(stage, f"audit: training {plan.steps} steps (the first one compiles)")
    trace = train_with_canaries(plan, progress, tamper(plan.engine) if tamper else None)
    _say(stage, f"audit: scoring the canaries ({mode})")
    if mode == "whitebox":
        scores = whitebox_scores(trace.projections)
    else:
        scores = blackbox_scores(trace.loss_before, trace.loss_after)
    bounds = lower_bounds(scores, plan.included, confidence, recipe.dp.delta)
    out = Path(out_dir)
    _say(stage, f"audit: writing {RESULT}, {SCORES}" + (f" and {PLOT}" if plot else "") + f" to {out}")
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out / SCORES,
        included=plan.included,
        sampled=trace.sampled,
        **{f"score_{name}": values for name, values in scores.items()},
        **({"projections": trace.projections} if trace.projections is not None else {}),
    )
    summary = {
        "recipe": recipe.name,
        "mode": mode,
        "canaries": canaries,
        **canary_unit(plan),
        "confidence": confidence,
        "epsilon_claimed": plan.epsilon_claimed,
        **claim_parts(plan),
        "epsilon_lower_bound": max(bounds.values()),
        "delta": recipe.dp.delta,
        "steps": plan.steps,
        "method": METHOD,
        "bounds": bounds,
        "included": int(plan.included.sum()),
        "sampling_prob": plan.sampler.sampling_prob if plan.sampler else None,
        "noise_multiplier": plan.engine.dp.noise_multiplier if plan.engine.dp else None,
        "clipping_style": clipping_of(plan.engine),  # which style ran, its group thresholds
        "mean_times_sampled": float(trace.sampled[plan.included].mean()),
        "compile_count": trace.compile_count,
        "out_dir": str(out),
    }
    if plot:
        summary["plot"] = histogram(out / PLOT, scores, plan.included, summary)
    (out / RESULT).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def clipping_of(engine) -> dict | None:
    """The clipping style the audited step ran (:func:`zoo.dp.groups.style_summary`)."""
    dp = engine.dp
    return None if dp is None else style_summary(dp.clip_style, engine.freeze, dp.clip_norm)


def _say(stage, message: str) -> None:
    if stage is not None:
        stage(message)


def canary_unit(plan) -> dict:
    """What one canary is: a record, or (``dp.unit = "user"``) a user holding
    ``records_per_user`` records; the bound is on the epsilon of that unit."""
    unit = plan.recipe.dp.unit if plan.recipe.dp.enabled else "record"
    return {"unit": unit, "records_per_canary": plan.records_per_canary}


def claim_parts(plan) -> dict:
    """What the claim is made of. With a DP-PCA projection (``data.dp_pca``) the run's epsilon
    composes the projection's release with DP-SGD's steps; the canaries pass only through the
    steps, so the bound is compared with ``epsilon_sgd`` (``epsilon_claimed``), and the run's
    composed ``epsilon`` and the projection's ``epsilon_pca`` are reported beside it."""
    privacy = plan.privacy or {}
    return {
        "projection_fitted": plan.projection_fitted,
        "epsilon_run": privacy.get("epsilon"),
        "epsilon_sgd": privacy.get("epsilon_sgd", privacy.get("epsilon")),
        "epsilon_pca": privacy.get("epsilon_pca"),
    }


def histogram(path: Path, scores: dict[str, np.ndarray], included: np.ndarray, summary: dict) -> str:
    """Score histograms of included vs excluded canaries, one panel per score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scores), figsize=(5.2 * len(scores), 3.6), dpi=110, squeeze=False)
    for ax, (name, values) in zip(axes[0], scores.items(), strict=True):
        bins = np.histogram_bin_edges(values, bins=40)
        ax.hist(values[~included], bins=bins, alpha=0.6, label="excluded")
        ax.hist(values[included], bins=bins, alpha=0.6, label="included")
        ax.set_title(f"{name}: eps >= {summary['bounds'][name]:.2f}", fontsize=10)
        ax.set_xlabel("score")
        ax.legend(fontsize=8)
    claimed = summary["epsilon_claimed"]
    claim = "no noise" if math.isinf(claimed) else f"claimed eps {claimed:.2f}"
    fig.suptitle(
        f"{summary['recipe']} {summary['mode']} audit, {summary['canaries']} canaries, {claim}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
