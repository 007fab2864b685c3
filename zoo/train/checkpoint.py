"""Checkpoints with orbax: step directories holding the training state, the full canonical
params, and JSON metadata (resolved recipe, model config, tokenizer), each verified by a
checksum manifest.

A LoRA run's steps hold only its adapters, and its metadata a reference to the base step it
adapts (directory, step, and the sha256 of that step's manifest): loading the run loads the
base too, and refuses a base that is gone or has changed since.

Orbax writes each step to a temporary directory and renames it when complete. After that,
``save`` writes ``zoo_manifest.json`` (size and sha256 of every file of the step) as the
step's last file, atomically (:mod:`zoo.train.manifest` reads and writes it). A step is
*intact* when its manifest exists and every file matches it: a run killed before the manifest
landed, a truncated file or a flipped byte all make the step damaged. Loading takes the newest intact step, and says so, naming both, when
it had to skip a damaged one; it never reads a damaged step. Every failure reaching a user is
one ``ZooError`` line naming the directory and what is wrong.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from zoo.data import CharTokenizer
from zoo.data.hf_tokenizer import tokenizer_from_json
from zoo.errors import ZooError
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import ModelConfig, config_from_dict
from zoo.recipes import Recipe, parse_recipe
from zoo.train.manifest import (  # noqa: F401 - the checkpoint API's names for steps and manifests
    CHECKPOINT_DIR,
    DAMAGED_DIR,
    MANIFEST,
    latest_step,
    saved_steps,
    sha256,
    step_problem,
    write_manifest,
)
from zoo.train.manifest import step_dir as _step_dir
from zoo.train.runlog import dir_problem
from zoo.train.save_guard import CheckpointWriteError, finish_before_interrupt, held_reports, os_cause

LORA_BASE = "lora_base"  # meta key of a LoRA run's base reference


def _manager(run_dir: Path, create: bool, item_handlers: dict | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, create=create, enable_async_checkpointing=False, cleanup_tmp_directories=create
    )
    return ocp.CheckpointManager(
        Path(run_dir).absolute() / CHECKPOINT_DIR, options=options, item_handlers=item_handlers
    )


def model_meta(cfg: ModelConfig, backend: str) -> dict:
    return {"kind": cfg.kind, "backend": backend, "config": dataclasses.asdict(cfg)}


def config_from_meta(meta: dict) -> ModelConfig:
    return config_from_dict(meta["kind"], meta["config"])


# --- Steps ----------------------------------------------------------------------------------


def resolve_step(run_dir: Path, step: int | None = None) -> int:
    """The step to load: ``step`` if intact, else the newest intact step, with a warning naming
    each damaged step skipped (:func:`quarantine_after` moves them out of a run's way)."""
    where = str(run_dir)
    steps = saved_steps(run_dir)
    if not steps:
        hf = (Path(run_dir) / "config.json").is_file()  # a Hugging Face checkpoint folder
        raise ZooError(
            f"no checkpoint under {where!r}: expected {CHECKPOINT_DIR}/<step>/ written by `zoo train "
            "--out DIR`, or by `zoo import SRC --out DIR` (a Hugging Face checkpoint, ORG/NAME or a folder)"
            + (
                f"; it is a Hugging Face folder: use hf:{where}, or `zoo import {where} --out DIR`"
                if hf
                else ""
            )
        )
    if step is not None and step not in steps:
        raise ZooError(f"no step {step} in {where!r}; saved steps: {steps}")
    damaged = []
    for candidate in [step] if step is not None else reversed(steps):
        problem = step_problem(run_dir, candidate)
        if problem is None:
            break
        damaged.append(f"step {candidate}: {problem}")
    else:
        raise ZooError(f"no intact checkpoint in {where!r}: {'; '.join(damaged)}")
    if damaged:
        warnings.warn(
            f"checkpoint {damaged[0].split(':')[0]} in {where!r} is damaged ({'; '.join(damaged)}); "
            f"using step {candidate}, the newest intact one",
            RuntimeWarning,
            stacklevel=2,
        )
    return candidate


def quarantine_after(run_dir: Path, step: int) -> None:
    """Move the step directories newer than ``step`` (the newest intact one, so all of them are
    damaged) to ``run_dir/damaged-checkpoints/``: kept, and out of the way of the next saves."""
    newer = [s for s in saved_steps(run_dir) if s > step]
    if not newer:
        return
    target = Path(run_dir) / DAMAGED_DIR
    target.mkdir(exist_ok=True)
    for damaged in newer:
        dest, n = target / str(damaged), 1
        while dest.exists():
            dest, n = target / f"{damaged}-{n}", n + 1
        shutil.move(str(_step_dir(run_dir, damaged)), dest)
    warnings.warn(
        f"moved damaged checkpoint steps {newer} of {str(run_dir)!r} to {str(target)!r}",
        RuntimeWarning,
        stacklevel=2,
    )


def _params_restore(run_dir: Path, step: int):
    """Restore params onto this process's first device, whatever mesh wrote them: without a
    target, orbax would rebuild the writer's sharding and refuse another topology."""
    from etils import epath

    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    try:
        tree = ocp.StandardCheckpointHandler().metadata(epath.Path(_step_dir(run_dir, step) / "params"))
    except Exception:  # unreadable: let the restore itself report it, in one ZooError line
        return ocp.args.StandardRestore()
    target = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device), getattr(tree, "tree", tree)
    )
    return ocp.args.StandardRestore(target)


