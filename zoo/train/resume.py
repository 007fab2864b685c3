"""Resume is a continuation or a refusal.

A run directory's checkpoints carry the resolved recipe they were trained with. ``--resume``
compares it, field by field, with the recipe of the new command. Any difference that changes
the math (model, data, seed, optimizer, schedule, DP, freezing) is refused with the list of
differences: continuing would give a run that neither recipe describes, and a DP run would
report an epsilon it did not spend. What may change:

- ``train.remat``: a remat policy changes memory and speed, not the math (its gradients agree
  with no remat to rounding, ``tests/test_remat.py``);
- ``train.placement``: where the state waits between steps and where its update runs, not the
  math (the offloaded step and the host's update equal the on-device step, to rounding:
  ``tests/parallel/test_placement.py``, ``tests/parallel/test_host_step.py``);
- ``train.log_every``, ``train.eval_every``, ``train.checkpoint_every``: bookkeeping;
- ``description`` and ``device_memory`` (what a recipe is sized for);
- ``train.steps``, upward only. The learning-rate schedule and the DP noise multiplier keep
  the horizon the run was planned with (``plan_steps``), so the steps already taken stay the
  steps of the run being extended; a DP run's epsilon is accounted again over every step.

Resuming a finished run (same ``train.steps``) does nothing and leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zoo.errors import ZooError
from zoo.recipes import Recipe, parse_recipe, to_dict
from zoo.train import checkpoint, runlog

# Fields that may differ between the saved recipe and the resumed one (besides a longer
# train.steps). Everything else is compared.
FREE_FIELDS = (
    "description",
    "device_memory",  # what the recipe is sized for, not what a run computes
    "train.remat",
    "train.placement",
    "train.memory_budget",
    "train.log_every",
    "train.eval_every",
    "train.checkpoint_every",
    "train.tensorboard",
    # Where the run executes, not what it computes: a checkpoint restores onto any mesh.
    "mesh.data",
    "mesh.fsdp",
    "mesh.tensor",
)
STEPS = "train.steps"


def flat_recipe(recipe: Recipe) -> dict[str, object]:
    """The resolved recipe as ``{"section.field": value}`` (lists as lists), defaults filled."""
    flat: dict[str, object] = {}
    for key, value in to_dict(recipe).items():
        if isinstance(value, dict):
            flat.update({f"{key}.{field}": _plain(v) for field, v in value.items()})
        else:
            flat[key] = _plain(value)
    return flat


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def fingerprint(recipe: Recipe) -> str:
    """sha256 of every field that fixes the math of a run (all but the free fields and steps)."""
    math = {k: v for k, v in flat_recipe(recipe).items() if k not in FREE_FIELDS and k != STEPS}
    return hashlib.sha256(json.dumps(math, sort_keys=True).encode()).hexdigest()[:16]


def differences(saved: Recipe, new: Recipe, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """``["dp.epsilon: 8.0 -> 3.0", ...]`` for every field that differs, except ``ignore``."""
    a, b = flat_recipe(saved), flat_recipe(new)
    rows = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key) == b.get(key):
            continue
        rows.append(f"{key}: {_show(a.get(key))} -> {_show(b.get(key))}")
    return rows


def _show(value) -> str:
    return "unset" if value is None else json.dumps(value)


@dataclass(frozen=True)
class ResumePoint:
    """Where and how a resumed run continues."""

    step: int  # the checkpoint's step
    plan_steps: int  # the horizon of the schedule and of the DP noise calibration
    changes: tuple[str, ...]  # allowed differences, for the summary and the console
    meta: dict = field(default_factory=dict, compare=False)  # the checkpoint's metadata

    def finished(self, steps: int) -> bool:
        return self.step >= steps


def check_resume(meta: dict, recipe: Recipe, where: str) -> ResumePoint:
    """The resume point for ``recipe`` from a checkpoint's ``meta``, or a ZooError listing why not."""
    origin = meta.get("exported_from")
    if origin:  # `zoo export` writes params and metadata, no optimizer state or step keys
        raise ZooError(
            f"--resume: {where!r} is an export (of {origin.get('path')}, step {origin.get('step')}), "
            f"and an export has no training state to resume. Train from its weights with "
            f"--init-from {where}, or resume the run it came from"
        )
    if meta.get("hf_source"):  # `zoo import`: weights only, and a placeholder [data]
        raise ZooError(
            f"--resume: {where!r} is an import of the Hugging Face checkpoint "
            f"{meta['hf_source'].get('source')}, with no training state to resume. Train from it "
            f"with --init-from {where} and a new --out"
        )
    saved = parse_recipe(meta["recipe"], meta["recipe"].get("name", "recipe"))
    step = int(meta["step"])
    refused = differences(saved, recipe, ignore=(*FREE_FIELDS, STEPS))
    if refused:
        raise ZooError(
            f"--resume would change the run in {where!r}, whose checkpoints were trained with other "
            f"settings: {'; '.join(refused)}. Only train.remat, train.placement, the mesh, the log/eval/checkpoint cadence and a "
            "longer train.steps may change on resume; start a new run with another --out"
        )
    if recipe.train.steps < saved.train.steps:
        raise ZooError(
            f"--resume with train.steps={recipe.train.steps} would shorten the run in {where!r}, "
            f"planned for {saved.train.steps} steps (checkpoint at step {step}); train.steps may "
            "only grow on resume"
        )
    plan_steps = int(meta["plan_steps"])
    return ResumePoint(step=step, plan_steps=plan_steps, changes=tuple(differences(saved, recipe)), meta=meta)


