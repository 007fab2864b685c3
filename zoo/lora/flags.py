"""The ``--lora`` flag and the ``[lora]`` recipe section: parse the flag, check the section
against ``[freeze]`` (see :mod:`zoo.lora`)."""

from __future__ import annotations

from zoo.configs import FreezeConfig, LoraConfig
from zoo.errors import ZooError

FLAG_KEYS = {"rank": int, "alpha": float, "targets": str}


def parse_flag(text: str) -> dict:
    """``rank=8,alpha=16,targets=attn.q|attn.v`` -> ``{"lora.rank": 8, ...}``."""
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in FLAG_KEYS:
            raise ZooError(
                f"--lora {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(FLAG_KEYS)} "
                "(e.g. --lora rank=8,alpha=16,targets=attn.q|attn.v)"
            )
        if key == "targets":
            values["lora.targets"] = [t.strip() for t in value.split("|") if t.strip()]
            continue
        try:
            values[f"lora.{key}"] = FLAG_KEYS[key](value)
        except ValueError:
            raise ZooError(f"--lora {key}={value!r} is not a {FLAG_KEYS[key].__name__}") from None
    if "lora.rank" not in values:
        raise ZooError(f"--lora {text!r} names no rank (e.g. --lora rank=8,targets=attn.q|attn.v)")
    return values


def section_from_flag(text: str) -> LoraConfig:
    """The ``[lora]`` section a ``--lora`` flag describes (unset keys at their defaults)."""
    values = {key.split(".", 1)[1]: value for key, value in parse_flag(text).items()}
    if "targets" in values:
        values["targets"] = tuple(values["targets"])
    return LoraConfig(**values)


def check_section(section: LoraConfig, freeze: FreezeConfig, init_from: str | None) -> None:
    """A ``[lora]`` section needs a base (``model.init_from``) and no freeze patterns."""
    if not section.enabled:
        return
    if not init_from:
        raise ZooError(
            "--lora adapts a trained model: give its run directory with --init-from DIR "
            "(or model.init_from in the recipe)"
        )
    if freeze.patterns:
        raise ZooError(
            f"--lora already freezes the whole base; freeze.patterns {list(freeze.patterns)} "
            "would have nothing left to freeze: drop --freeze"
        )
