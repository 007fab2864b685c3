"""Hugging Face checkpoints in and out of zoo's run directories.

``import_checkpoint`` turns a Hugging Face checkpoint (a local directory or ``ORG/NAME[@REV]``
from the Hub cache) into a zoo checkpoint directory that ``zoo.load_checkpoint`` reads;
``export_hf`` writes a zoo checkpoint (an import, a run, a LoRA run merged or as PEFT adapter
files) as a directory that ``transformers``' ``from_pretrained`` (and ``peft``) load.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ZooError
from zoo.lora.adapter import adapter_paths
from zoo.models import hf_io
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import kind_of

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model"]


def resolve_source(src: str) -> Path:
    """A local checkpoint directory, or ``ORG/NAME[@REV]`` through ``huggingface_hub``'s cache
    (``HF_HUB_OFFLINE`` respected: cache only). One ZooError line says what was tried."""
    path = Path(src).expanduser()
    if path.is_dir():
        return path
    if src.startswith("hf:"):  # --init-from's prefix; zoo import takes the source itself
        raise ZooError(f"{src}: `zoo import` takes the source without hf: (zoo import {src[3:]} --out DIR)")
    name, _, rev = src.partition("@")
    if path.exists() or name.count("/") != 1 or src.startswith((".", "/")):
        raise ZooError(f"{src}: not a checkpoint directory (and not ORG/NAME[@REV] of the Hub)")
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    try:
        got = snapshot_download(
            name, revision=rev or None, allow_patterns=_HUB_FILES, local_files_only=offline
        )
    except Exception as error:
        where = "the Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "the Hub and its cache"
        first = (str(error).strip().splitlines() or [""])[0]
        raise ZooError(
            f"{src}: no such local directory, and {where} gave nothing ({type(error).__name__}: {first})"
        ) from None
    return Path(got)


def _recipe_dict(cfg, backend: str, src: str) -> dict:
    """The recipe an import carries: the kind's preset equal to ``cfg`` (Llama 3.2 1B lands on
    ``llama-1b``), else its first preset, with every field of ``cfg``."""
    kind = kind_of(cfg)
    preset = next((name for name, known in kind.presets.items() if known == cfg), next(iter(kind.presets)))
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "lora"}
    return {
        "name": "hf-import",
        "description": f"imported from the Hugging Face checkpoint {src}",
        "model": {"preset": preset, "backend": backend, **fields},
    }


def imported_model(run_dir: str | Path) -> dict | None:
    """The ``[model]`` section of a zoo import of a Hugging Face checkpoint (None when
    ``run_dir`` holds no checkpoint or is not such an import)."""
    from zoo.train import checkpoint

    run_dir = Path(run_dir)
    step = checkpoint.latest_step(run_dir) if run_dir.is_dir() else None
    if step is None:
        return None
    meta = checkpoint.restore_meta(run_dir, step)
    return dict(meta["recipe"]["model"]) if "hf_source" in meta else None


def with_imported_model(recipe, given: Mapping[str, object]):
    """A recipe that starts from an import trains the imported model: its ``[model]`` becomes
    the import's (an imported architecture is fixed), with the recipe's backend, the recipe's
    own overrides when it names the same preset, and the ``[model]`` values in ``given``
    (flags, ``--set``) on top. Recipes ``hf-lm-lora`` and ``hf-lm-dp-lora`` rely on this."""
    from zoo.recipes import model_section

    start = recipe.model.init_from
    model = imported_model(start) if start else None
    if model is None:
        return recipe
    if model["preset"] == recipe.model.preset:
        model.update(dict(recipe.model.overrides))
    model.update(backend=recipe.model.backend, init_from=start)
    model.update(given)
    return dataclasses.replace(recipe, model=model_section(model))


def import_checkpoint(src: str, out: str | Path, *, backend: str = "nnx", dtype: str = "float32") -> dict:
    """Write the Hugging Face checkpoint ``src`` as a zoo checkpoint (step 0) in ``out``."""
    from zoo.recipes import parse_recipe, to_dict
    from zoo.train import checkpoint

    out = _writable_out(out)
    if checkpoint.saved_steps(out):
        raise ZooError(f"{str(out)!r} already holds checkpoints; import into a new directory")
    where = resolve_source(src)
    try:
        cfg, params = hf_io.load(where, dtype)
    except ValueError as error:
        raise ZooError(str(error)) from None
    # Onto the device leaf by leaf: on CPU, device_put shares hf_io's 64-byte aligned buffers
    # (NumPy leaves would take orbax's copying path). Written without zstd, tensorstore writes
    # from those buffers; compressed, it holds a compressed copy of every leaf until the write
    # ends, about one more checkpoint in memory (benchmarks/hf/import_memory.py, docs/hf.md).
    flat = flat_by_path(params)
    del params
    params = nest_by_path({path: jax.device_put(flat.pop(path)) for path in list(flat)})
    meta = {
        "recipe": to_dict(parse_recipe(_recipe_dict(cfg, backend, src))),
        "model": checkpoint.model_meta(cfg, backend),
        "tokenizer": _tokenizer(where, cfg),
        "hf_source": {"source": src, "path": str(where.absolute()), "dtype": dtype},
    }
    checkpoint.save(out, 0, None, params, meta, compress=False)
    count = sum(int(x.size) for x in flat_by_path(params).values())
    vocabulary = "" if meta["tokenizer"] else " --set data.vocabulary=hf:TOKENIZER.json"
    return {
        "out_dir": str(out),
        "from": src,
        "kind": cfg.kind,
        "dtype": dtype,
        "params": count,
        "tokenizer": "tokenizer.json" if meta["tokenizer"] else "none (no tokenizer.json in the source)",
        "finetune": f"zoo train hf-lm-lora --init-from {out} --dataset text:PATH{vocabulary}",
    }


def _tokenizer(where: Path, cfg) -> str | None:
    """The checkpoint's ``tokenizer.json``, as checkpoint metadata (None when it has none)."""
    from zoo.data.hf_tokenizer import FILE, HFTokenizer

    if not (where / FILE).is_file():
        return None
    tok = HFTokenizer.from_file(where / FILE, vocab=cfg.vocab_size)
    if tok.vocab_size > cfg.vocab_size:
        raise ZooError(
            f"{where / FILE}: {tok.vocab_size} tokens, more than the model's vocab_size {cfg.vocab_size}"
        )
    return tok.to_json()


