"""Canonical paths: a nested dict of arrays keyed by path, flat or nested. A leaf module: it
imports nothing from ``zoo.models``, so anything may use it."""

from __future__ import annotations

import jax

Path = tuple[str, ...]


def dotted(path: Path) -> str:
    return ".".join(path)


def get_path(tree: dict, path: Path):
    for key in path:
        tree = tree[key]
    return tree


def nested(paths, values) -> dict:
    """A nested dict with ``values[i]`` at ``paths[i]`` (tuples of keys)."""
    out: dict = {}
    for path, value in zip(paths, values, strict=True):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def flat_by_path(tree) -> dict:
    """``{"blocks.attn.q.w": leaf, ...}``: a nested dict's leaves keyed by dotted path."""
    return {
        jax.tree_util.keystr(p, simple=True, separator="."): x
        for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def nest_by_path(flat) -> dict:
    """Inverse of :func:`flat_by_path`: a nested dict from a ``{dotted path: leaf}`` mapping."""
    return nested([path.split(".") for path in flat], list(flat.values()))
