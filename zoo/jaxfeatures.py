"""What the installed JAX has, of the features zoo uses that came after its oldest supported JAX
(0.10.2, the TPU image's: pyproject.toml's range, ``make test-oldest``).

A feature the installed JAX lacks is taken another way where one exists (chunked attention's
remat rule, ``zoo.models.attention.available_rules``) and refused in one line that names the
version it needs where none does (:func:`require`)."""

from __future__ import annotations

import inspect

import jax


def _vjp3() -> bool:
    return hasattr(jax.config, "jax_custom_vjp3")


# name: (the JAX it needs, whether the installed JAX has it)
FEATURES = {
    "custom_vjp.defremat": ("JAX >= 0.12.0", lambda: _vjp3() and hasattr(jax.custom_vjp, "defremat")),
    "custom_gradient(remat=True)": (
        "JAX >= 0.12.0",
        lambda: _vjp3() and "remat" in inspect.signature(jax.custom_gradient).parameters,
    ),
}


def has(feature: str) -> bool:
    """Whether the installed JAX has ``feature`` (a key of :data:`FEATURES`)."""
    return FEATURES[feature][1]()


def require(feature: str, what: str, instead: str = "") -> None:
    """A ValueError, one line, where the installed JAX lacks ``feature``: ``what`` needs it, the
    JAX version it came in, the installed one, and ``instead`` (what to use here) if given."""
    if not has(feature):
        tail = f"; {instead}" if instead else ""
        raise ValueError(
            f"{what} needs {FEATURES[feature][0]} ({feature}); installed: JAX {jax.__version__}{tail}"
        )
