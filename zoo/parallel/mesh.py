"""Mesh specs: how many devices go on each of the three mesh axes.

``data`` splits the batch and replicates params; ``fsdp`` splits the batch too, and shards
params and optimizer state (ZeRO-3: XLA gathers each layer's weights inside the scan);
``tensor`` splits attention heads and MLP hidden units (Megatron style). The sizes multiply to
the device count. One device is the mesh ``data=1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh

from zoo.checks import require_choice, require_int
from zoo.errors import ZooError

DATA, FSDP, TENSOR = "data", "fsdp", "tensor"
AXES = (DATA, FSDP, TENSOR)
BATCH_AXES = (DATA, FSDP)  # the mesh axes a batch is split over
AUTO = "auto"


@dataclass(frozen=True)
class MeshSpec:
    """Axis sizes of a device mesh. ``data = 0`` stands for ``auto``: every device not on
    ``fsdp`` or ``tensor`` goes on ``data``."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            lowest = 0 if axis == DATA else 1  # data = 0: auto
            require_int(f"mesh.{axis}", getattr(self, axis), lo=lowest, what="a positive int", error=ZooError)

    @property
    def sizes(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def devices(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def batch_ways(self) -> int:
        """How many pieces a batch is split into."""
        return self.data * self.fsdp

    @property
    def is_single(self) -> bool:
        return self.devices == 1

    def __str__(self) -> str:
        """``fsdp=8``, ``data=2,fsdp=2,tensor=2``: the axes over one device (``data=1`` alone)."""
        text = ",".join(f"{axis}={size}" for axis, size in self.sizes.items() if size != 1)
        return text or f"{DATA}=1"

    def resolve(self, device_count: int) -> MeshSpec:
        """The spec with ``auto`` filled in, checked against ``device_count``."""
        spec = self
        if self.data == 0:
            rest = self.fsdp * self.tensor
            if device_count % rest:
                raise ZooError(
                    f"mesh data=auto: fsdp={self.fsdp} x tensor={self.tensor} = {rest} does not "
                    f"divide the {device_count} devices"
                )
            spec = MeshSpec(device_count // rest, self.fsdp, self.tensor)
        if spec.devices != device_count:
            raise ZooError(
                f"mesh {spec} has {spec.devices} devices, but {device_count} are present "
                f"({jax.devices()[0].platform}); the axis sizes must multiply to {device_count}. "
                "On CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N simulates N devices"
            )
        return spec


SINGLE = MeshSpec()


def parse_mesh(text: str) -> MeshSpec:
    """``data=2,fsdp=4,tensor=1`` (axes left out are 1), or ``auto`` (every device on data)."""
    text = text.strip()
    if text == AUTO:
        return MeshSpec(data=0)
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, eq, value = part.partition("=")
        axis = axis.strip()
        require_choice("mesh axis", axis, AXES)
        if not eq:
            raise ZooError(f"--mesh {text!r}: write {axis}=SIZE, e.g. data=2,fsdp=4,tensor=1")
        if axis in sizes:
            raise ZooError(f"--mesh {text!r} sets {axis} twice")
        value = value.strip()
        if value == AUTO and axis == DATA:
            sizes[axis] = 0
            continue
        try:
            sizes[axis] = int(value)
        except ValueError:
            sizes[axis] = 0
        if sizes[axis] < 1:  # 0 is how a spec spells auto: it must be written as auto
            also = " or auto" if axis == DATA else ""
            raise ZooError(f"--mesh {text!r}: {axis} must be a positive int{also}, got {value!r}")
    if not sizes:
        raise ZooError("--mesh is empty: give data=D,fsdp=F,tensor=T or auto")
    return MeshSpec(**sizes)


def flag_values(text: str) -> dict[str, object]:
    """``--mesh TEXT`` as the ``[mesh]`` section's field values (``data``, ``fsdp``, ``tensor``)."""
    spec = parse_mesh(text)
    return {DATA: AUTO if spec.data == 0 else spec.data, FSDP: spec.fsdp, TENSOR: spec.tensor}


def spec_from_section(section) -> MeshSpec:
    """A recipe's ``[mesh]`` section (``zoo.configs.MeshConfig``) as a spec."""
    data = 0 if section.data == AUTO else section.data
    if isinstance(data, str):
        raise ZooError(f"mesh.data must be a positive int or 'auto', got {section.data!r}")
    return MeshSpec(data, section.fsdp, section.tensor)


def make_mesh(spec: MeshSpec, devices=None) -> Mesh:
    """A ``jax.sharding.Mesh`` with axes (data, fsdp, tensor) over ``devices`` (default: all)."""
    devices = list(jax.devices() if devices is None else devices)
    spec = spec.resolve(len(devices))
    grid = np.asarray(devices, dtype=object).reshape(spec.data, spec.fsdp, spec.tensor)
    return Mesh(grid, AXES)