def import_cached(src: str, backend: str = "nnx") -> Path:
    """The zoo import of ``src`` (``--init-from hf:SRC``), made once under ``$ZOO_HF_CACHE``
    (default ``~/.cache/zoo/hf-imports``) and reused (with a warning line saying so): keyed by
    the source's name, or a local directory's absolute path and its files' contents (JSON files
    by their bytes, weights by size and modification time), so changed weights import anew.

    Two runs importing one source at once take turns on a lock beside the entry
    (:func:`zoo.cache.locked`), and the second reuses the first's import: checking and writing
    unlocked, the second removed the first's folder while it was being written. The write
    itself is whole or nothing (:func:`_import_whole`)."""
    import hashlib

    from zoo.cache import locked
    from zoo.train import checkpoint

    local = Path(src).expanduser()
    name = str(local.absolute()) if local.is_dir() else src
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/"))[-60:]
    key = f"{name}|{backend}" + (_content_key(local) if local.is_dir() else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(os.environ.get("ZOO_HF_CACHE") or Path.home() / ".cache" / "zoo" / "hf-imports")
    out = root / f"{slug}-{digest}"
    root.mkdir(parents=True, exist_ok=True)
    with locked(out, waiting=f"hf:{src}: another run is importing it into {out}; waiting for it to finish"):
        if checkpoint.latest_step(out) is None:
            _import_whole(src, out, backend)
            return out
    import warnings

    warnings.warn(f"hf:{src}: reusing its import in {out} (the source's files are unchanged)", stacklevel=2)
    return out


def _import_whole(src: str, out: Path, backend: str) -> None:
    """Import ``src`` into a hidden folder beside ``out`` (``.NAME.XXXX``), renamed to ``out``
    once whole, so that an import that fails or is killed leaves no ``out`` to trust; a failed
    one removes its folder. Called under ``out``'s lock, so the hidden folders of ``out`` left by
    a killed import are nobody's: they go first, with an ``out`` that holds no intact step (an
    import an older zoo left unfinished)."""
    import shutil
    import tempfile

    for stale in [*out.parent.glob(f".{out.name}.*"), out]:
        if stale.exists():
            shutil.rmtree(stale)
    part = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        import_checkpoint(src, part, backend=backend)
        os.rename(part, out)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise


def _content_key(folder: Path) -> str:
    """What a local checkpoint folder holds: each file's name, size and modification time,
    and the bytes of its (small) JSON files."""
    import hashlib

    parts = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        stat = path.stat()
        parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
        if path.suffix == ".json" and stat.st_size < 1 << 20:
            parts.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return "|" + "|".join(parts)


def export_hf(run_dir, out_dir, *, adapter: bool = False, step: int | None = None) -> dict:
    """Write a zoo checkpoint as a Hugging Face checkpoint directory ``out_dir``.

    A LoRA run is written merged (``w + (alpha/rank) A B``: a full model), or with ``adapter``
    as PEFT's ``adapter_config.json`` and ``adapter_model.safetensors`` only (its base is the
    export of the checkpoint the run adapts).
    """
    from zoo.lora.merge import merged_weights
    from zoo.train import checkpoint

    out_dir = _writable_out(out_dir)
    ckpt = checkpoint.load_checkpoint(run_dir, step)
    cfg, params = ckpt.model_config, ckpt.params
    try:
        if adapter:
            if cfg.lora is None:
                raise ValueError(f"{run_dir}: not a LoRA run; --adapter needs adapters to export")
            written = save_adapter(cfg, params, out_dir, base=_hf_base(ckpt))
        else:
            if cfg.lora is not None:
                params, cfg = merged_weights(params, cfg.lora), dataclasses.replace(cfg, lora=None)
            fields = hf_io.save(cfg, one_dtype(params), out_dir)
            written = {"model_type": fields["model_type"]}
            spec = getattr(ckpt.tokenizer, "spec", None)  # an import's tokenizer.json goes along
            if spec is not None:
                from zoo.data.hf_tokenizer import FILE

                (Path(out_dir) / FILE).write_text(spec)
                written["tokenizer"] = FILE
    except ValueError as error:
        raise ZooError(str(error)) from None
    return {"out_dir": str(out_dir), "from": str(run_dir), "step": ckpt.step, "adapter": adapter, **written}


def one_dtype(params: dict) -> dict:
    """``params`` with one floating dtype, so that ``config.json``'s ``torch_dtype`` is the
    dtype of every tensor: a checkpoint stored as held mixes float32 (what trained) with bf16
    (what stayed frozen in bf16), and such a mix is widened, exactly, to float32."""
    floats = {
        str(a.dtype) for a in jax.tree_util.tree_leaves(params) if jnp.issubdtype(a.dtype, jnp.floating)
    }
    if len(floats) <= 1:
        return params
    return jax.tree_util.tree_map(
        lambda a: np.asarray(a, np.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a, params
    )


def _writable_out(out) -> Path:
    """``--out`` of ``zoo import`` / ``zoo export --format hf``, refused in one line when it is
    empty (it would be the current directory), a file, under a file, or not writable."""
    from zoo.train.runlog import dir_problem

    if not str(out).strip():
        raise ZooError("--out is empty; name a new directory for the checkpoint")
    out = Path(out)
    problem = dir_problem(out)
    if problem:
        raise ZooError(f"--out {str(out)!r} cannot be written: {problem}; choose another --out")
    return out


def _hf_base(ckpt) -> str | None:
    """The Hugging Face checkpoint a LoRA run adapts (its base's ``hf_source``: a Hub name or a
    local folder), for ``base_model_name_or_path``; None when the base is not an import."""
    from zoo.train import checkpoint

    ref = checkpoint.restore_meta(ckpt.path, ckpt.step).get(checkpoint.LORA_BASE)
    base = Path(ref["path"]) if ref else None
    step = checkpoint.latest_step(base) if base is not None and base.is_dir() else None
    source = checkpoint.restore_meta(base, step).get("hf_source") if step is not None else None
    if not source:
        return None
    local = Path(source["path"])  # a Hub snapshot's folder when the source is ORG/NAME[@REV]
    return str(local) if Path(source["source"]).expanduser().is_dir() else source["source"].split("@")[0]


def save_adapter(cfg, params: dict, out_dir, *, base: str | None) -> dict:
    """PEFT LoRA files of the adapters of ``params``: ``lora_A.weight`` [r, in] and
    ``lora_B.weight`` [out, r] per adapted module, scale ``lora_alpha / r``. GPT-2's Conv1D
    modules store ``[in, out]``: the same files with ``fan_in_fan_out``. ``base`` is the
    Hugging Face checkpoint they adapt (``base_model_name_or_path``; left out when None)."""

    spec = cfg.lora
    base_cfg = dataclasses.replace(cfg, lora=None)
    module_of, conv1d = {}, False  # canonical dense path -> (PEFT module key with {i}, stacked)
    for t in hf_io.mapping_of(base_cfg).tensors(base_cfg):
        if len(t.leaves) == 1 and t.leaves[0].endswith(".w") and t.key.endswith(".weight"):
            module_of[t.leaves[0][:-2]] = (t.key[: -len(".weight")], t.stacked)
            conv1d = conv1d or (not t.transpose and t.leaves[0] not in ("embed.w", "pos.w"))
    flat = flat_by_path(params)
    tensors, modules = {}, set()
    for target in spec.targets:
        if target not in module_of:
            raise ValueError(
                f"the adapter on {target} has no PEFT module of its own (it shares one with other "
                f"weights); adapter targets that export: {', '.join(sorted(module_of))}; or export "
                "the run merged: zoo export RUN --format hf, without --adapter"
            )
        key, stacked = module_of[target]
        a, b = (np.asarray(flat[p], np.float32) for p in adapter_paths(target))
        for i in range(cfg.num_layers) if stacked else (None,):
            name = key.format(i=i)
            modules.add(name.rsplit(".", 1)[-1])
            ai, bi = (a, b) if i is None else (a[i], b[i])
            tensors[f"base_model.model.{name}.lora_A.weight"] = np.ascontiguousarray(ai.T)
            tensors[f"base_model.model.{name}.lora_B.weight"] = np.ascontiguousarray(bi.T)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: not empty; export into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    hf_io.save_tensors(tensors, out / ADAPTER_WEIGHTS)
    fields = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": sorted(modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": conv1d,
        "use_rslora": False,
        "inference_mode": True,
    }
    if base is not None:
        fields["base_model_name_or_path"] = base
    (out / ADAPTER_CONFIG).write_text(json.dumps(fields, indent=2) + "\n")
    return {"modules": len(tensors) // 2}
