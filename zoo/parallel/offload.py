"""Host offload of the training state: where ``[train] offload`` keeps the optimizer state and
the float32 master weights between steps.

``"optimizer"`` keeps every optimizer-state leaf (AdamW's two moments and its count) in host
memory (``pinned_host``); ``"optimizer+params"`` keeps the trainable float32 params there too.
Inside the one jitted step each offloaded leaf is copied to the device on its own (leaf by leaf,
so XLA can schedule each copy beside the compute that does not need it, as MaxText's
``optimizer_memory_host_offload`` does), used, and the step's new value is written back to host
memory: the state leaves the step as it came in, so the step compiles once. Frozen leaves, the
step counter and the key stay on the device.

These are :class:`jax.sharding.Sharding` memory kinds. A CPU has them too (``device``,
``pinned_host``, ``unpinned_host``), all of them host memory: there the step's arguments and
results carry their memory kind, but JAX lowers a ``device_put`` inside ``jit`` to nothing on a
CPU (it emits the ``annotate_device_placement`` transfers only for TPU and GPU), so on a CPU the
offload moves nothing and saves nothing. ``jax.export(..., platforms=["tpu"])`` shows the TPU
program's transfers from a CPU (``tests/parallel/test_offload.py``); what they cost and save on
a chip, ``benchmarks/device/fits.py`` and ``bandwidth.py`` measure.
"""

from __future__ import annotations

import dataclasses

import jax
import optax
from jax.sharding import SingleDeviceSharding

from zoo.configs import OFFLOADS
from zoo.parallel.layout import Layout

HOST = "pinned_host"
DEVICE = "device"
_FIELDS = {"none": (), "optimizer": ("opt_state",), "optimizer+params": ("opt_state", "params")}
assert tuple(_FIELDS) == OFFLOADS


def host_fields(setting: str) -> tuple[str, ...]:
    """The ``TrainState`` fields that ``setting`` keeps in host memory between steps."""
    if setting not in _FIELDS:
        raise ValueError(f"offload = {setting!r} is not one of {', '.join(OFFLOADS)}")
    return _FIELDS[setting]


def builder_device() -> jax.Device:
    """Where an offloaded state is built before it is placed: the host's first CPU device (the
    device itself on a CPU; ``jax.devices()[0]`` where JAX_PLATFORMS leaves no CPU backend)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return jax.devices()[0]


def _device_shardings(layout: Layout, state, optimizer: optax.GradientTransformation):
    """Every leaf of ``state``'s sharding in device memory, as ``layout.place_state`` puts it."""
    if layout.is_single:
        device = SingleDeviceSharding(layout.mesh.devices.flat[0])
        return jax.tree_util.tree_map(lambda _: device, state)
    return layout.state(state, optimizer)


def _of_kind(shardings, kind: str):
    return jax.tree_util.tree_map(lambda s: s.with_memory_kind(kind), shardings)


def state_shardings(layout: Layout, state, optimizer: optax.GradientTransformation, setting: str):
    """The shardings a ``TrainState`` lives in between steps: the layout's, in host memory for
    the fields ``setting`` offloads."""
    shardings = _device_shardings(layout, state, optimizer)
    moved = {field: _of_kind(getattr(shardings, field), HOST) for field in host_fields(setting)}
    return dataclasses.replace(shardings, **moved)


def place_state(layout: Layout, state, frozen: dict, optimizer, setting: str):
    """``(state, frozen)`` committed where the steps expect them (outside ``jit``)."""
    if not host_fields(setting):
        return layout.place_state(state, frozen, optimizer)
    return jax.device_put(state, state_shardings(layout, state, optimizer, setting)), layout.place_params(
        frozen
    )


def fetch(layout: Layout, state, optimizer, setting: str, field: str):
    """``state.<field>`` in device memory, copied leaf by leaf when ``setting`` offloads it
    (inside ``jit``); the field itself otherwise."""
    tree = getattr(state, field)
    if field not in host_fields(setting):
        return tree
    shardings = _of_kind(getattr(_device_shardings(layout, state, optimizer), field), DEVICE)
    return jax.tree_util.tree_map(jax.device_put, tree, shardings)


def store(layout: Layout, state, optimizer, setting: str):
    """``state`` with the fields ``setting`` offloads written back to host memory, leaf by leaf
    (inside ``jit``): the step's outputs leave as its inputs came."""
    fields = host_fields(setting)
    if not fields:
        return state
    shardings = state_shardings(layout, state, optimizer, setting)
    moved = {
        f: jax.tree_util.tree_map(jax.device_put, getattr(state, f), getattr(shardings, f)) for f in fields
    }
    return dataclasses.replace(state, **moved)


def fetch_params(layout: Layout, params: dict, setting: str) -> dict:
    """Trainable ``params`` (a ``TrainState``'s) in device memory for a step that reads them
    alone, such as the eval step (inside ``jit``)."""
    if "params" not in host_fields(setting):
        return params
    if layout.is_single:
        device = SingleDeviceSharding(layout.mesh.devices.flat[0], memory_kind=DEVICE)
        return jax.tree_util.tree_map(lambda x: jax.device_put(x, device), params)
    return jax.tree_util.tree_map(jax.device_put, params, _of_kind(layout.params(params), DEVICE))
