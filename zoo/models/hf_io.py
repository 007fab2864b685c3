"""Hugging Face checkpoints <-> the canonical tree: ``config.json`` plus ``model.safetensors``
(or a sharded ``model.safetensors.index.json``), read tensor by tensor into preallocated
stacked arrays and written back.

A kind that maps onto Hugging Face checkpoints names a module when it registers
(``register(..., hf="zoo.models.<kind>.hf")``). That module defines:

- ``MODEL_TYPES``: the ``model_type`` values it reads;
- ``config_from_hf(fields) -> config``: raises ValueError naming a field that changes the math
  and is not supported, with the supported values;
- ``config_to_hf(config) -> dict``: the ``config.json`` fields;
- ``tensors(config) -> list[Tensor]``: which checkpoint tensor holds which canonical leaves;
- optionally ``tied_copies(config) -> {key: leaf}``: tensors a file may also store as copies of
  a leaf (a tied head), read only to check that they are;
- optionally ``export_leaves(config, flat) -> flat``: the leaves an export needs that a zoo
  model may lack (zero biases), or ValueError saying what the format cannot hold.

Nothing here knows a kind: the kind is found by ``model_type`` through the registry.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.models.canonical import canonical_shapes
from zoo.models.paths import nest_by_path
from zoo.models.registry import kind_of, kinds

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
DTYPES = ("float32", "bfloat16", "float16")
# Buffers some checkpoints carry that are not parameters (GPT-2's causal masks, old Llama's
# rotary frequencies): skipped, since zoo recomputes them.
BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


@dataclass(frozen=True)
class Tensor:
    """One checkpoint tensor and the canonical leaves it holds.

    ``key`` names the tensor (``{i}`` stands for the layer index of a stacked leaf). Read as
    ``[in, out]`` (transposed first when ``transpose``: PyTorch's ``Linear`` stores
    ``[out, in]``), its last axis is the concatenation of ``leaves`` in order, in equal parts
    (GPT-2's fused ``c_attn`` holds q, k and v).
    """

    key: str
    leaves: tuple[str, ...]
    transpose: bool = False

    @property
    def stacked(self) -> bool:
        return "{i}" in self.key


def mapping_for(model_type: object, where: str):
    """The registered kind's mapping module whose ``MODEL_TYPES`` holds ``model_type``."""
    supported = {}
    for kind in kinds():
        module = kind.hf_mapping()
        if module is not None:
            supported.update(dict.fromkeys(module.MODEL_TYPES, module))
    if model_type not in supported:
        raise ValueError(
            f"{where}: model_type = {model_type!r} is not supported; supported: {', '.join(sorted(supported))}"
        )
    return supported[model_type]


def mapping_of(cfg):
    module = kind_of(cfg).hf_mapping()
    if module is None:
        raise ValueError(f"the {cfg.kind} kind has no Hugging Face mapping")
    return module


def read_config(src: Path):
    """``(config, fields)`` of the checkpoint directory ``src``."""
    path = Path(src) / CONFIG
    try:
        fields = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (a Hugging Face checkpoint directory has a {CONFIG})") from None
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: unreadable ({error})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: not a JSON object")
    module = mapping_for(fields.get("model_type"), str(path))
    try:
        return module.config_from_hf(fields), fields
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    except KeyError as error:  # a field the model type needs
        raise ValueError(f"{path}: the field {error.args[0]!r} is missing") from None


class Source:
    """The tensors of a checkpoint directory, one at a time, whatever shard holds them."""

    def __init__(self, src: Path):
        self.src = Path(src)
        index = self.src / INDEX
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{index}: unreadable index ({type(error).__name__}: {error})") from None
            self.where = {k: self.src / v for k, v in weight_map.items()}
            for key, shard in self.where.items():
                if not shard.is_file():
                    raise ValueError(f"{index}: names the missing shard {shard.name} (for {key})")
        elif (self.src / WEIGHTS).is_file():
            self.where = {k: self.src / WEIGHTS for k in self._keys(self.src / WEIGHTS)}
        else:
            pickles = sorted(p.name for p in self.src.glob("*.bin"))
            hint = (
                f"; {', '.join(pickles)} (PyTorch's pickle format) is not read: save the model with "
                "transformers' save_pretrained(DIR, safe_serialization=True) and import DIR"
                if pickles
                else ""
            )
            raise ValueError(f"{self.src / WEIGHTS}: missing (and no {INDEX}){hint}")
        self.used: set[str] = set()

    @staticmethod
    def _open(path: Path, framework: str = "numpy"):
        from safetensors import safe_open

        try:
            return safe_open(str(path), framework=framework)
        except Exception as error:  # safetensors raises its own SafetensorError
            raise ValueError(f"{path}: not a readable safetensors file ({error})") from None

    def _keys(self, path: Path) -> list[str]:
        with self._open(path) as f:
            return list(f.keys())

    def resolve(self, key: str) -> str | None:
        """``key``, or the same key without its first component (GPT-2's Hub files name
        ``h.0...`` what ``save_pretrained`` names ``transformer.h.0...``)."""
        if key in self.where:
            return key
        bare = key.split(".", 1)[-1]
        return bare if bare in self.where else None

    def get(self, key: str) -> np.ndarray:
        """The tensor ``key`` as a NumPy array of its stored dtype (bfloat16 as ml_dtypes')."""
        found = self.resolve(key)
        if found is None:
            raise ValueError(f"{self.src}: the checkpoint has no tensor {key!r}")
        path = self.where[found]
        self.used.add(found)
        with self._open(path) as f:
            try:
                if f.get_slice(found).get_dtype() == "BF16":  # numpy has no bfloat16
                    with self._open(path, "flax") as g:
                        return np.asarray(g.get_tensor(found))
                return f.get_tensor(found)
            except Exception as error:
                raise ValueError(f"{path}: tensor {found!r} could not be read ({error})") from None

    def unused(self) -> list[str]:
        return sorted(k for k in self.where if k not in self.used and not k.endswith(BUFFERS))


def load(src: str | Path, dtype: str = "float32"):
    """``(config, canonical params as NumPy arrays)`` of the checkpoint directory ``src``.

    Each canonical leaf is allocated once, in ``dtype``, and filled tensor by tensor; a
    stacked leaf one layer at a time. Shapes are checked against the config: one ValueError
    line names the file, the key and both shapes.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; supported: {', '.join(DTYPES)}")
    np_dtype = _np_dtype(dtype)
    cfg, _ = read_config(src)
    source = Source(src)
    shapes = canonical_shapes(cfg)
    flat = {path: _empty(shape, np_dtype) for path, shape in shapes.items()}
    for spec in mapping_of(cfg).tensors(cfg):
        for i in range(cfg.num_layers) if spec.stacked else (None,):
            key = spec.key.format(i=i)
            value = source.get(key)
            value = value.T if spec.transpose else value
            parts = np.split(value, len(spec.leaves), axis=-1)
            for leaf, part in zip(spec.leaves, parts, strict=True):
                want = shapes[leaf][1:] if spec.stacked else shapes[leaf]
                if part.shape != tuple(want):
                    raise ValueError(
                        f"{source.where[source.resolve(key)]}: tensor {key!r} has shape {tuple(value.shape)}; "
                        f"config.json implies {_stored_shape(want, len(spec.leaves), spec.transpose)}"
                    )
                target = flat[leaf] if i is None else flat[leaf][i]
                target[...] = part
    for key, leaf in getattr(mapping_of(cfg), "tied_copies", lambda cfg: {})(cfg).items():
        found = source.resolve(key)  # a tied head some files also store: used if it is a copy
        if found is not None and found not in source.used:
            if not np.array_equal(source.get(key).astype(np_dtype), flat[leaf]):
                raise ValueError(
                    f"{source.where[found]}: {key} differs from the embedding, but config.json says "
                    "tie_word_embeddings: true"
                )
    extra = source.unused()
    if extra:
        raise ValueError(f"{src}: tensors the {cfg.kind} mapping does not read: {', '.join(extra[:5])}")
    return cfg, nest_by_path(flat)


def _empty(shape, dtype, align: int = 64) -> np.ndarray:
    """``np.empty`` at a 64-byte aligned address: ``jax.device_put`` on CPU then shares the
    buffer instead of copying it (``zoo import`` holds one copy of the weights, not two)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _stored_shape(shape, parts: int, transpose: bool) -> tuple[int, ...]:
    shape = (*shape[:-1], shape[-1] * parts)
    return tuple(reversed(shape)) if transpose else tuple(shape)


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def hf_tensors(cfg, flat: dict) -> dict[str, np.ndarray]:
    """The checkpoint tensors of canonical params ``flat`` (``{dotted path: array}``)."""
    out = {}
    for spec in mapping_of(cfg).tensors(cfg):
        for i in range(cfg.num_layers) if spec.stacked else (None,):
            parts = [np.asarray(flat[leaf] if i is None else flat[leaf][i]) for leaf in spec.leaves]
            value = np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
            out[spec.key.format(i=i)] = np.ascontiguousarray(value.T if spec.transpose else value)
    return out


def save_tensors(tensors: dict, path: Path) -> None:
    """``tensors`` as a safetensors file readable as the process's umask allows, as every other
    file of an export is: safetensors' ``save_file`` makes its file for its owner alone (0600)."""
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save(cfg, params: dict, out: str | Path) -> dict:
    """Write ``config.json`` and ``model.safetensors`` of canonical ``params`` under ``out``
    (a new or empty directory); returns the config fields written."""

    from zoo.models.paths import flat_by_path

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: not empty; export into a new directory")
    fields = mapping_of(cfg).config_to_hf(cfg)
    flat = flat_by_path(params)
    if hasattr(cfg, "vocab_unpadded"):  # a table padded to vocab_multiple rows: the vocabulary's rows
        flat = cfg.vocab_unpadded(flat)
    if hasattr(mapping_of(cfg), "export_leaves"):  # leaves a kind fills in (zero biases)
        flat = mapping_of(cfg).export_leaves(cfg, flat)
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(cfg, flat)
    dtypes = {str(v.dtype) for v in tensors.values()}
    fields["torch_dtype"] = fields["dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    save_tensors(tensors, out / WEIGHTS)
    (out / CONFIG).write_text(json.dumps(fields, indent=2) + "\n")
    return fields
