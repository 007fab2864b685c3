"""Small jaxpr utilities, the one place zoo walks jaxprs: the jaxprs nested in an equation,
every equation at any depth, the body of a call-like equation, a scan's operand counts, and
the counts and names the tests and the residual inspector read."""

from __future__ import annotations

import re
from collections.abc import Iterator

import jax
from jax.extend import core as jcore


def sub_jaxprs(eqn) -> Iterator:
    """The jaxprs nested in ``eqn``'s params (a scan's body, a cond's branches, a pjit's callee)."""
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
        for sub in sub_jaxprs(eqn):
            yield from iter_eqns(sub)


def call_jaxpr(eqn):
    """The body of a call-like equation (``pjit``, ``remat``, ``custom_vjp_call``...) whose
    inputs and outputs line up one to one with the equation's, or None."""
    for key in ("jaxpr", "call_jaxpr"):
        sub = eqn.params.get(key)
        if sub is None:
            continue
        inner = getattr(sub, "jaxpr", sub)
        if (
            isinstance(inner, jcore.Jaxpr)
            and len(inner.invars) == len(eqn.invars)
            and len(inner.outvars) == len(eqn.outvars)
        ):
            return inner
    return None


def scan_counts(eqn) -> tuple[int, int]:
    """(number of consts, number of carries) of a ``scan`` equation, across JAX versions."""
    if "num_consts" in eqn.params:
        return eqn.params["num_consts"], eqn.params["num_carry"]
    consts, carry, _ = eqn.params["ft_in"].unpack()
    return len(consts), len(carry)


def checkpoint_names(fn, *args, **kwargs) -> set[str]:
    """The ``checkpoint_name`` labels that tracing ``fn(*args)`` produces, at any depth."""
    jaxpr = jax.make_jaxpr(fn)(*args, **kwargs)
    return {eqn.params["name"] for eqn in iter_eqns(jaxpr) if eqn.primitive.name == "name"}


def count_eqns(fn, *args, recursive: bool = True, **kwargs) -> int:
    """How many equations tracing ``fn(*args)`` gives: at every depth, or (``recursive=False``)
    at the top level only."""
    jaxpr = jax.make_jaxpr(fn)(*args, **kwargs)
    if recursive:
        return sum(1 for _ in iter_eqns(jaxpr))
    return len(jaxpr.jaxpr.eqns)


def in_scope(eqn, scope: str) -> bool:
    """Whether ``eqn`` was traced inside ``jax.named_scope(scope)``, under any transform
    (``jvp(...)``, ``transpose(...)``: the scope's name is one of its name stack's parts)."""
    return scope in re.split(r"[()/]", str(eqn.source_info.name_stack))


_HAND_OFFS = ("convert_element_type", "add_any")


def scope_float_dtypes(jaxpr, scopes) -> dict[str, set[str]]:
    """Per named scope, the dtypes of the floating values that the arithmetic of ``jaxpr`` (a
    traced program, at any depth) makes inside it: every equation there but the dtype
    conversions (a scope hands its result back in another dtype), the sums of cotangents
    (``add_any``: a cotangent has its primal's dtype, so those of a scope's bf16 inputs are
    bf16) and the calls (their bodies are walked). An empty set: nothing was traced there."""
    found: dict[str, set[str]] = {scope: set() for scope in scopes}
    for eqn in iter_eqns(jaxpr):
        if eqn.primitive.name in _HAND_OFFS or any(True for _ in sub_jaxprs(eqn)):
            continue
        for scope in found:
            if in_scope(eqn, scope):
                found[scope].update(
                    str(v.aval.dtype)
                    for v in eqn.outvars
                    if jax.numpy.issubdtype(getattr(v.aval, "dtype", bool), jax.numpy.floating)
                )
    return found
