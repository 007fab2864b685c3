"""Training on a device mesh: mesh specs, sharding rules from the model registry's logical
axes, and the layout of a run's arrays (``jax.sharding``; no collectives of our own)."""

from zoo.parallel.layout import Layout, layout_for, process_rows
from zoo.parallel.mesh import AXES, BATCH_AXES, SINGLE, MeshSpec, make_mesh, parse_mesh, spec_from_section
from zoo.parallel.rules import TENSOR_RULES, leaf_spec, param_specs

__all__ = [
    "AXES",
    "BATCH_AXES",
    "SINGLE",
    "TENSOR_RULES",
    "Layout",
    "MeshSpec",
    "layout_for",
    "leaf_spec",
    "make_mesh",
    "param_specs",
    "parse_mesh",
    "process_rows",
    "spec_from_section",
]
