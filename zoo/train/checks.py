"""Checks of a run against its data, its horizon and its start checkpoint, made while the run
is built and before any weights exist: a refusal names the setting, a warning says what the
run will do with it.
"""

from __future__ import annotations

import warnings

from zoo.configs import OptimConfig
from zoo.errors import ZooError
from zoo.models.registry import ModelConfig


def check_start(start: str, source_cfg: ModelConfig, cfg: ModelConfig, lora_enabled: bool) -> None:
    """Refuse a start checkpoint (``--init-from``) of another task, or a LoRA run's adapters
    without ``[lora]``: its weights are not a model of this recipe's shape."""
    if source_cfg.task_type is not cfg.task_type:
        raise ZooError(
            f"--init-from {start!r} holds a {source_cfg.task!r} model ({source_cfg.kind}), but this "
            f"recipe trains a {cfg.task!r} model ({cfg.kind}); start from a run of the same task"
        )
    if source_cfg.lora is not None and not lora_enabled:
        raise ZooError(
            f"--init-from {start!r} is a LoRA run (adapters over a frozen base); fold them into "
            f"plain weights first: zoo export {start} --merge --out DIR, then --init-from DIR"
        )


def check_vocabulary(start: str, source, vocabulary: str | None) -> None:
    """Refuse an LM start checkpoint that carries no tokenizer (an import of a folder without
    ``tokenizer.json``) unless ``data.vocabulary`` declares one: a vocabulary fitted on the text
    would hand its characters the first rows of a pretrained embedding (and, under DP, read the
    vocabulary off the private text). Only the checkpoint's metadata and the recipe are read."""
    if source.model_config.task_type.tokenized and source.tokenizer is None and vocabulary is None:
        raise ZooError(
            f"--init-from {start!r} carries no tokenizer (its source had no tokenizer.json), so the "
            "text's characters would become the first ids of its pretrained embedding; set "
            'data.vocabulary = "hf:SRC" to the tokenizer.json the model was trained with'
        )


def check_vocab_fits(start: str, source, vocab_size: int) -> None:
    """Refuse a tokenizer with more ids than the start checkpoint's embedding has rows (the
    checkpoint fixes the size: it was not set by the user)."""
    rows = getattr(source.model_config, "vocab_size", 0)
    if source.model_config.task_type.tokenized and vocab_size > rows:
        raise ZooError(
            f"the tokenizer has {vocab_size} tokens, but the embedding of --init-from {start!r} has "
            f"{rows} rows; use the checkpoint's own tokenizer, or a data.vocabulary of at most {rows} tokens"
        )


def check_trainable_dtype(start: str, params: dict) -> None:
    """Refuse a float16 start checkpoint: zoo has no loss scaling, and the first step's
    gradients through a float16 model are NaN (bfloat16 trains: its range is float32's)."""
    import jax

    if any(getattr(leaf, "dtype", None) == "float16" for leaf in jax.tree_util.tree_leaves(params)):
        raise ZooError(
            f"--init-from {start!r} holds float16 weights, and zoo trains them without loss "
            "scaling (its first gradients are NaN); import the checkpoint again with --dtype "
            "bfloat16 or float32"
        )


def warn_remat_without_stack(policy: str, cfg: ModelConfig) -> None:
    """A remat policy acts on the scanned stack of blocks; a model without one runs the same
    program under every policy."""
    if policy != "none" and not getattr(cfg, "num_layers", 1):
        warnings.warn(
            f"train.remat={policy!r} has no effect on this {cfg.kind} model: it has no scanned stack "
            "of blocks (num_layers=0), so every remat policy compiles the same step",
            stacklevel=3,
        )


def warn_batch_over_rows(batch_size: int, rows: int, dataset: str) -> None:
    """A classifier batch larger than the training rows draws rows with replacement."""
    if batch_size > rows:
        warnings.warn(
            f"train.batch_size={batch_size} is larger than the {rows:,} training rows of "
            f"{dataset!r}: every batch draws rows with replacement and repeats some; "
            f"train.batch_size={rows} covers them once",
            stacklevel=3,
        )


def warn_long_warmup(optim: OptimConfig, steps: int, plan_steps: int | None = None) -> None:
    """A warmup longer than the run: the learning rate never reaches ``optim.lr``. ``steps``:
    the steps the run trains to; ``plan_steps``: its schedule's horizon where that is another
    (a resumed run extended with a longer ``--steps`` keeps the one it was planned with). The
    ramp is ``optim.warmup_steps`` long whatever the horizon, so ``steps`` says how far it gets."""
    if optim.warmup_steps <= steps:
        return
    kept = (
        ""
        if plan_steps in (None, steps)
        else f" (its schedule keeps the {plan_steps} steps it was planned for)"
    )
    warnings.warn(
        f"optim.warmup_steps={optim.warmup_steps} is longer than the {steps} steps the run trains "
        f"to{kept}: the learning rate ramps up to only {steps / optim.warmup_steps:.0%} of "
        f"optim.lr={optim.lr:g} by the end",
        stacklevel=3,
    )


INDEX_LIMIT = 2**31 - 1  # a batch's rows are int32 indices (zoo.dp.sampling, zoo.data.batches)


def host_memory() -> int | None:
    """Bytes of this machine's physical memory, or None where the OS does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def require_batch_fits(rows: int, row_bytes: int, what: str, memory: int | None = None) -> None:
    """Refuse, in one line and before anything is allocated, a batch of ``rows`` rows of
    ``row_bytes`` each that cannot be held: more rows than int32 indices reach, or more bytes
    than the machine's memory. ``what`` names the settings that size the batch; ``rows``
    follows from them and public counts only, so under DP the refusal depends on no record."""
    from zoo.ui import human_bytes

    memory = host_memory() if memory is None else memory
    total = rows * max(int(row_bytes), 1)
    if rows > INDEX_LIMIT or (memory is not None and total > memory):
        room = f"this machine's {human_bytes(memory)} of memory" if memory is not None else "int32 indices"
        raise ZooError(
            f"{what} makes a batch of {rows:,} rows ({human_bytes(total)}): more than {room} can "
            f"hold; lower it (a batch holds at most {INDEX_LIMIT:,} rows)"
        )