def _restore(run_dir: Path, step: int, **items):
    try:
        with _manager(run_dir, create=False) as manager:
            return manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # orbax, tensorstore and json all raise their own types
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ZooError(
            f"checkpoint step {step} in {str(run_dir)!r} could not be read: {type(error).__name__}: {first}"
        ) from None


# --- Save and load --------------------------------------------------------------------------


def save(run_dir: Path, step: int, state, params: dict, meta: dict, *, compress: bool = True) -> None:
    """Write step ``step`` of a run: ``state`` (None for an export, which cannot be resumed),
    ``params`` and ``meta``, then its manifest.

    ``compress=False`` writes ``params`` without zstd (the same layout; every reader reads
    both): tensorstore then writes from the arrays' own memory instead of holding a compressed
    copy of each, which keeps ``zoo import`` near one copy of the weights
    (benchmarks/hf/import_memory.py)."""
    main = jax.process_index() == 0  # orbax writes from every process; zoo's files from one
    problem = dir_problem(run_dir) if main and not os.path.isdir(run_dir) else None
    if problem:  # `zoo export --out`: checked here, where the export first writes
        raise ZooError(f"--out {str(run_dir)!r} cannot be written: {problem}; choose another --out")
    items = {
        "params": ocp.args.StandardSave(params),
        "meta": ocp.args.JsonSave({**meta, "step": step}),
    }
    if state is not None:
        items["state"] = ocp.args.StandardSave(state)
    handlers = None
    if not compress:
        items["params"] = ocp.args.PyTreeSave(params)
        handlers = {
            "params": ocp.PyTreeCheckpointHandler(use_compression=False),
            "meta": ocp.JsonCheckpointHandler(),
        }
        if state is not None:
            handlers["state"] = ocp.StandardCheckpointHandler()
    with finish_before_interrupt():
        try:
            with held_reports(f"{_step_dir(run_dir, step)}.orbax-checkpoint-tmp"):
                with _manager(run_dir, create=True, item_handlers=handlers) as manager:
                    manager.save(step, args=ocp.args.Composite(**items), force=True)
                    manager.wait_until_finished()
                if main:
                    write_manifest(_step_dir(run_dir, step))
        except Exception as error:
            if main:
                _remove_unfinished(run_dir, step)
            cause = os_cause(error)
            if cause is None:  # not the disk: a bug, with its traceback
                raise
            where = str(_step_dir(run_dir, step).parent)
            raise CheckpointWriteError(
                f"checkpoint step {step} could not be written in {where!r}: {cause}"
            ) from None


def _remove_unfinished(run_dir: Path, step: int) -> None:
    """Remove what a failed write of ``step`` left: orbax's temporary folder and a step
    without its manifest (the manifest is written last: a step without one is not intact)."""
    root = _step_dir(run_dir, step).parent
    for left in root.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(left, ignore_errors=True)
    if step in saved_steps(run_dir) and not (_step_dir(run_dir, step) / MANIFEST).exists():
        shutil.rmtree(_step_dir(run_dir, step), ignore_errors=True)


