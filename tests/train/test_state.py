"""The train state: what it holds, in which dtype."""

import jax
import jax.numpy as jnp
import optax

from zoo.train.state import TrainState


def test_a_bf16_trainable_leaf_becomes_a_float32_master_copy_with_float32_adamw_state():
    """A leaf imported (or saved frozen) in bf16 is widened, exactly, when it starts to train:
    params and AdamW's moments are float32; integer leaves keep their dtype."""
    w = jnp.asarray([[0.1, -2.5], [3.0, 0.007]], jnp.bfloat16)
    params = {"w": w, "b": jnp.zeros(2, jnp.float32), "ids": jnp.arange(2, dtype=jnp.int32)}
    state = TrainState.create(params, optax.adamw(1e-3), seed=0)
    assert {k: str(v.dtype) for k, v in state.params.items()} == {
        "w": "float32",
        "b": "float32",
        "ids": "int32",
    }
    assert bool(jnp.all(state.params["w"] == w.astype(jnp.float32)))  # widened, not rounded again
    parts = jax.tree_util.tree_leaves(state.opt_state, is_leaf=lambda s: hasattr(s, "mu"))
    adam = next(s for s in parts if hasattr(s, "mu"))
    assert str(adam.mu["w"].dtype) == str(adam.nu["w"].dtype) == "float32"
