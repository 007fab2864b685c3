"""Model presets and backends: "mlp-s", "transformer-s", ... -> config, per-backend class."""

from __future__ import annotations

from zoo.configs import MLPConfig, ModelConfig, TransformerConfig, replace_checked
from zoo.errors import ZooError, check_choice, choice_error

BACKENDS = ("nnx", "eqx")

PRESETS: dict[str, ModelConfig] = {
    "mlp-s": MLPConfig(d_in=64, d_hidden=128, num_layers=1, num_classes=10),
    "mlp-m": MLPConfig(d_in=64, d_hidden=256, num_layers=2, num_classes=10),
    "mlp-mnist": MLPConfig(d_in=784, d_hidden=512, num_layers=1, num_classes=10),
    "transformer-xs": TransformerConfig(
        vocab_size=128, d_model=64, num_heads=4, d_ff=256, num_layers=2, max_len=64
    ),
    "transformer-s": TransformerConfig(
        vocab_size=128, d_model=128, num_heads=4, d_ff=512, num_layers=4, max_len=128
    ),
    "transformer-digits": TransformerConfig(
        d_in=8, num_classes=10, d_model=64, num_heads=4, d_ff=128, num_layers=2, max_len=8
    ),
}

DESCRIPTIONS = {
    "mlp-s": "64-128-128-10 classifier MLP (8x8 digits)",
    "mlp-m": "64-256-256-256-10 classifier MLP",
    "mlp-mnist": "784-512-512-10 classifier MLP (28x28 images)",
    "transformer-xs": "2-layer d=64 char LM, context 64",
    "transformer-s": "4-layer d=128 char LM, context 128",
    "transformer-digits": "2-layer d=64 sequence classifier over the 8 rows of a digit",
}


def get_config(name: str | ModelConfig, **overrides) -> ModelConfig:
    """Preset config by name, with field overrides (``num_layers=8``, ``d_model=256``...)."""
    if isinstance(name, (MLPConfig, TransformerConfig)):
        cfg = name
    elif name in PRESETS:
        cfg = PRESETS[name]
    else:
        raise choice_error("model preset", name, PRESETS)
    return replace_checked(cfg, **overrides) if overrides else cfg


def check_backend(backend: str) -> str:
    return check_choice("backend", backend, BACKENDS)


def module_class(cfg: ModelConfig, backend: str):
    """The NNX or Equinox class implementing ``cfg``."""
    check_backend(backend)
    if backend == "nnx":
        from zoo.models import nnx as impl
    else:
        from zoo.models import eqx as impl
    if isinstance(cfg, MLPConfig):
        return impl.MLP
    if isinstance(cfg, TransformerConfig):
        return impl.Transformer
    raise ZooError(f"not a model config: {cfg!r}")
