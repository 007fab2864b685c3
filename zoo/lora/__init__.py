"""LoRA fine-tuning: which dense layers get adapters, and the freeze plan that trains only them.

The adapters themselves (their math, both backends, the canonical leaves) are in
:mod:`zoo.models.lora`. Here a recipe's ``[lora]`` section (``zoo train --lora
rank=8,alpha=16,targets=attn.q|attn.v``) is resolved against a model config:

* each target pattern is matched against the config's dense layers (``blocks.attn.q``,
  ``head``...) with the rules of ``--freeze`` patterns; a pattern without a ``blocks`` prefix
  also matches inside the stack (``attn.q`` is ``blocks.attn.q``), and a layer range
  (``blocks[2:4].mlp.*``) limits the trainable adapter rows to those layers;
* the freeze plan freezes the whole base and the adapter rows outside the targets' layers, so
  the base gets the three guarantees of frozen layers: no gradient, no optimizer state, bitwise
  unchanged.

Writing a LoRA run out as a plain checkpoint is checkpoint I/O: :mod:`zoo.train.lora_export`.
"""

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
    "adapted_config",
    "adapters_of",
    "check_section",
    "dense_paths",
    "freeze_plan",
    "initial_params",
    "parse_flag",
    "resolve",
    "section_from_flag",
]
