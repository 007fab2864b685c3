import jax
import pytest

import zoo
from zoo.models.canonical import canonical_shapes
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


def reduction_size(cfg, batch):
    """The float rule's ``n`` (tests/numerics.py) for a model's logits, losses and gradients:
    examples x positions x the widest contraction (the largest fan-in of a canonical leaf)."""
    widths = [shape[-2] for shape in canonical_shapes(cfg).values() if len(shape) >= 2]
    return batch * getattr(cfg, "max_len", 1) * max(widths)


@pytest.fixture(scope="session")
def small_transformer():
    return zoo.get_config("transformer-xs", num_layers=2, d_model=32, d_ff=64, max_len=16, vocab_size=40)
