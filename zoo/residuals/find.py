"""Find what a function keeps for its backward pass: each residual of ``jax.vjp``, traced back
through layout ops, ``jit`` calls and ``lax.scan`` to where it was made (see
:mod:`zoo.residuals`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
from jax.extend import core as jcore

from zoo.jaxprs import call_jaxpr, scan_counts

DEVICE = "device"
HOST = "pinned_host"

# Primitives that move or re-tag a value without computing a new one: a residual produced by
# one of these is reported under the name of its input.
_PASS_THROUGH = {"reduce_precision", "device_put", "copy", "copy_p", "optimization_barrier"}
# Primitives that only change a value's layout; a parameter seen through them is still a
# parameter (e.g. LayerNorm's scale reshaped to [1, 1, D], or Equinox's transposed weights).
_LAYOUT = {"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "convert_element_type"}


@dataclass(frozen=True)
class Origin:
    """Where a residual was made: its activation name (or primitive, or ``param PATH``)."""

    name: str
    kind: str  # "activation" | "param" | "input" | "constant"
    source: str = ""
    named: bool = False  # carries a checkpoint name (or is the block input)


@dataclass(frozen=True)
class Found:
    """One residual of :func:`find_residuals`, followed back to its :class:`Origin`."""

    origin: Origin
    count: int  # how many copies the residual stacks (scan length product)
    stacked: bool  # passed through a scan's per-step outputs (one leading axis per scan)
    shape: tuple[int, ...]  # one copy's shape
    dtype: str
    memory_kind: str  # "device" or "pinned_host"


def _summarize(eqn) -> str:
    try:
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - the summary is a convenience only
        return ""


def _input_name(var, jaxpr) -> str | None:
    """The checkpoint name a jaxpr input is given where it is first used, following it into
    calls and scan carries (the block input is tagged ``layer_input`` inside the body)."""
    for eqn in jaxpr.eqns:
        for pos, invar in enumerate(eqn.invars):
            if invar is not var:
                continue
            if eqn.primitive.name == "name":
                return eqn.params["name"]
            sub = call_jaxpr(eqn)
            if sub is None and eqn.primitive.name == "scan":
                sub = eqn.params["jaxpr"].jaxpr
            if sub is not None and pos < len(sub.invars):
                found = _input_name(sub.invars[pos], sub)
                if found:
                    return found
    return None


class _Frame:
    """One jaxpr being walked, and how its inputs map onto the enclosing jaxpr."""

    def __init__(
        self,
        jaxpr,
        parent: _Frame | None = None,
        outer_eqn=None,
        top_inputs: Callable[[int], Origin] | None = None,
    ):
        self.jaxpr = jaxpr
        self.parent = parent
        self.outer_eqn = outer_eqn
        self.top_inputs = top_inputs
        self.producer = {v: e for e in jaxpr.eqns for v in e.outvars}
        # a value that is passed straight to ``checkpoint_name`` is that named tensor
        self.named_as = {
            e.invars[0]: e.params["name"]
            for e in jaxpr.eqns
            if e.primitive.name == "name" and not isinstance(e.invars[0], jcore.Literal)
        }
        self.invar_pos = {v: i for i, v in enumerate(jaxpr.invars)}
        self.constvars = set(jaxpr.constvars)

    def resolve(self, var, count: int = 1, stacked: int = 0) -> tuple[Origin, int, int]:
        """``(origin, copies, scan levels)`` of ``var``: where it was made, how many copies
        enclosing scans stack, and how many leading scan axes its shape carries."""
        if isinstance(var, jcore.Literal):
            return Origin("literal", "constant"), count, stacked
        if var in self.producer:
            return self._from_eqn(self.producer[var], var, count, stacked)
        if var in self.invar_pos:
            return self._from_input(self.invar_pos[var], var, count, stacked)
        if var in self.constvars:
            kind = "input" if self.parent is None else "constant"
            return Origin("batch input" if kind == "input" else "constant", kind), count, stacked
        return Origin("unknown", "activation"), count, stacked

    def _from_input(self, pos: int, var, count: int, stacked: int):
        if self.parent is None:
            return self.top_inputs(pos), count, stacked
        eqn = self.outer_eqn
        if eqn.primitive.name == "scan":
            num_consts, num_carry = scan_counts(eqn)
            if num_consts <= pos < num_consts + num_carry:  # the carry: a block (or group) input
                name = _input_name(var, self.jaxpr)
                return (
                    Origin(name or "scan carry", "activation", "scan carry", named=bool(name)),
                    count,
                    stacked,
                )
        origin, _, _ = self.parent.resolve(eqn.invars[pos])
        return origin, count, stacked

    def _from_eqn(self, eqn, var, count: int, stacked: int):
        prim = eqn.primitive.name
        src = _summarize(eqn)
        if prim == "name":
            return Origin(eqn.params["name"], "activation", src, named=True), count, stacked
        if var in self.named_as:
            return Origin(self.named_as[var], "activation", src, named=True), count, stacked
        if prim in _PASS_THROUGH:
            return self.resolve(eqn.invars[0], count, stacked)
        if prim in _LAYOUT:
            origin, _, _ = self.resolve(eqn.invars[0])
            if origin.kind in ("param", "input", "constant"):
                return origin, count, stacked
            return Origin(prim, "activation", src), count, stacked
        if prim == "scan":
            pos = eqn.outvars.index(var)
            _, num_carry = scan_counts(eqn)
            body = eqn.params["jaxpr"].jaxpr
            child = _Frame(body, self, eqn)
            if pos < num_carry:  # final carry: the output of the last step
                return Origin("scan output", "activation", src), count, stacked
            return child.resolve(body.outvars[pos], count * eqn.params["length"], stacked + 1)
        sub = call_jaxpr(eqn)
        if sub is not None:
            pos = eqn.outvars.index(var)
            child = _Frame(sub, self, eqn)
            origin, count, stacked = child.resolve(sub.outvars[pos], count, stacked)
            if origin.kind == "activation" and not origin.named and "name" in eqn.params:
                origin = Origin(f"{prim}({eqn.params['name']})", "activation", src)
            return origin, count, stacked
        return Origin(prim, "activation", src), count, stacked


def _depends_on_inputs(jaxpr, live_inputs=None) -> set:
    """Vars of ``jaxpr`` that depend on at least one of its (live) inputs, looking inside
    calls output by output (a ``jit`` may return both a mask built from constants and a
    value computed from the inputs)."""
    dep = set(jaxpr.invars if live_inputs is None else live_inputs)
    for eqn in jaxpr.eqns:
        live = [not isinstance(v, jcore.Literal) and v in dep for v in eqn.invars]
        if not any(live):
            continue
        sub = call_jaxpr(eqn)
        if sub is None:
            dep.update(eqn.outvars)
            continue
        inner = _depends_on_inputs(sub, [v for v, on in zip(sub.invars, live, strict=True) if on])
        dep.update(
            o
            for o, i in zip(eqn.outvars, sub.outvars, strict=True)
            if not isinstance(i, jcore.Literal) and i in inner
        )
    return dep


def _memory_kind(aval) -> str:
    space = getattr(aval, "memory_space", None)
    label = getattr(space, "name", str(space)).lower()
    return HOST if "host" in label else DEVICE


def find_residuals(
    fn: Callable,
    *args,
    const_args: tuple = (),
    input_origin: Callable[[int], Origin] | None = None,
    loop_invariant_kind: bool = False,
) -> list[Found]:
    """Residuals of ``vjp(lambda *a: fn(*a, *const_args), *args)``, each followed to its origin.

    ``args`` and ``const_args`` may be arrays or ``jax.ShapeDtypeStruct``: only shapes are
    traced, nothing runs. ``const_args`` are inputs that are not differentiated (a batch).
    ``input_origin(i)`` describes flattened input ``i`` (the leaves of ``args`` then of
    ``const_args``; default: a parameter). With ``loop_invariant_kind``, residuals that depend
    on no input are marked ``constant``: inside a scan they are hoisted out of the loop and
    kept once, not once per step.
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    const_leaves, const_tree = jax.tree_util.tree_flatten(const_args)
    num_diff = len(leaves)

    def traced(*xs):
        consts = jax.tree_util.tree_unflatten(const_tree, xs[num_diff:])

        def flat(*diff):
            return fn(*jax.tree_util.tree_unflatten(tree, diff), *consts)

        return jax.vjp(flat, *xs[:num_diff])

    closed, shapes = jax.make_jaxpr(traced, return_shape=True)(*leaves, *const_leaves)
    jaxpr = closed.jaxpr
    num_res = len(jax.tree_util.tree_leaves(shapes[1]))
    res_vars = jaxpr.outvars[len(jaxpr.outvars) - num_res :]
    frame = _Frame(jaxpr, top_inputs=input_origin or (lambda i: Origin("param", "param")))
    live = _depends_on_inputs(jaxpr) if loop_invariant_kind else None
    found = []
    for var in res_vars:
        origin, count, stacked = frame.resolve(var)
        if origin.kind == "constant" and origin.name == "literal":
            continue  # 0-d literal constants: no memory worth reporting
        if live is not None and origin.kind == "activation" and var not in live:
            origin = Origin(origin.name, "constant", origin.source)
        shape = tuple(var.aval.shape)[stacked:]  # one copy: drop the leading scan axes
        found.append(Found(origin, count, stacked > 0, shape, str(var.aval.dtype), _memory_kind(var.aval)))
    return found
