"""Where a run's training state lives, and where its optimizer update runs: one value,
``[train] placement`` (``--placement``).

- ``device``: the state on the device (the default);
- ``offload-optimizer``: the optimizer state in host memory between steps;
- ``offload-optimizer+params``: the optimizer state and the float32 params in host memory;
- ``update-on-host``: the state on the host's CPU device, and the update run there.

The names say what moves where, in the words of the old settings they replace (``offload =
"optimizer"``, ``"optimizer+params"``, ``update_on = "host"``), so a reader of a recipe needs no
table to read one.

The two ``offload-*`` placements keep :class:`jax.sharding.Sharding` memory kinds: inside the
one jitted step each offloaded leaf is copied to the device on its own (leaf by leaf, so XLA can
schedule each copy beside the compute that does not need it, as MaxText's
``optimizer_memory_host_offload`` does), used, and the step's new value is written back to host
memory: the state leaves the step as it came in, so the step compiles once. Frozen leaves, the
step counter and the key stay on the device. A CPU has these memory kinds too (``device``,
``pinned_host``, ``unpinned_host``), all of them host memory: there the step's arguments and
results carry their memory kind, but JAX lowers a ``device_put`` inside ``jit`` to nothing on a
CPU (it emits the ``annotate_device_placement`` transfers only for TPU and GPU), so on a CPU the
offload moves nothing and saves nothing. ``jax.export(..., platforms=["tpu"])`` shows the TPU
program's transfers from a CPU (``tests/parallel/test_placement.py``); what they cost and save
on a chip, ``benchmarks/device/fits.py`` and ``bandwidth.py`` measure.

``update-on-host`` keeps the whole state on the host's CPU device and runs the update there, in
a program of its own (:mod:`zoo.parallel.host_step`): the params come up in the compute dtype,
the gradient comes down. It runs on one device.

A placement owns building and placing the state (:meth:`Placement.build`,
:meth:`Placement.place`), fetching and storing it inside the step (:meth:`Placement.fetch`,
:meth:`Placement.store`), the step's program (:meth:`Placement.step`), the params' trip up for
the read-only passes (:meth:`Placement.eval_params`), the one rule that finds the host
(:func:`host_device`) and its checks (:meth:`Placement.check`). Only the four valid states can be
written: the old pair ``[train] offload`` x ``update_on`` (one release more) is read through
:func:`from_old_spelling`. A new memory setting is a new row here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import optax
from jax.sharding import SingleDeviceSharding

from zoo.configs import OFFLOADS, STATE_PLACEMENTS, UPDATES_ON
from zoo.parallel.layout import Layout

HOST = "pinned_host"
DEVICE = "device"


@dataclass(frozen=True)
class Placement:
    """A row of :data:`PLACEMENTS`. ``host_fields``: the ``TrainState`` fields kept in host
    memory between steps, inside the one jitted step; ``update_on_host``: the whole state on
    the host's CPU device and the update run there (:class:`zoo.parallel.host_step.HostStep`)."""

    name: str
    description: str
    host_fields: tuple[str, ...] = ()
    update_on_host: bool = False

    # -- the old spelling (train.offload x train.update_on), one release more ------------------
    @property
    def offload(self) -> str:
        """What the old ``train.offload`` called this placement's host-memory state."""
        return {(): "none", ("opt_state",): "optimizer"}.get(self.host_fields, "optimizer+params")

    @property
    def update_on(self) -> str:
        return "host" if self.update_on_host else "device"

    @property
    def off_device(self) -> bool:
        """Whether anything of the state is kept off the device between steps."""
        return bool(self.host_fields) or self.update_on_host

    # -- checks: the one place --------------------------------------------------------------
    def check(self, *, layout: Layout | None = None, mesh=None, remat: str | None = None) -> None:
        """A ``ValueError`` naming the setting unless this placement can run: ``update-on-host``
        runs on one device (``mesh``: a recipe's ``[mesh]`` section, ``layout``: the resolved
        one), with a CPU backend beside it, and is not a run's own placement under ``--remat
        auto`` (``remat``): on an accelerator the search tries it beside the others itself."""
        if not self.update_on_host:
            return
        if remat == "auto":
            raise ValueError(
                f"--remat auto searches placement = {self.name!r} itself on an accelerator, beside the "
                "others; as a run's own placement it is not searched: name a remat policy, or another placement"
            )
        if mesh is not None and (mesh.fsdp > 1 or mesh.tensor > 1 or mesh.data not in (1, "auto")):
            raise ValueError(
                f"placement = {self.name!r} runs on one device; [mesh] asks for data={mesh.data}, "
                f"fsdp={mesh.fsdp}, tensor={mesh.tensor}: drop the mesh or choose another placement"
            )
        if layout is None:
            return
        if not layout.is_single:
            raise ValueError(
                f"placement = {self.name!r} runs on one device; this layout has {layout.devices} "
                f"(mesh {layout.spec})"
            )
        if host_device(layout) is None:
            raise ValueError(
                f"placement = {self.name!r} runs the update on the host's CPU backend, and JAX has none "
                "here (JAX_PLATFORMS leaves it out): add cpu to JAX_PLATFORMS, or choose another placement"
            )

    # -- outside jit ------------------------------------------------------------------------
    def host(self, layout: Layout) -> jax.Device | None:
        """The host device that keeps a state held off the device (:func:`host_device`)."""
        return host_device(layout)

    def compute(self, layout: Layout) -> jax.Device:
        """The device the step computes on (:func:`compute_device`)."""
        return compute_device(layout)

    def build(self, layout: Layout, trainable: dict, make):
        """``make(trainable)`` (a fresh ``TrainState``), built on the host when the placement
        keeps state there: the optimizer leaves (for AdamW twice the params in float32) never
        exist whole in device memory."""
        if not self.off_device:
            return make(trainable)
        where = host_device(layout) or compute_device(layout)
        trainable = jax.device_put(trainable, where)
        with jax.default_device(where):
            return make(trainable)

    def place(self, layout: Layout, optimizer: optax.GradientTransformation, state, frozen: dict):
        """``(state, frozen)`` committed where the steps expect them. Restored (committed) and
        fresh (uncommitted) arrays mixed in one state would make the second step compile again."""
        if not self.off_device:
            return layout.place_state(state, frozen, optimizer)
        return self.place_state(layout, optimizer, state), layout.place_params(frozen)

    def place_state(self, layout: Layout, optimizer: optax.GradientTransformation, state):
        """A state (a restored one) where the steps keep it: host memory for what is offloaded;
        the host's CPU device for the update on the host."""
        if self.update_on_host:
            return jax.device_put(state, host_device(layout))
        if not self.host_fields:
            return state
        return jax.device_put(state, self.state_shardings(layout, state, optimizer))

    def state_shardings(self, layout: Layout, state, optimizer: optax.GradientTransformation):
        """The shardings a ``TrainState`` lives in between steps: the layout's, in host memory
        for the fields this placement offloads."""
        shardings = _device_shardings(layout, state, optimizer)
        moved = {field: _of_kind(getattr(shardings, field), HOST) for field in self.host_fields}
        return dataclasses.replace(shardings, **moved)

    def step(self, engine):
        """The engine's compiled train step: one program with the state donated, or, for the
        update on the host, :class:`zoo.parallel.host_step.SerialHostStep`'s whole-tree trips
        and update. The pipelined :class:`~zoo.parallel.host_step.HostStep` (equal to it bit for
        bit) is not the run's step yet: it has no chip figure. On a TPU v5e machine, llama-1b in
        ``benchmarks/device/host_update.py`` first ran the chip's HBM out (two gradients at once,
        since fixed), then the host's 40 GiB (not yet traced); on a CPU there is no trip to
        hide, and its pieces and threads only cost."""
        if self.update_on_host:
            from zoo.parallel.host_step import SerialHostStep

            return SerialHostStep(engine)
        return jax.jit(engine.train_step_fn, donate_argnames="state")

    def eval_params(self, step, trainable: dict) -> dict:
        """The trainable params as a read-only pass (the eval step, the audit's canary losses,
        ``zoo eval --hardest``) takes them beside the frozen leaves: a compute-dtype copy on the
        device when the state lives on the host (``step``'s), ``trainable`` itself otherwise."""
        return step.params_up(trainable) if self.update_on_host else trainable

    # -- inside jit -------------------------------------------------------------------------
    def fetch(self, layout: Layout, optimizer, state, field: str):
        """``state.<field>`` in device memory, copied leaf by leaf when this placement
        offloads it; the field itself otherwise."""
        tree = getattr(state, field)
        if field not in self.host_fields:
            return tree
        shardings = _of_kind(getattr(_device_shardings(layout, state, optimizer), field), DEVICE)
        return jax.tree_util.tree_map(jax.device_put, tree, shardings)

    def store(self, layout: Layout, optimizer, state):
        """``state`` with the fields this placement offloads written back to host memory, leaf
        by leaf: the step's outputs leave as its inputs came."""
        if not self.host_fields:
            return state
        shardings = self.state_shardings(layout, state, optimizer)
        moved = {
            f: jax.tree_util.tree_map(jax.device_put, getattr(state, f), getattr(shardings, f))
            for f in self.host_fields
        }
        return dataclasses.replace(state, **moved)

    def fetch_params(self, layout: Layout, params: dict) -> dict:
        """Trainable ``params`` (a ``TrainState``'s) in device memory for a step that reads
        them alone, such as the eval step."""
        if "params" not in self.host_fields:
            return params
        if layout.is_single:
            device = SingleDeviceSharding(compute_device(layout), memory_kind=DEVICE)
            return jax.tree_util.tree_map(lambda x: jax.device_put(x, device), params)
        return jax.tree_util.tree_map(jax.device_put, params, _of_kind(layout.params(params), DEVICE))


PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in (
        Placement("device", "the training state on the device"),
        Placement("offload-optimizer", "the optimizer state in host memory between steps", ("opt_state",)),
        Placement(
            "offload-optimizer+params",
            "the optimizer state and the float32 params in host memory between steps",
            ("opt_state", "params"),
        ),
        Placement(
            "update-on-host",
            "the state on the host's CPU device, and the optimizer update run there (one device)",
            ("opt_state", "params"),
            update_on_host=True,
        ),
    )
}
assert tuple(PLACEMENTS) == STATE_PLACEMENTS
ON_DEVICE = PLACEMENTS["device"]


def placement_named(name: str) -> Placement:
    """The row called ``name`` (a ValueError listing the valid ones otherwise)."""
    if name not in PLACEMENTS:
        raise ValueError(f"placement = {name!r} is not one of {', '.join(PLACEMENTS)}")
    return PLACEMENTS[name]


def offloaded(offload: str) -> Placement:
    """The in-program placement that keeps what the old ``train.offload`` value names on the
    host (``--remat auto`` searches them by that name)."""
    return PLACEMENTS[from_old_spelling(ON_DEVICE.name, offload, None)]


def from_old_spelling(current: str, offload: str | None, update_on: str | None) -> str:
    """The placement the old keys ``train.offload`` and ``train.update_on`` ask for, over the
    ``current`` placement (a key not given keeps its part of it). A ValueError names the bad
    value, or the combination that was never valid (the update on the host needs the
    optimizer state and params there)."""
    now = placement_named(current)
    offload = now.offload if offload is None else offload
    update_on = now.update_on if update_on is None else update_on
    for key, value, valid in (
        ("train.offload", offload, OFFLOADS),
        ("train.update_on", update_on, UPDATES_ON),
    ):
        if value not in valid:
            raise ValueError(f"unknown {key} {value!r}. Valid: {', '.join(valid)}")
    for row in PLACEMENTS.values():
        if (row.offload, row.update_on) == (offload, update_on):
            return row.name
    raise ValueError(
        f"train.update_on = 'host' updates the float32 params and the optimizer state where they live, on "
        f"the host: it needs train.offload = 'optimizer+params', got {offload!r} (one setting now: "
        "train.placement = 'update-on-host')"
    )