def restore_meta(run_dir: Path, step: int) -> dict:
    """The JSON metadata saved with ``step``: resolved recipe, model, tokenizer, step."""
    return _restore(run_dir, step, meta=ocp.args.JsonRestore())["meta"]


def restore_params(run_dir: Path, step: int) -> dict:
    """The full canonical params (trainable and frozen) saved with ``step``; a LoRA run's
    adapters come with the weights of its base."""
    restored = _restore(run_dir, step, params=_params_restore(run_dir, step), meta=ocp.args.JsonRestore())
    return _with_base(restored["params"], restored["meta"], run_dir)


# --- A LoRA run's base ----------------------------------------------------------------------


def _manifest_sha(run_dir: Path, step: int) -> str:
    return sha256(_step_dir(run_dir, step) / MANIFEST)


def base_reference(source: Checkpoint) -> dict:
    """What a LoRA run records of the base checkpoint it adapts."""
    return {
        "path": str(source.path.absolute()),
        "step": source.step,
        "manifest_sha256": _manifest_sha(source.path, source.step),
    }


def _with_base(params: dict, meta: dict, run_dir: Path) -> dict:
    ref = meta.get(LORA_BASE)
    if not ref:
        return params
    base_dir, step = Path(ref["path"]), int(ref["step"])
    where = f"the base of the LoRA run {str(run_dir)!r}, step {step} of {str(base_dir)!r},"
    problem = step_problem(base_dir, step) if step in saved_steps(base_dir) else "it is not there"
    if problem is None and _manifest_sha(base_dir, step) != ref["manifest_sha256"]:
        problem = "it was written again since the LoRA run started (its manifest changed)"
    if problem is not None:
        raise ZooError(f"{where} cannot be used: {problem}")
    base = _restore(base_dir, step, params=_params_restore(base_dir, step))["params"]
    return nest_by_path({**flat_by_path(base), **flat_by_path(params)})


def restore_state(run_dir: Path, step: int, abstract_state):
    """The training state saved at ``step``, in the structure of ``abstract_state``."""
    target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
    return _restore(run_dir, step, state=ocp.args.StandardRestore(target))["state"]


def restore_rng(run_dir: Path, step: int) -> jax.Array:
    """The root key data (``TrainState.rng``) saved at ``step``, read alone: a resumed DP run
    is built with it (zoo.train.resume.saved_root)."""
    from etils import epath

    path = epath.Path(_step_dir(run_dir, step) / "state")
    try:
        saved = ocp.PyTreeCheckpointHandler().metadata(path)
        rng = getattr(saved, "tree", saved)["rng"]
        target = {"rng": jax.ShapeDtypeStruct(tuple(rng.shape), rng.dtype)}
        restore = ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        )
        with ocp.PyTreeCheckpointer() as reader:
            return reader.restore(path, args=restore)["rng"]
    except Exception as error:  # orbax and tensorstore raise their own types
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ZooError(
            f"checkpoint step {step} in {str(run_dir)!r} could not be read: {type(error).__name__}: {first}"
        ) from None


@dataclass(frozen=True)
class Checkpoint:
    """A saved run: canonical ``params``, the resolved ``recipe`` dict, model config, tokenizer."""

    path: Path
    step: int
    params: dict
    recipe: Recipe
    model_config: ModelConfig
    backend: str
    tokenizer: CharTokenizer | None


def load_checkpoint(run_dir: str | Path, step: int | None = None) -> Checkpoint:
    """Load the newest intact (or the given) checkpoint of a run directory written by ``zoo train``."""
    run_dir = Path(run_dir)
    step = resolve_step(run_dir, step)
    restored = _restore(run_dir, step, params=_params_restore(run_dir, step), meta=ocp.args.JsonRestore())
    meta = restored["meta"]
    tokenizer = meta.get("tokenizer")
    return Checkpoint(
        path=run_dir,
        step=step,
        params=_with_base(restored["params"], meta, run_dir),
        recipe=parse_recipe(meta["recipe"]),
        model_config=config_from_meta(meta["model"]),
        backend=meta["model"]["backend"],
        tokenizer=tokenizer_from_json(tokenizer) if tokenizer else None,  # or a tokenizer.json
    )
