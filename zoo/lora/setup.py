"""A ``[lora]`` section resolved against a model config: the adapters, the layers each one
trains in, the freeze plan that trains only them, and the adapted model's first params (see
:mod:`zoo.lora`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zoo.configs import LoraConfig
from zoo.errors import ZooError
from zoo.freeze import FreezePlan, parse_pattern, plan_of
from zoo.lora.adapter import LoraSpec, adapter_paths, is_adapter_path
from zoo.models import canonical
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import STACK, ModelConfig


def dense_paths(cfg: ModelConfig) -> tuple[str, ...]:
    """The dotted paths of a config's dense layers (the parents of its non-table ``w`` leaves
    of rank 2 per layer: a conv kernel [kh, kw, in, out] is not one)."""
    return tuple(
        sorted(
            path.rsplit(".", 1)[0]
            for path, shape in canonical.canonical_shapes(cfg).items()
            if path.endswith(".w")
            and not is_adapter_path(path)
            and not cfg.is_table(tuple(path.split(".")))
            and len(shape) - path.startswith(STACK + ".") == 2
        )
    )


@dataclass(frozen=True)
class LoraSetup:
    """A resolved ``[lora]`` section: the adapters and the layers each one trains in."""

    spec: LoraSpec
    rows: dict  # target -> trainable layer indices (stacked targets), or None (the whole leaf)
    patterns: tuple[str, ...]

    def summary(self, plan: FreezePlan) -> dict:
        return {
            "rank": self.spec.rank,
            "alpha": self.spec.alpha,
            "targets": list(self.patterns),
            "adapter_params": plan.trainable_count,
        }


def _selects(pattern, dense: str) -> bool:
    if pattern.selects(dense):
        return True
    inner = dense.startswith(STACK + ".") and pattern.layers is None
    return inner and pattern.selects(dense[len(STACK) + 1 :])


def resolve(cfg: ModelConfig, section: LoraConfig) -> LoraSetup:
    """Match ``section.targets`` against ``cfg``'s dense layers; one ZooError line naming a
    pattern that matches none, with the dense paths listed."""
    dense = dense_paths(cfg)
    rows: dict[str, set[int] | None] = {}
    for text in section.targets:
        try:
            pattern = parse_pattern(text)
        except ZooError as error:
            raise ZooError(f"LoRA target: {error}") from None
        hits = [d for d in dense if _selects(pattern, d)]
        if not hits:
            raise ZooError(
                f"LoRA target {text!r} matches no dense layer of {cfg.kind}; dense layers: "
                f"{', '.join(dense)} (a path inside the stack may leave out '{STACK}.')"
            )
        for target in hits:
            if not target.startswith(STACK + "."):
                rows[target] = None
                continue
            mine = set(pattern.rows(cfg.num_layers))
            rows[target] = rows.get(target, set()) | mine
    spec = LoraSpec(section.rank, float(section.alpha), tuple(sorted(rows)))
    return LoraSetup(
        spec, {t: None if r is None else tuple(sorted(r)) for t, r in rows.items()}, section.targets
    )


def adapted_config(cfg: ModelConfig, setup: LoraSetup) -> ModelConfig:
    return dataclasses.replace(cfg, lora=setup.spec)


def freeze_plan(cfg: ModelConfig, setup: LoraSetup) -> FreezePlan:
    """Everything frozen but each target's adapter rows in its layers (``cfg`` has the adapters)."""
    shapes = canonical.canonical_shapes(cfg)
    trainable = {p: setup.rows[t] for t in setup.spec.targets for p in adapter_paths(t)}
    frozen_leaves, rows = set(), {}
    for path in shapes:
        if path not in trainable:
            if path.startswith(STACK + "."):
                rows[path] = set(range(cfg.num_layers))
            else:
                frozen_leaves.add(path)
        elif trainable[path] is not None:
            rows[path] = set(range(cfg.num_layers)) - set(trainable[path])
    return plan_of(shapes, frozen_leaves, rows, cfg.num_layers)


def initial_params(cfg: ModelConfig, source_cfg: ModelConfig, source_params: dict, seed: int) -> dict:
    """The adapted model's first params: a base checkpoint's plus fresh adapters, or, when the
    source is already a run with these very adapters (``zoo eval`` of a LoRA run), its own."""
    fits = source_cfg.lora == cfg.lora
    if fits:
        try:
            canonical.check_params(cfg, source_params)
        except ZooError:  # these adapters over another model: a LoRA run to merge first
            fits = False
    if fits:
        return source_params
    if source_cfg.lora is not None:
        raise ZooError(
            "the --init-from checkpoint has adapters of its own "
            f"(rank {source_cfg.lora.rank} on {', '.join(source_cfg.lora.targets)}); merge them into "
            "its weights first with `zoo export RUN --merge --out DIR` and start from DIR"
        )
    base = dataclasses.replace(cfg, lora=None)
    canonical.check_params(base, source_params)
    flat = flat_by_path(source_params)
    flat.update(flat_by_path(canonical.init_adapters(cfg, seed)))
    return nest_by_path(flat)


def adapters_of(params: dict) -> dict:
    """The adapter leaves of canonical params: what a LoRA run's checkpoints hold."""
    return nest_by_path({p: x for p, x in flat_by_path(params).items() if is_adapter_path(p)})
