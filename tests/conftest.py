import jax
import jax.numpy as jnp
import pytest

import zoo
from zoo.train.losses import per_example_loss


def labels_for(cfg, x, seed=1):
    """Random valid labels for a model input."""
    key = jax.random.key(seed)
    if getattr(cfg, "num_classes", 0):
        return jax.random.randint(key, (x.shape[0],), 0, cfg.num_classes)
    return jax.random.randint(key, x.shape[:2], 0, cfg.vocab_size)


def loss_of(cfg, backend, remat="none"):
    """Mean cross-entropy of canonical params on (x, y): the quantity tests differentiate."""
    apply = zoo.apply_fn(cfg, backend)

    def loss(params, x, y):
        return per_example_loss(apply(params, x, remat), y).mean()

    return loss


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        assert jnp.allclose(x, y, rtol=rtol, atol=atol), (
            f"{jax.tree_util.keystr(path)}: max abs diff {float(jnp.abs(x - y).max())}"
        )


@pytest.fixture(scope="session")
def small_transformer():
    return zoo.get_config("transformer-xs", num_layers=2, d_model=32, d_ff=64, max_len=16, vocab_size=40)
