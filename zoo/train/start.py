"""Stage 2 of a run, the model start (:mod:`zoo.train.stages`): what the engine is made from.

A :class:`Start` holds the model config fitted to the data, the initial params (fresh or the
start checkpoint's), the freeze plan, the LoRA setup and the layout on the recipe's mesh.
:func:`zoo.train.engine.make_engine` reads its config, freeze plan and layout; the stages read
the rest. It lives apart from the stages so the engine, below them, can take one.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoo import lora
from zoo.freeze import FreezePlan, resolve_freeze
from zoo.models import canonical
from zoo.models.registry import ModelConfig
from zoo.parallel import layout_for
from zoo.parallel.layout import Layout

__all__ = ["Start", "config_start"]


@dataclass(frozen=True)
class Start:
    """Stage 2, the model start: sizes fitted to the data, initial params (fresh or the start
    checkpoint's), the freeze plan, the LoRA setup and the layout on the recipe's mesh."""

    cfg: ModelConfig
    params: dict
    freeze: FreezePlan
    layout: Layout
    adapters: lora.LoraSetup | None = None
    base: dict | None = None  # a LoRA run's base checkpoint (checkpoint.base_reference)
    source: object = None  # the start checkpoint, or None

    def with_params(self, params: dict) -> Start:
        return Start(self.cfg, params, self.freeze, self.layout, self.adapters, self.base, self.source)


def config_start(
    cfg: ModelConfig,
    params: dict | None = None,
    *,
    seed: int = 0,
    patterns: tuple[str, ...] = (),
    freeze: FreezePlan | None = None,
    layout: Layout | None = None,
) -> Start:
    """Stage 2 without a recipe (``zoo bench``, tests: a preset on synthetic batches): ``params``
    (default: fresh from ``seed``), frozen by ``patterns`` or the given ``freeze`` plan (a LoRA
    setup's), laid out on ``layout`` (default: one device)."""
    params = canonical.init_params(cfg, seed) if params is None else params
    freeze = freeze or resolve_freeze(params, tuple(patterns))
    return Start(cfg, params, freeze, layout or layout_for(cfg))