def saved_root(out: Path, point: ResumePoint | None):
    """The root key data a DP run's checkpoint at ``point`` holds (``TrainState.rng``), or None
    (a fresh run, or one without DP). A resumed run is built with it (``build_run(root=...)``),
    so its sampler draws the batches the first run's did and its noise continues that run's."""
    if point is None or not point.meta.get("recipe", {}).get("dp", {}).get("enabled"):
        return None
    return checkpoint.restore_rng(out, point.step)


def check_same_root(root, restored) -> None:
    """Refuse to continue a DP run built with another root key than its checkpoint's: its
    sampler would draw other batches than the first run's (build it with
    ``build_run(..., root=saved_root(out, point))``)."""
    if root is not None and not np.array_equal(np.asarray(root), np.asarray(restored)):
        raise ValueError(
            "the run was built with another root key than its checkpoint holds, so it would draw "
            "other batches: build it with build_run(recipe, point.plan_steps, root=saved_root(out, point))"
        )


def check_run_dir(out: Path, resume: bool) -> None:
    """Refuse an ``--out`` that is a file, or that holds checkpoints when not resuming. Creates
    nothing: a run rejected later, for a bad setting, leaves no directory behind."""
    problem = runlog.dir_problem(out)
    if problem == "it is a file":
        raise ZooError(f"--out {str(out)!r} is a file, not a run directory; choose another --out")
    if problem:
        raise ZooError(f"--out {str(out)!r} cannot be written: {problem}; choose another --out")
    if not resume and checkpoint.saved_steps(out):
        raise ZooError(
            f"{str(out)!r} already holds checkpoints; pass --resume to continue that run or choose another --out"
        )


def preflight(out: Path, recipe: Recipe, resume: bool) -> ResumePoint | None:
    """Check the run directory before anything is built: the resume point of ``--resume``, None
    for a fresh run. Reads only; damaged steps are moved later, once the resume is accepted."""
    check_run_dir(out, resume)
    if not resume or not checkpoint.saved_steps(out):
        return None
    step = checkpoint.resolve_step(out)
    return check_resume(checkpoint.restore_meta(out, step), recipe, str(out))


def finished_summary(out: Path, point: ResumePoint | None, recipe: Recipe) -> dict | None:
    """``summary.json`` of a finished run, if it describes the checkpoint it ends on (same step,
    same fingerprint); None when the run must still train or summarize."""
    if point is None or not point.finished(recipe.train.steps):
        return None
    summary = runlog.read_summary(out)
    if (
        summary
        and summary.get("steps") == point.step
        and summary.get("fingerprint") == point.meta.get("fingerprint")
    ):
        return summary
    return None


def data_digest(arrays, key: bytes | None = None) -> str:
    """sha256 of the training arrays: the same recipe can read other data from the same path.
    With ``key`` (a DP run's secret root key) a keyed BLAKE2b instead: the digest travels in
    every checkpoint's metadata, and an unkeyed one would tell two neighbouring datasets apart
    with certainty."""
    digest = hashlib.sha256() if key is None else hashlib.blake2b(key=key[:64])
    for array in arrays:
        if array is not None:
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def dataset_digest(dataset, key: bytes | None = None) -> str:
    """What tells a run's training data from other data: a token store's digest (its files'
    checksums, taken when written: nothing is read), else :func:`data_digest` of the arrays
    (with each row's user under ``data.user_column``).
    With ``key`` (under DP) keyed, as :func:`data_digest` explains."""
    store = dataset.store
    if store is None:  # the users too: the same rows grouped otherwise are other users' data
        users = (dataset.users_train, dataset.segments_train)  # an lm's: each segment's user, bounds
        return data_digest((dataset.x_train, dataset.y_train, *users), key)
    if key is None:
        return store.digest
    return hashlib.blake2b(store.digest.encode(), key=key[:64]).hexdigest()[:16]


def check_store_unchanged(dataset, where: str) -> None:
    """On resume, read a token store's files again: refuse one whose bytes no longer match the
    checksums it was opened with (changed in place since the run started)."""
    if dataset.store is None:
        return
    try:
        dataset.store.verify()
    except ZooError as error:  # a DatasetError naming the file
        raise ZooError(
            f"--resume would continue {where!r} on other data than its checkpoints saw: {error}; "
            "start a new run with another --out"
        ) from None


def check_same_data(saved: dict, now: dict, where: str, *, arrays: bool = True) -> None:
    """Refuse to continue on other data: fitted model sizes, tokenizer or (``arrays``) training
    arrays."""
    problems = []
    if _json(saved["model"]) != _json(now["model"]):
        a, b = saved["model"]["config"], now["model"]["config"]
        problems += [
            f"model.{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
        ]
    if saved.get("tokenizer") != now.get("tokenizer"):
        problems.append("the tokenizer's vocabulary differs")
    if arrays and saved["data_digest"] != now["data_digest"]:
        problems.append(f"the training data differ (sha256 {saved['data_digest']} -> {now['data_digest']})")
    if problems:
        raise ZooError(
            f"--resume would continue {where!r} on other data than its checkpoints saw: "
            f"{'; '.join(problems)}; start a new run with another --out"
        )


def _json(value):
    return json.loads(json.dumps(value))