def compute_device(layout: Layout | None = None) -> jax.Device:
    """The device a single-device layout computes on (a mesh's first; JAX's first without one)."""
    return jax.devices()[0] if layout is None else layout.mesh.devices.flat[0]


def host_device(layout: Layout | None = None) -> jax.Device | None:
    """The host's CPU device that keeps a state held off the device: the last CPU device other
    than the compute device. On an accelerator that is its host's CPU device; a CPU process
    with several devices (``--xla_force_host_platform_device_count``) puts the two halves on
    two of them, as on a chip and its host; with one CPU device it is that device. None where
    JAX has no CPU backend (``JAX_PLATFORMS`` leaves it out)."""
    try:
        cpus = jax.devices("cpu")
    except RuntimeError:
        return None
    compute = compute_device(layout)
    others = [d for d in cpus if d != compute]
    return others[-1] if others else cpus[0]


def _device_shardings(layout: Layout, state, optimizer: optax.GradientTransformation):
    """Every leaf of ``state``'s sharding in device memory, as ``layout.place_state`` puts it."""
    if layout.is_single:
        device = SingleDeviceSharding(compute_device(layout))
        return jax.tree_util.tree_map(lambda _: device, state)
    return layout.state(state, optimizer)


def _of_kind(shardings, kind: str):
    return jax.tree_util.tree_map(lambda s: s.with_memory_kind(kind), shardings)
