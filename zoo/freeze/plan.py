"""The freeze plan: which canonical leaves and stack rows are frozen, and the exact split and
merge of a canonical tree (see :mod:`zoo.freeze`)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import jax.numpy as jnp
import numpy as np

from zoo.checks import is_int
from zoo.errors import ZooError
from zoo.freeze.patterns import Pattern, parse_pattern
from zoo.models.paths import flat_by_path, nest_by_path
from zoo.models.registry import STACK  # top-level key of the scanned stack in the canonical tree


def _runs(flags: Sequence[bool]) -> list[tuple[bool, int, int]]:
    """Maximal runs of equal flags: [(flag, start, stop), ...]."""
    out: list[tuple[bool, int, int]] = []
    for i, flag in enumerate(flags):
        if out and out[-1][0] == flag:
            out[-1] = (flag, out[-1][1], i + 1)
        else:
            out.append((flag, i, i + 1))
    return out


def _concat_rows(pieces):
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=0)


def _count(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _span_text(rows: Sequence[int]) -> str:
    """(0, 1, 3) -> '0:2,3:4'."""
    return ",".join(f"{a}:{b}" for flag, a, b in _runs([i in rows for i in range(max(rows) + 1)]) if flag)


@dataclass(frozen=True)
class Trainable:
    """How much of one canonical leaf trains (:meth:`FreezePlan.trainable`).

    ``layers``: the trainable layers of a stacked leaf (every one of ``num_layers`` when it
    trains whole; ``()`` when frozen); ``None`` for a non-stacked leaf, which trains whole or
    not at all (``whole``). ``str()`` is what a parameter table prints: ``yes``, ``no`` or, for
    a partly frozen stacked leaf, the trainable layers as slices (``layers 2:4 of 4``,
    ``layers 0:1,3:4 of 4``).
    """

    whole: bool  # every scalar of the leaf trains
    layers: tuple[int, ...] | None = None
    num_layers: int = 0

    @property
    def none(self) -> bool:
        """No scalar of the leaf trains."""
        return not self.whole and not self.layers

    @property
    def partial(self) -> bool:
        """Some layers of a stacked leaf train and some are frozen."""
        return not self.whole and bool(self.layers)

    def __str__(self) -> str:
        if self.whole:
            return "yes"
        if self.none:
            return "no"
        return f"layers {_span_text(self.layers)} of {self.num_layers}"


@dataclass(frozen=True)
class FreezePlan:
    """Which canonical leaves, and which rows of stacked leaves, are frozen.

    ``shapes``: every canonical leaf (dotted path -> shape).
    ``frozen_rows``: stacked leaves (under ``blocks``) with at least one frozen layer ->
    the sorted frozen layer indices. A leaf listing all ``num_layers`` rows is fully frozen.
    ``frozen_leaves``: non-stacked leaves that are frozen (always whole).
    ``frozen_prefix``: the largest k such that layers [0:k) of every stacked leaf are frozen;
    pass it to :class:`zoo.scan.StackPlan` (see :meth:`stack_plan`) so those layers run as a
    separate scan on ``stop_gradient`` weights.

    :meth:`split` gives ``(trainable, frozen)`` nested dicts. Fully trainable leaves are only in
    ``trainable``, fully frozen ones only in ``frozen``; a partly frozen stacked leaf appears in
    both, ``trainable`` holding its trainable rows and ``frozen`` its frozen rows, each in
    ascending layer order. Subtrees left empty are omitted.
    """

    shapes: Mapping[str, tuple[int, ...]]
    frozen_rows: Mapping[str, tuple[int, ...]]
    frozen_leaves: frozenset[str]
    num_layers: int
    frozen_prefix: int
    patterns: tuple[Pattern, ...] = field(default=())

    def __hash__(self) -> int:  # hashable, so a plan can be a static argument of jit
        return hash(
            (
                tuple(self.shapes.items()),
                tuple(sorted(self.frozen_rows.items())),
                self.frozen_leaves,
                self.num_layers,
                self.frozen_prefix,
            )
        )

    # --- per-leaf status

    def _check(self, dotted_path: str) -> None:
        if dotted_path not in self.shapes:
            raise _no_such_path(dotted_path, self.shapes)

    def trainable_rows(self, dotted_path: str) -> tuple[int, ...] | None:
        """Trainable layer indices of a stacked leaf; ``None`` for a non-stacked leaf."""
        self._check(dotted_path)
        if not _is_stacked(dotted_path):
            return None
        frozen = set(self.frozen_rows.get(dotted_path, ()))
        return tuple(i for i in range(self.num_layers) if i not in frozen)

    def trainable(self, dotted_path: str) -> Trainable:
        """How much of one leaf trains: whole, not at all, or some layers of a stacked leaf."""
        self._check(dotted_path)
        rows = self.trainable_rows(dotted_path)
        if rows is None:
            return Trainable(dotted_path not in self.frozen_leaves)
        return Trainable(len(rows) == self.num_layers, rows, self.num_layers)

    def frozen_count_of(self, dotted_path: str) -> int:
        """Frozen scalars in one leaf."""
        self._check(dotted_path)
        shape = self.shapes[dotted_path]
        if dotted_path in self.frozen_leaves:
            return _count(shape)
        return len(self.frozen_rows.get(dotted_path, ())) * _count(shape[1:])

    @property
    def total_count(self) -> int:
        return sum(_count(s) for s in self.shapes.values())

    @property
    def frozen_count(self) -> int:
        """Number of frozen scalars."""
        return sum(self.frozen_count_of(p) for p in self.shapes)

    @property
    def trainable_count(self) -> int:
        """Number of trainable scalars."""
        return self.total_count - self.frozen_count

    def stack_plan(self, policy="none"):
        """A :class:`zoo.scan.StackPlan` running the frozen prefix as its own gradient-free scan."""
        from zoo.remat import get_policy
        from zoo.scan import StackPlan

        return StackPlan(get_policy(policy), frozen_prefix=self.frozen_prefix)

    # --- split / merge

    def _row_runs(self, dotted_path: str) -> list[tuple[bool, int, int]]:
        """Runs of (is_frozen, start, stop) over the layers of a stacked leaf."""
        frozen = set(self.frozen_rows.get(dotted_path, ()))
        return _runs([i in frozen for i in range(self.num_layers)])

    def split(self, params: dict) -> tuple[dict, dict]:
        """Canonical params -> ``(trainable, frozen)``. Static structure: works under ``jit``."""
        flat = self._flat_checked(params, "params")
        trainable, frozen = {}, {}
        for path, x in flat.items():
            if path in self.frozen_leaves:
                frozen[path] = x
                continue
            if path not in self.frozen_rows:
                trainable[path] = x
                continue
            runs = self._row_runs(path)
            if len(runs) == 1:  # every row frozen
                frozen[path] = x
                continue
            frozen[path] = _concat_rows([x[a:b] for is_frozen, a, b in runs if is_frozen])
            trainable[path] = _concat_rows([x[a:b] for is_frozen, a, b in runs if not is_frozen])
        return nest_by_path(trainable), nest_by_path(frozen)

    def merge(self, trainable: dict, frozen: dict) -> dict:
        """Exact inverse of :meth:`split`: rows go back in layer order by static slicing and
        concatenation, so the result is bitwise equal to the original and its gradient with
        respect to ``trainable`` is the corresponding rows of the full gradient."""
        t_flat, f_flat = flat_by_path(trainable), flat_by_path(frozen)
        expected_t = {p for p in self.shapes if not self.trainable(p).none}
        expected_f = {p for p in self.shapes if self.frozen_count_of(p)}
        for name, got, want in (("trainable", t_flat, expected_t), ("frozen", f_flat, expected_f)):
            if set(got) != want:
                raise ZooError(
                    f"FreezePlan.merge: the {name} tree does not fit the plan: missing "
                    f"{sorted(want - set(got)) or 'none'}; unexpected {sorted(set(got) - want) or 'none'}"
                )
        out = {}
        for path in self.shapes:
            if path not in f_flat:
                out[path] = t_flat[path]
            elif path not in t_flat:
                out[path] = f_flat[path]
            else:
                pieces, offsets = [], {True: 0, False: 0}
                for is_frozen, a, b in self._row_runs(path):
                    source = f_flat[path] if is_frozen else t_flat[path]
                    start = offsets[is_frozen]
                    pieces.append(source[start : start + b - a])
                    offsets[is_frozen] = start + b - a
                out[path] = _concat_rows(pieces)
        return nest_by_path(out)

    def _flat_checked(self, params: dict, what: str) -> dict:
        flat = flat_by_path(params)
        if set(flat) != set(self.shapes):
            raise ZooError(
                f"FreezePlan: {what} do not fit the plan: missing "
                f"{sorted(set(self.shapes) - set(flat)) or 'none'}; unexpected "
                f"{sorted(set(flat) - set(self.shapes)) or 'none'}"
            )
        return flat


# ----------------------------------------------------------------------------- resolve


def _is_stacked(dotted_path: str) -> bool:
    return dotted_path.split(".", 1)[0] == STACK


def _ancestors(paths) -> list[str]:
    """Every path and every segment prefix of it, sorted."""
    out = set()
    for path in paths:
        segments = path.split(".")
        out.update(".".join(segments[:n]) for n in range(1, len(segments) + 1))
    return sorted(out)


def _no_such_path(dotted_path: str, shapes) -> ZooError:
    close = difflib.get_close_matches(dotted_path, list(shapes), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ZooError(f"unknown parameter path {dotted_path!r}.{hint} Available: {', '.join(shapes)}.")


def _no_match(pattern: Pattern, shapes) -> ZooError:
    candidates = _ancestors(shapes)
    probe = pattern.text.strip()
    close = difflib.get_close_matches(probe, candidates, n=3, cutoff=0.5)
    close = close or difflib.get_close_matches(pattern.path, candidates, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ZooError(
        f"freeze pattern {pattern.text!r} matches no parameter.{hint} Available paths: {', '.join(shapes)}."
    )


def _is_shape(value) -> bool:
    return isinstance(value, (tuple, list)) and all(is_int(d) for d in value)


def _shapes_of(params_or_shapes) -> dict[str, tuple[int, ...]]:
    if not isinstance(params_or_shapes, Mapping):
        raise ZooError(
            "resolve_freeze wants a canonical params tree or a {dotted path: shape} dict, got "
            f"{type(params_or_shapes).__name__}"
        )
    if params_or_shapes and all(_is_shape(v) for v in params_or_shapes.values()):
        return {str(k): tuple(int(d) for d in v) for k, v in params_or_shapes.items()}
    return {path: tuple(x.shape) for path, x in flat_by_path(params_or_shapes).items()}


def _stack_depth(shapes: Mapping[str, tuple[int, ...]], num_layers: int | None) -> int:
    depths = {p: s[0] for p, s in shapes.items() if _is_stacked(p) and s}
    found = set(depths.values())
    if len(found) > 1:
        raise ZooError(f"leaves under '{STACK}' disagree on the number of layers: {depths}")
    if num_layers is not None:
        if found and found != {num_layers}:
            raise ZooError(
                f"num_layers={num_layers} does not match the stacked params, which have {found.pop()} layers"
            )
        return num_layers
    return found.pop() if found else 0


def resolve_freeze(
    params_or_shapes, patterns: Sequence[str] | str, num_layers: int | None = None
) -> FreezePlan:
    """Resolve freeze patterns (OR-ed) against canonical params, abstract params
    (``ShapeDtypeStruct`` leaves) or a ``{dotted path: shape}`` dict as from
    :func:`zoo.models.canonical.canonical_shapes`.

    Raises :class:`ZooError` naming the pattern when one is malformed, puts a layer range
    anywhere but right after ``blocks``, gives a range that selects no layer, or matches no
    parameter (then the available paths and close matches are listed).
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    shapes = _shapes_of(params_or_shapes)
    depth = _stack_depth(shapes, num_layers)
    parsed = tuple(parse_pattern(p) for p in patterns)

    frozen_leaves: set[str] = set()
    rows: dict[str, set[int]] = {}
    for pattern in parsed:
        if pattern.layers is not None and not depth:
            raise ZooError(
                f"freeze pattern {pattern.text!r} has a layer range, but the params have no '{STACK}' stack"
            )
        selected_rows = pattern.rows(depth) if depth else ()
        hits = [p for p in shapes if pattern.selects(p)]
        if not hits:
            raise _no_match(pattern, shapes)
        for path in hits:
            if _is_stacked(path):
                rows.setdefault(path, set()).update(selected_rows)
            else:
                frozen_leaves.add(path)

    return plan_of(shapes, frozen_leaves, rows, depth, parsed)


def plan_of(shapes, frozen_leaves, rows: Mapping[str, set[int]], depth: int, patterns=()) -> FreezePlan:
    """The plan freezing the non-stacked ``frozen_leaves`` and, of each stacked leaf in
    ``rows``, those layers; the frozen prefix is worked out here."""
    frozen_rows = {p: tuple(sorted(r)) for p, r in rows.items() if r}
    stacked = [p for p in shapes if _is_stacked(p)]
    prefix = 0
    if stacked:
        while prefix < depth and all(prefix in rows.get(p, ()) for p in stacked):
            prefix += 1
    return FreezePlan(
        shapes=MappingProxyType(dict(shapes)),
        frozen_rows=MappingProxyType(frozen_rows),
        frozen_leaves=frozenset(frozen_leaves),
        num_layers=depth,
        frozen_prefix=prefix,
        patterns=tuple(patterns),
    )
