"""Checkpoints with orbax: atomic step directories holding the training state, the full
canonical params, and JSON metadata (resolved recipe, model config, tokenizer).

Orbax writes each step to a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from zoo.configs import MLPConfig, ModelConfig, TransformerConfig
from zoo.data import CharTokenizer
from zoo.errors import ZooError
from zoo.recipes import Recipe, parse_recipe

CHECKPOINT_DIR = "checkpoints"
_CONFIG_CLASSES = {"mlp": MLPConfig, "transformer": TransformerConfig}


def _manager(run_dir: Path, create: bool) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=2, create=create, enable_async_checkpointing=False)
    return ocp.CheckpointManager(Path(run_dir).absolute() / CHECKPOINT_DIR, options=options)


def model_meta(cfg: ModelConfig, backend: str) -> dict:
    return {"kind": cfg.kind, "backend": backend, "config": dataclasses.asdict(cfg)}


def config_from_meta(meta: dict) -> ModelConfig:
    return _CONFIG_CLASSES[meta["kind"]](**meta["config"])


def save(run_dir: Path, step: int, state, params: dict, meta: dict) -> None:
    with _manager(run_dir, create=True) as manager:
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                params=ocp.args.StandardSave(params),
                meta=ocp.args.JsonSave({**meta, "step": step}),
            ),
            force=True,
        )
        manager.wait_until_finished()


def latest_step(run_dir: Path) -> int | None:
    if not (Path(run_dir) / CHECKPOINT_DIR).exists():
        return None
    with _manager(run_dir, create=False) as manager:
        return manager.latest_step()


def restore_state(run_dir: Path, step: int, abstract_state):
    """The training state saved at ``step``, in the structure of ``abstract_state``."""
    target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
    with _manager(run_dir, create=False) as manager:
        return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]


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
    """Load the latest (or given) checkpoint of a run directory written by ``zoo train``."""
    run_dir = Path(run_dir)
    found = latest_step(run_dir)
    if found is None:
        raise ZooError(
            f"no checkpoint under {str(run_dir)!r}: expected {CHECKPOINT_DIR}/<step>/ "
            "written by `zoo train --out DIR`"
        )
    step = found if step is None else step
    with _manager(run_dir, create=False) as manager:
        if step not in manager.all_steps():
            raise ZooError(f"no step {step} in {str(run_dir)!r}; saved steps: {manager.all_steps()}")
        restored = manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        )
    meta = restored["meta"]
    tokenizer = meta.get("tokenizer")
    return Checkpoint(
        path=run_dir,
        step=step,
        params=restored["params"],
        recipe=parse_recipe(meta["recipe"]),
        model_config=config_from_meta(meta["model"]),
        backend=meta["model"]["backend"],
        tokenizer=CharTokenizer.from_json(tokenizer) if tokenizer else None,
    )
