"""Where a run's arrays live: the mesh, and a ``NamedSharding`` for every canonical leaf,
optimizer-state leaf and batch array.

The engine asks a :class:`Layout` to place the initial state and each batch, and to pin the
state's shardings at the end of every step, so that a step's outputs come back exactly as its
inputs went in and the step compiles once. On one device the layout is today's placement:
everything committed to ``jax.devices()[0]``, no constraints.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from zoo.errors import ZooError
from zoo.models.registry import ModelConfig
from zoo.parallel.mesh import BATCH_AXES, SINGLE, MeshSpec, make_mesh
from zoo.parallel.rules import param_specs


@dataclass(frozen=True, eq=False)
class Layout:
    spec: MeshSpec  # resolved: sizes multiply to the device count
    mesh: Mesh
    param_specs: dict  # canonical tree of PartitionSpec

    @property
    def is_single(self) -> bool:
        return self.spec.is_single

    @property
    def devices(self) -> int:
        return self.spec.devices

    def named(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> NamedSharding:
        return self.named(PartitionSpec())

    def params(self, tree: dict | None = None) -> dict:
        """Shardings of canonical params (of ``tree``, a subtree such as the trainable half)."""
        specs = self.param_specs if tree is None else _subtree(self.param_specs, tree)
        return jax.tree_util.tree_map(self.named, specs, is_leaf=lambda s: isinstance(s, PartitionSpec))

    def state(self, state, optimizer: optax.GradientTransformation):
        """Shardings of a ``TrainState``: its params by the rules, the optimizer's per-param
        leaves (adam moments...) like their params, counters and keys replicated."""
        params = self.params(state.params)
        opt_state = optax.tree_map_params(
            optimizer,
            lambda _, sharding: sharding,
            state.opt_state,
            params,
            transform_non_params=lambda _: self.replicated,
        )
        return type(state)(step=self.replicated, params=params, opt_state=opt_state, rng=self.replicated)

    def batch_sharding(self) -> NamedSharding:
        return self.named(PartitionSpec(BATCH_AXES))

    def check_batch_rows(self, rows: int, what: str) -> None:
        ways = self.spec.batch_ways
        if rows % ways:
            raise ZooError(
                f"{what} = {rows} rows does not split over the mesh's data x fsdp = {ways} ways "
                f"(mesh {self.spec}); use a multiple of {ways}"
            )

    # -- placement (outside jit) ----------------------------------------------------------
    def place_state(self, state, frozen: dict, optimizer):
        if self.is_single:
            return jax.device_put((state, frozen), self.mesh.devices.flat[0])
        return jax.device_put((state, frozen), (self.state(state, optimizer), self.params(frozen)))

    def place_params(self, params: dict) -> dict:
        if self.is_single:
            return jax.device_put(params, self.mesh.devices.flat[0])
        return jax.device_put(params, self.params(params))

    def place_batch(self, batch: dict):
        """A host batch (every process holds the same global batch) as global arrays split
        over data x fsdp; each process hands over only the rows of its own devices."""
        if self.is_single:
            return batch
        out = {}
        for key, value in batch.items():
            value = np.asarray(value)
            sharding = self.batch_sharding()
            if jax.process_count() == 1:
                out[key] = jax.device_put(value, sharding)
            else:
                rows = process_rows(sharding, value.shape)
                out[key] = jax.make_array_from_process_local_data(sharding, value[rows], value.shape)
        return out

    def local_rows(self, rows: int) -> slice:
        """The rows of a ``rows``-row batch that this process's devices hold (all of them on
        one process): the only rows it needs to read."""
        if self.is_single or jax.process_count() == 1:
            return slice(0, rows)
        return process_rows(self.batch_sharding(), (rows,))

    def place_local(self, local: dict, rows: int):
        """A batch of ``rows`` rows from this process's share of it (``local_rows``), as global
        arrays split over data x fsdp (``jax.make_array_from_process_local_data``)."""
        if self.is_single or jax.process_count() == 1:
            return self.place_batch(local)
        sharding = self.batch_sharding()
        return {
            key: jax.make_array_from_process_local_data(sharding, value, (rows, *np.shape(value)[1:]))
            for key, value in local.items()
        }

    # -- pinning (inside jit) ------------------------------------------------------------
    def constrain_state(self, state, optimizer):
        if self.is_single:
            return state
        return jax.lax.with_sharding_constraint(state, self.state(state, optimizer))


def process_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> slice:
    """The contiguous rows of a batch that this process's devices hold."""
    starts, stops = [], []
    for index in sharding.addressable_devices_indices_map(shape).values():
        rows = index[0]
        starts.append(rows.start or 0)
        stops.append(shape[0] if rows.stop is None else rows.stop)
    lo, hi = min(starts), max(stops)
    return slice(lo, hi)


def _subtree(specs: dict, tree: dict) -> dict:
    return {
        key: _subtree(specs[key], value) if isinstance(value, dict) else specs[key]
        for key, value in tree.items()
    }


def layout_for(cfg: ModelConfig, spec: MeshSpec = SINGLE, devices=None) -> Layout:
    """The layout of ``cfg``'s params on ``spec`` over ``devices`` (default: all of them, or
    the first alone for the one-device mesh)."""
    if devices is None:
        devices = jax.devices()[:1] if spec == SINGLE else jax.devices()
    resolved = spec.resolve(len(devices))
    return Layout(resolved, make_mesh(resolved, devices), param_specs(cfg, resolved))
