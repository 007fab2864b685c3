"""``[train] update_on = "host"``: the optimizer update on the host CPU, where the state lives.

ZeRO-Offload's split (Ren et al., 2021; DeepSpeed's "CPU Adam"). With ``offload =
"optimizer+params"`` and the update on the device, each step copies the float32 masters and
both moments to the chip and writes them back: on a TPU v5e a write to host memory inside
``jit`` measured 0.55 GB/s (``benchmarks/device/bandwidth.py``), about 27 s a step for a 1B
model's 15 GB of state. Here the state never leaves the host. Each step is two compiled
programs (three under a compute dtype other than float32: the host's cast) and two copies:

1. the host casts the params to the compute dtype (half the bytes under bfloat16) and copies
   them up to the device;
2. the device computes the loss and the float32 gradient (over ``train.microbatch_size`` rows at
   a time; under DP the noisy mean of the clipped sum), from the params widened back to
   float32 inside the program. The model's own cast then gives the very values the device
   step's cast of the masters gives, so the gradient is the device step's;
3. the gradient comes down to the host (the one copy of the step that scales with the model in
   float32: 4 bytes a trainable param);
4. the host's CPU device runs the optimizer's update, :meth:`zoo.train.engine.Engine.updated`
   (optax, the device step's own), on the donated masters and moments.

The chip holds the compute-dtype params, the gradient and the activations; never the masters or
the moments. Between steps the state is on the host's CPU device, where checkpoints and resumes
find it; the eval step and other read-only passes get the compute-dtype copy
(:meth:`HostUpdate.params_up`). On a CPU the "device" and the host are one memory,
and a test process with several host devices puts the two halves on two of them.
"""

from __future__ import annotations

import jax
from jax.sharding import SingleDeviceSharding

from zoo.configs import UPDATES_ON
from zoo.train.state import TrainState, step_metrics

HOST = "host"
NEEDS_OFFLOAD = "optimizer+params"


def check(update_on: str, offload: str, layout) -> None:
    """A ``ValueError`` naming the bad setting, unless ``update_on`` can run with ``offload`` on
    ``layout``."""
    if update_on not in UPDATES_ON:
        raise ValueError(f"update_on = {update_on!r} is not one of {', '.join(UPDATES_ON)}")
    if update_on != HOST:
        return
    if offload != NEEDS_OFFLOAD:
        raise ValueError(
            f"update_on = 'host' updates the params and the optimizer state where they live: it needs "
            f"offload = {NEEDS_OFFLOAD!r}, got {offload!r}"
        )
    if not layout.is_single:
        raise ValueError(
            f"update_on = 'host' runs on one device; this layout has {layout.devices} (mesh {layout.spec})"
        )


def compute_device(layout) -> jax.Device:
    """The device the gradient is computed on (a single-device layout's one device)."""
    return layout.mesh.devices.flat[0]


def host_device(layout) -> jax.Device:
    """The host CPU device that holds the state and runs the update: on an accelerator the
    host's first CPU device; on a CPU, the last CPU device other than the compute device (with
    one CPU device, that device itself)."""
    compute = compute_device(layout)
    try:
        cpus = jax.devices("cpu")
    except RuntimeError:
        raise ValueError(
            "update_on = 'host' runs the update on the host's CPU backend, and JAX has none here "
            "(JAX_PLATFORMS leaves it out): add cpu to JAX_PLATFORMS, or set update_on = 'device'"
        ) from None
    others = [d for d in cpus if d != compute]
    return others[-1] if others else cpus[0]


class HostUpdate:
    """An engine's train step with the update on the host: ``(state, frozen, batch) -> (state,
    metrics)``, the state (on the host) donated, as the one-program step takes it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = compute_device(engine.layout)
        self.host = host_device(engine.layout)
        self._to_compute = jax.jit(engine.precision.to_compute)
        self.grads = jax.jit(self._grads)
        self.update = jax.jit(self._update, donate_argnames="state")

    def _grads(self, params: dict, step: jax.Array, rng: jax.Array, frozen: dict, batch: dict):
        """On the device: ``(loss, float32 gradient, report)`` of the engine's step at ``params``
        (compute dtype, widened here to the masters' dtype: the model casts them back)."""
        state = TrainState(step=step, params=self.engine.precision.master(params), opt_state=None, rng=rng)
        return self.engine._grads(state, frozen, batch)

    def _update(self, state: TrainState, loss: jax.Array, grads: dict):
        """On the host: the state after the optimizer's update, and the step's metrics."""
        return self.engine.updated(state, grads), step_metrics(loss, grads)

    def params_up(self, params: dict) -> dict:
        """Trainable ``params`` (on the host) in the compute dtype, on the compute device: what
        the gradient program reads, and what the eval step and the other read-only passes
        read (the model casts to that dtype anyway, so their values are the masters')."""
        params = params if self.engine.precision.is_identity else self._to_compute(params)
        return jax.device_put(params, SingleDeviceSharding(self.device))

    def up(self, state: TrainState):
        """``(params in the compute dtype, step, rng)`` on the compute device."""
        step, rng = jax.device_put((state.step, state.rng), SingleDeviceSharding(self.device))
        return self.params_up(state.params), step, rng

    def __call__(self, state: TrainState, frozen: dict, batch: dict):
        loss, grads, report = self.grads(*self.up(state), frozen, batch)
        loss, grads = jax.device_put((loss, grads), SingleDeviceSharding(self.host))
        new_state, metrics = self.update(state, loss, grads)
        return new_state, {**metrics, **report}

    def cache_sizes(self) -> dict[str, int]:
        """Compiles of each of the step's programs: the device's gradient, the host's update
        and the host's cast (1 each once it ran, when every step's arguments come back alike;
        the cast runs under a compute dtype other than float32 only)."""
        return {
            "grads": self.grads._cache_size(),
            "update": self.update._cache_size(),
            "cast": self._to_compute._cache_size(),
        }

    def _cache_size(self) -> int:
        """The most compiles of any one of the step's programs (``jax.jit``'s own answer)."""
        return max(self.cache_sizes().values())
