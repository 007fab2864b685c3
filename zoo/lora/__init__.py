"""LoRA fine-tuning in one package: the adapter op, its spec, setup, merge and export.

* :mod:`zoo.lora.adapter`: the adapters themselves (:class:`LoraSpec`, their math on both
  backends, their canonical leaves). ``zoo.models`` never imports this package: a config's
  ``lora`` field holds the spec opaquely and this module registers the rest with
  :mod:`zoo.models.extensions` at import (``import zoo`` imports it).
* :mod:`zoo.lora.setup` and :mod:`zoo.lora.flags`: a recipe's ``[lora]`` section (the
  ``LoraConfig`` of :mod:`zoo.configs`, with the other recipe sections; ``zoo train --lora
  rank=8,alpha=16,targets=attn.q|attn.v``) resolved against a model config;
* :mod:`zoo.lora.merge`: adapters folded into their base weights;
* :mod:`zoo.lora.export`: a LoRA run as a plain checkpoint (the checkpoint I/O passed in).

Resolving a ``[lora]`` section:

* each target pattern is matched against the config's dense layers (``blocks.attn.q``,
  ``head``...) with the rules of ``--freeze`` patterns; a pattern without a ``blocks`` prefix
  also matches inside the stack (``attn.q`` is ``blocks.attn.q``), and a layer range
  (``blocks[2:4].mlp.*``) limits the trainable adapter rows to those layers;
* the freeze plan freezes the whole base and the adapter rows outside the targets' layers, so
  the base gets the three guarantees of frozen layers: no gradient, no optimizer state, bitwise
  unchanged.

"""

from zoo.lora.adapter import LoraSpec, adapter_paths, is_adapter_path
from zoo.lora.flags import FLAG_KEYS, check_section, parse_flag, section_from_flag
from zoo.lora.setup import (
    LoraSetup,
    adapted_config,
    adapters_of,
    dense_paths,
    freeze_plan,
    initial_params,
    resolve,
)

__all__ = [
    "FLAG_KEYS",
    "LoraSetup",
    "LoraSpec",
    "adapter_paths",
    "adapted_config",
    "adapters_of",
    "check_section",
    "dense_paths",
    "freeze_plan",
    "initial_params",
    "is_adapter_path",
    "parse_flag",
    "resolve",
    "section_from_flag",
]
