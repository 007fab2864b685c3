"""The hooks ghost clipping runs the model under, and the sites found by tracing it.

A *site* is one parametrised op of the model (``zoo.models.ops``), named by the canonical
path of its parameters (``blocks.attn.q``). Nothing here knows a model: sites, their kinds,
parameter leaves and output shapes come from running the model's own forward under
``jax.eval_shape`` with recording hooks (:func:`discover`). Three modes:

* ``record``: note each op's site, kind, leaves and output shape.
* ``probe``: add a zero probe to the output of each active site, and keep the op's input. The
  gradient of ``sum_i L_i`` with respect to a probe is the per-example output gradient.
* ``tap``: route the output through a norm tap (:mod:`zoo.dp.ghost.taps`), whose backward
  rule turns the op's input (a residual, saved or recomputed as the remat policy says) and its
  output gradient into per-example squared norms, and hands them (and, for book-keeping, what
  the clipped sum needs) out as the gradient of the site's slot.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo import hooks
from zoo.dp.ghost.rules import SHARED
from zoo.dp.ghost.taps import FIRST, SECOND, tap
from zoo.models import canonical
from zoo.models.paths import flat_by_path
from zoo.models.registry import STACK
from zoo.remat import get_policy
from zoo.scan import StackPlan


@dataclass(frozen=True)
class Site:
    """One parametrised op: canonical path, op kind, parameter leaves, and for stacked sites
    (inside the scanned stack) one entry for all layers. ``shape`` is the op's output shape
    for one layer; ``rows`` the table height of a ``gather`` or ``rows`` op."""

    path: str
    kind: str
    leaves: tuple[str, ...]
    stacked: bool
    shape: tuple[int, ...]
    rows: int | None = None

    @property
    def key(self) -> str:
        """Its name among the probes, taps and rules: the path, or ``path@kind`` for the op
        that reads a leaf a second time (a head tied to the token table)."""
        return site_key(self.path, self.kind)


_SECOND = {second for _, second in SHARED}


def site_key(path: str, kind: str) -> str:
    return f"{path}@{kind}" if kind in _SECOND else path


def _aval(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


class GhostHooks(hooks.LayerHooks):
    """Hooks of one mode (``record``, ``probe``, ``tap``) for the top level of the model or
    one layer of its stack.

    ``paths`` maps ``id`` of each parameter array the model reads to its dotted canonical
    path; ``arrays`` holds the probes or the taps' slots by site key; ``specs`` the taps
    (:class:`zoo.dp.ghost.taps.Tap`); ``found`` (shared by all layers) collects what ``record``
    sees, and in ``probe`` mode each site's output dtype and the shapes of its input and output.
    """

    def __init__(self, mode, paths, arrays=None, specs=None, found=None, stacked=False):
        self.mode, self.paths, self.stacked = mode, paths, stacked
        self.arrays, self.specs = arrays or {}, specs or {}
        self.found = found if found is not None else {"top": None, "layers": [], "unknown": []}
        self.sites: list[Site] = []  # what this instance recorded (one trace of its code)
        if mode == "record":
            if stacked:
                self.found["layers"].append(self.sites)
            else:
                self.found["top"] = self.sites
        self.captures: dict = {}
        self.hits: dict[str, int] = {}  # probe/tap mode: how often each hooked site was reached
        self.first_inputs: dict = {}  # tap mode: the input of the first op reading a shared leaf

    def _site(self, params) -> str | None:
        """The site path of an op's parameters, or None when they are not canonical leaves
        read as they are (a transformed or unknown array)."""
        paths = {leaf: self.paths.get(id(v)) for leaf, v in params.items()}
        site = {p.rsplit(".", 1)[0] for p in paths.values() if p}
        if len(site) != 1 or any(p != f"{next(iter(site))}.{leaf}" for leaf, p in paths.items()):
            return None
        return site.pop()

    def op(self, kind, z, params, inputs):
        path = self._site(params)
        if self.mode == "record":
            if path is None:
                self.found["unknown"].append(kind)
            else:
                table = params["w"].shape[0] if kind in ("gather", "rows") else None
                self.sites.append(Site(path, kind, tuple(params), self.stacked, tuple(z.shape), table))
            return z
        key = None if path is None else site_key(path, kind)
        if key is None or key not in self.arrays:
            return z
        self.hits[key] = self.hits.get(key, 0) + 1
        if self.mode == "probe":
            if kind != "rows":
                self.captures[key] = inputs
            self.found.setdefault("dtypes", {})[key] = z.dtype  # the probe's dtype (stages.probe_pass)
            self.found.setdefault("avals", {})[key] = (_aval(inputs), _aval(z))  # one layer's, in a stack
            return z + self.arrays[key].astype(z.dtype)  # a float32 probe keeps a bf16 op bf16
        spec = self.specs[key]
        if spec.cross is not None and spec.cross[1] == FIRST:
            self.first_inputs[path] = inputs
        elif spec.cross is not None and spec.cross[1] == SECOND:
            inputs = (inputs, self.first_inputs[path])
        if spec.capture:
            self.captures[key] = inputs
        return tap(spec, z, inputs, self.arrays[key])

    def stack(self, stacked, frozen_prefix):
        outer = [self.paths.get(id(leaf)) for leaf in jax.tree_util.tree_leaves(stacked)]
        xs = {k: v for k, v in self.arrays.items() if k.startswith(STACK + ".")}
        return _Stack(self, outer, xs)

    def outputs(self):
        self.check_hits()
        return self.captures or None

    def check_hits(self) -> None:
        """Every probe or tap handed to these hooks was reached by exactly one op. A miss would
        leave a site out of the norm (a wrong norm, silently); so it is an error instead."""
        expected = {k for k in self.arrays if k.startswith(STACK + ".") == self.stacked}
        if {k: self.hits.get(k, 0) for k in expected} != dict.fromkeys(expected, 1):
            missed = sorted(k for k in expected if self.hits.get(k, 0) != 1)
            raise AssertionError(
                f"ghost clipping: the sites {missed} were not each reached once in the {self.mode} pass "
                f"(reached: {self.hits}); the model read its parameters differently than when traced"
            )


class _Stack(hooks.StackHooks):
    def __init__(self, top: GhostHooks, outer_paths, xs):
        self.top, self.outer_paths, self.xs = top, outer_paths, xs

    def layer(self, xs, layer_params):
        leaves = jax.tree_util.tree_leaves(layer_params)
        paths = {id(leaf): p for leaf, p in zip(leaves, self.outer_paths, strict=True) if p}
        t = self.top
        return GhostHooks(t.mode, paths, xs, t.specs, t.found, stacked=True)

    def finish(self, ys):
        if ys:
            self.top.captures.update(ys)


def leaf_ids(params) -> dict[int, str]:
    return {id(v): k for k, v in flat_by_path(params).items()}


def run(cfg, params, x, plan: StackPlan, mode=None, arrays=None, specs=None):
    """``(logits, hooks)`` of the model ``cfg`` on canonical ``params`` under ghost hooks.

    The model is the NNX implementation: it reads the canonical arrays as they are, which is
    how the hooks recognise them (both backends compute the same function; the tests check it).
    """
    # Sites are recognised by array identity: numpy leaves would be copied into new arrays on
    # their way into the model, so every leaf is made a jax array first (a no-op for jax arrays
    # and tracers).
    params = jax.tree_util.tree_map(jnp.asarray, params)
    model = canonical.from_canonical(cfg, "nnx", params)
    if mode is None:
        return model(x, remat=plan), None
    top = GhostHooks(mode, leaf_ids(params), arrays, specs)
    with hooks.active(top):
        logits = model(x, remat=plan)
    top.check_hits()
    return logits, top


@functools.lru_cache(maxsize=128)
def _discover(cfg, x_spec: jax.ShapeDtypeStruct, prefix: int):
    params = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    found = {}

    def forward(p, x):
        _, top = run(cfg, p, x, StackPlan(get_policy("none"), prefix), "record")
        found.update(top.found)
        return 0

    jax.eval_shape(forward, params, x_spec)
    layers = found["layers"]
    # The scan may trace its body more than once; every trace must see the same ops.
    if any(sites != layers[0] for sites in layers[1:]):
        raise AssertionError(f"the layer body recorded different sites on different traces: {layers}")
    return (*found["top"], *(layers[0] if layers else ())), tuple(found["unknown"])


def discover(cfg, x, prefix: int = 0) -> tuple[tuple[Site, ...], tuple[str, ...]]:
    """``(sites, unknown op kinds)`` of the model ``cfg`` on inputs shaped like ``x``, with the
    first ``prefix`` layers of the stack frozen (they run without hooks)."""
    spec = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    return _discover(cfg, spec, prefix)


def shared_pair(sites) -> bool:
    """Two top-level ops whose kinds may share a leaf (``rules.SHARED``: a token table and the
    head tied to it), in that order."""
    return len(sites) == 2 and not any(s.stacked for s in sites) and tuple(s.kind for s in sites) in SHARED


def coverage_problem(sites, unknown, trainable: set[str]) -> str | None:
    """Why the sites do not cover the trainable leaves exactly once each, or some op reads a
    parameter that is not a canonical leaf as it is (None when all is well).

    Not detected here: a leaf that one op claims and the model *also* uses outside the op set.
    The tests generated from the registry compare ghost clipping with vmap clipping for every
    registered kind, which is where such a model would fail."""
    claims: dict[str, list] = {}
    for site in sites:
        for leaf in site.leaves:
            claims.setdefault(f"{site.path}.{leaf}", []).append(site)
    unclaimed = sorted(trainable - set(claims))
    twice = sorted(p for p in trainable if len(claims.get(p, ())) > 1 and not shared_pair(claims[p]))
    problems = []
    if unclaimed:
        problems.append(f"no op of the model claims the trainable leaves {unclaimed}")
    if twice:
        problems.append(f"the leaves {twice} are read by more than one op")
    if unknown:  # e.g. a weight tied to another one through a transpose: its norm would be missed
        problems.append(
            f"{len(unknown)} {'/'.join(sorted(set(unknown)))} op(s) read arrays that are not canonical leaves as they are"
        )
    return "; ".join(problems) or None
