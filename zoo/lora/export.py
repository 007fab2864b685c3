"""``zoo export``: a LoRA run as a plain, self-contained zoo checkpoint.

``zoo.lora`` sits below ``zoo.train`` and does not import it: the checkpoint I/O is an
argument, anything with the four functions of :class:`CheckpointIO` (the command passes the
module :mod:`zoo.train.checkpoint`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from zoo.errors import ZooError
from zoo.lora.merge import merged_weights
from zoo.models.paths import flat_by_path
from zoo.recipes import override, to_dict


class CheckpointIO(Protocol):
    """The checkpoint functions :func:`export` uses (those of :mod:`zoo.train.checkpoint`)."""

    def load_checkpoint(self, run_dir, step: int | None = None): ...

    def saved_steps(self, run_dir) -> list[int]: ...

    def model_meta(self, cfg, backend: str) -> dict: ...

    def save(self, run_dir, step: int, state, params, meta: dict) -> None: ...


def export(run_dir, out_dir, *, merge: bool, checkpoints: CheckpointIO, step: int | None = None) -> dict:
    """Write a LoRA run as a plain, self-contained zoo checkpoint in ``out_dir``.

    ``merge``: each target's ``w`` becomes ``w + (alpha / rank) B A`` and the adapters go, so
    the result is the base model's config with new weights; otherwise base and adapters are
    copied as they are (a checkpoint that no longer needs the base). The checkpoint holds params
    and metadata but no training state: ``zoo.load_checkpoint``, ``zoo eval``, ``zoo sample``
    and ``--init-from`` read it; it cannot be resumed. ``checkpoints`` reads and writes them.
    """
    checkpoint = checkpoints
    ckpt = checkpoint.load_checkpoint(run_dir, step)
    spec = ckpt.model_config.lora
    if spec is None:
        raise ZooError(f"{str(run_dir)!r} has no adapters (not a LoRA run): there is nothing to export")
    out = Path(out_dir)
    if checkpoint.saved_steps(out):
        raise ZooError(f"{str(out)!r} already holds checkpoints; export into a new directory")
    params, cfg, recipe = ckpt.params, ckpt.model_config, ckpt.recipe
    if merge:
        params, cfg = merged_weights(params, spec), dataclasses.replace(cfg, lora=None)
        recipe = override(recipe, {"lora": {"rank": 0, "targets": []}})
    recipe = override(recipe, {"model": {"init_from": str(out)}, "freeze": {"patterns": []}})
    meta = {
        "recipe": to_dict(recipe),
        "model": checkpoint.model_meta(cfg, ckpt.backend),
        "tokenizer": ckpt.tokenizer.to_json() if ckpt.tokenizer else None,
        "exported_from": {"path": str(Path(run_dir).absolute()), "step": ckpt.step, "merged": merge},
    }
    checkpoint.save(out, ckpt.step, None, params, meta)
    count = sum(int(x.size) for x in flat_by_path(params).values())
    return {"out_dir": str(out), "from": str(run_dir), "step": ckpt.step, "merged": merge, "params": count}
