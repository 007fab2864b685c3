"""The step of ``placement = "update-on-host"``: the optimizer update on the host CPU, where the
state lives (:data:`zoo.parallel.placement.PLACEMENTS`).

ZeRO-Offload's split (Ren et al., 2021; DeepSpeed's "CPU Adam"). With the optimizer state and
params offloaded and the update on the device, each step copies the float32 masters and both
moments to the chip and writes them back: on a TPU v5e a write to host memory inside ``jit``
measured 0.55 GB/s (``benchmarks/device/bandwidth.py``), about 27 s a step for a 1B model's
15 GB of state. Here the state never leaves the host. Each step is two compiled programs (three
under a compute dtype other than float32: the host's cast) and two copies:

1. the host casts the params to the compute dtype (half the bytes under bfloat16) and copies
   them up to the device (:meth:`HostStep.params_up`: the params' trip up);
2. the device computes the loss and the float32 gradient (over ``train.microbatch_size`` rows at
   a time; under DP the noisy mean of the clipped sum) by the engine's public
   :meth:`~zoo.train.engine.Engine.grads`, from the params widened back to float32 inside the
   program. The model's own cast then gives the very values the device step's cast of the
   masters gives, so the gradient is the device step's;
3. the gradient comes down to the host (the one copy of the step that scales with the model in
   float32: 4 bytes a trainable param);
4. the host's CPU device runs the engine's public :meth:`~zoo.train.engine.Engine.update`
   (optax, the device step's own), on the donated masters and moments.

The chip holds the compute-dtype params, the gradient and the activations; never the masters or
the moments. Between steps the state is on the host's CPU device
(:func:`zoo.parallel.placement.host_device`), where checkpoints and resumes find it; the eval
step and other read-only passes get the compute-dtype copy. On a CPU the "device" and the host
are one memory, and a test process with several host devices puts the two halves on two of them.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import SingleDeviceSharding


class HostStep:
    """An engine's train step with the update on the host: ``(state, frozen, batch) -> (state,
    metrics)``, the state (on the host) donated, as the one-program step takes it. It calls the
    engine's public ``grads``, ``update`` and ``precision`` only."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.placement.compute(engine.layout)
        self.host = engine.placement.host(engine.layout)  # the one rule
        self._to_compute = jax.jit(engine.precision.to_compute)
        self.grads = jax.jit(self._grads)
        self.update = jax.jit(engine.update, donate_argnames="state")

    def _grads(self, state, frozen: dict, batch: dict):
        """On the device: ``(loss, float32 gradient, report)`` of the engine's step at
        ``state.params`` (compute dtype, widened here to the masters' dtype: the model casts
        them back)."""
        masters = dataclasses.replace(state, params=self.engine.precision.master(state.params))
        return self.engine.grads(masters, frozen, batch)

    def params_up(self, params: dict) -> dict:
        """Trainable ``params`` (on the host) in the compute dtype, on the compute device: what
        the gradient program reads, and what the eval step and the other read-only passes
        read (the model casts to that dtype anyway, so their values are the masters')."""
        params = params if self.engine.precision.is_identity else self._to_compute(params)
        return jax.device_put(params, SingleDeviceSharding(self.device))

    def up(self, state):
        """``state`` as the gradient program reads it, on the compute device: the params in the
        compute dtype, the step and the key, and no optimizer state (an empty tuple: no leaves,
        and no ``None`` that a compiled program's argument list reads as a dropped argument)."""
        step, rng = jax.device_put((state.step, state.rng), SingleDeviceSharding(self.device))
        params = self.params_up(state.params)
        return dataclasses.replace(state, step=step, params=params, opt_state=(), rng=rng)

    def __call__(self, state, frozen: dict, batch: dict):
        loss, grads, report = self.grads(self.up(state), frozen, batch)
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
