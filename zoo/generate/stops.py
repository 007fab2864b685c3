"""The stop tokens of a checkpoint: the end-of-sequence ids its tokenizer names, and those of
the Hugging Face ``config.json`` (and ``generation_config.json``) it was imported from."""

from __future__ import annotations

import json
from pathlib import Path

# special tokens that end a sequence in the tokenizers zoo imports (GPT-2, Llama 2/3, ours)
EOS_NAMES = ("<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>")
HOPS = 4  # runs that start from runs: how far back the import is looked for


def tokenizer_eos(tokenizer) -> tuple[int, ...]:
    """Ids of :data:`EOS_NAMES` in a Hugging Face tokenizer (zoo's character tokenizer has none)."""
    inner = getattr(tokenizer, "_tokenizer", None)
    if inner is None or not hasattr(inner, "token_to_id"):
        return ()
    found = (inner.token_to_id(name) for name in EOS_NAMES)
    return tuple(i for i in found if i is not None)


def config_eos(source: str | Path) -> tuple[int, ...]:
    """``eos_token_id`` (an int or a list) of a Hugging Face checkpoint directory's
    ``generation_config.json`` and ``config.json``; () when neither is readable."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(source) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids += [value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)]
    return tuple(dict.fromkeys(ids))


def checkpoint_eos(ckpt) -> tuple[int, ...]:
    """A checkpoint's stop tokens: its tokenizer's EOS ids, and the imported config's (of the
    run itself when it is an import, else of the run it started from, followed back), within
    the vocabulary."""
    from zoo.train import checkpoint

    ids = list(tokenizer_eos(ckpt.tokenizer))
    run = Path(ckpt.path)
    for _ in range(HOPS):
        step = checkpoint.latest_step(run) if run.is_dir() else None
        if step is None:
            break
        meta = checkpoint.restore_meta(run, step)
        if "hf_source" in meta:
            ids += config_eos(meta["hf_source"]["path"])
            break
        start = meta.get("recipe", {}).get("model", {}).get("init_from")
        if not start:
            break
        run = Path(start)
    vocab = ckpt.model_config.vocab_size
    return tuple(i for i in dict.fromkeys(ids) if 0 <= i < vocab)
