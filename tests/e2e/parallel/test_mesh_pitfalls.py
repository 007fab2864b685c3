"""DP pitfalls on a device mesh (tests/dp/test_pitfalls.py has them on one device): neighbours
replayed with the same keys on 8 devices give one compile, the same noise, and clipped sums
within C of each other; NaN in the padding rows is bitwise the clean padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import FAST_COMPILE
from tests.e2e.parallel.meshrun import BATCH, batches, engine_for
from tests.numerics import assert_bitwise_equal, assert_close
from zoo.dp import clipping as clipping_lib
from zoo.dp.plan import fixed_batch_plan

CFG = zoo.get_config("mlp-s", d_in=6, d_hidden=8, num_layers=1, num_classes=3)
C, E = 1.0, 4.0


def mesh_release(mesh: str, clipping: str):
    engine, params = engine_for(
        CFG, mesh, dp=fixed_batch_plan(E, noise_multiplier=1.5, clip_norm=C, clipping=clipping)
    )
    state, frozen = engine.init_state(params, 0, jax.random.key(7))

    def fn(state, frozen, b):
        clipped, _, _ = engine.clipped_sum(state, frozen, b)
        _, release, _ = engine._dp_grads(state, frozen, b)
        return clipped, jax.tree.map(lambda r, s: r * E - s, release, clipped)

    step = jax.jit(fn, compiler_options=FAST_COMPILE)
    return lambda b: jax.device_get(step(state, frozen, engine.place_batch(b))), step


def norm(a, b) -> float:
    return float(
        np.sqrt(
            sum(
                np.sum((np.float64(x) - np.float64(y)) ** 2)
                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
            )
        )
    )


def check_on_mesh(clipping):
    release, step = mesh_release("data=8", clipping)
    base = batches(CFG, 1)[0]
    base["mask"][5:] = 0.0
    added, huge = ({k: v.copy() for k, v in base.items()} for _ in range(2))
    added["mask"][5] = 1.0
    huge["mask"][5], huge["x"][5] = 1.0, 1e4
    dirty = {k: v.copy() for k, v in base.items()}
    dirty["x"][5:] = np.nan
    clipped0, noise0 = release(base)
    for b in (added, huge):
        clipped, noise = release(b)
        assert norm(clipped, clipped0) <= C * (1 + 1e-6)
        assert_close(noise, noise0, n=BATCH, what="noise of a neighbour on the mesh")
    assert_bitwise_equal(release(dirty), (clipped0, noise0))
    assert step._cache_size() == 1


@pytest.mark.numerics
@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_neighbour_replay_and_padding_garbage_on_a_data_mesh(clipping):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    check_on_mesh(clipping)


def test_the_mesh_check_still_catches_skipped_clipping(monkeypatch):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(clipping_lib, "clip_factor", lambda norms, clip: jnp.ones_like(norms))
    with pytest.raises(AssertionError):
        check_on_mesh("ghost")
