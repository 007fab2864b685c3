"""Small jaxpr utilities: walk equations recursively, collect checkpoint names, count."""

from __future__ import annotations

from collections.abc import Iterator

import jax
from jax.extend import core as jcore


def _sub_jaxprs(eqn) -> Iterator:
    for value in eqn.params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, jcore.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jcore.Jaxpr):
                yield item


def iter_eqns(jaxpr) -> Iterator:
    """Every equation of ``jaxpr`` and of the jaxprs nested in it (scan, remat, pjit, cond...)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _sub_jaxprs(eqn):
            yield from iter_eqns(sub)


def checkpoint_names(fn, *args, **kwargs) -> set[str]:
    """The ``checkpoint_name`` labels that tracing ``fn(*args)`` produces, at any depth."""
    jaxpr = jax.make_jaxpr(fn)(*args, **kwargs)
    return {eqn.params["name"] for eqn in iter_eqns(jaxpr) if eqn.primitive.name == "name"}


def count_eqns(fn, *args, recursive: bool = True, **kwargs) -> int:
    jaxpr = jax.make_jaxpr(fn)(*args, **kwargs)
    if recursive:
        return sum(1 for _ in iter_eqns(jaxpr))
    return len(jaxpr.jaxpr.eqns)
