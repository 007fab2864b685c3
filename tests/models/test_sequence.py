"""What the decoder kinds share (zoo.models.sequence): a token table padded to a multiple of
``vocab_multiple`` rows gives the unpadded model's logits, loss and gradients, whatever the
padding rows hold, and an export leaves the padding out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import labels_for, loss_of, random_params
from tests.numerics import assert_close
from zoo.errors import ZooError
from zoo.models import registry
from zoo.models.sequence import MAX_VOCAB_MULTIPLE


def padded_params(cfg, padded_cfg, params, seed=3):
    """``params`` with the table (and an untied head) grown to ``padded_cfg.table_rows`` rows of
    random values: what the padding holds must not matter."""
    extra = padded_cfg.table_rows - cfg.vocab_size
    rng = np.random.default_rng(seed)
    out = jax.tree.map(lambda a: a, params)
    w = np.asarray(params["embed"]["w"])
    out["embed"]["w"] = jnp.asarray(np.concatenate([w, rng.normal(size=(extra, w.shape[1]))]).astype(w.dtype))
    if "head" in params:
        h = np.asarray(params["head"]["w"])
        out["head"]["w"] = jnp.asarray(
            np.concatenate([h, rng.normal(size=(h.shape[0], extra))], 1).astype(h.dtype)
        )
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("preset", ["transformer-xs", "llama-xs"])
def test_a_padded_table_gives_the_unpadded_models_loss_and_gradients(preset):
    cfg = registry.get_config(preset, vocab_size=100, tie_head=preset == "transformer-xs")
    padded = dataclasses.replace(cfg, vocab_multiple=64)
    assert padded.table_rows == 128
    params = random_params(cfg)
    big = padded_params(cfg, padded, params)
    x = cfg.example_input(jax.random.key(1), 2, 16)
    y = labels_for(cfg, x)
    want_loss, want = jax.value_and_grad(loss_of(cfg, "nnx"))(params, x, y)
    got_loss, got = jax.value_and_grad(loss_of(padded, "nnx"))(big, x, y)
    assert_close(got_loss, want_loss, n=16 * cfg.d_model, what="loss")
    assert np.all(np.asarray(got["embed"]["w"])[100:] == 0), "the padding rows get no gradient"
    got = jax.tree.map(lambda a: a, got)
    got["embed"]["w"] = got["embed"]["w"][:100]
    if "head" in got:
        got["head"]["w"] = got["head"]["w"][:, :100]
    assert_close(got, want, n=2 * 16 * cfg.d_model, what="gradients")


def test_an_export_leaves_the_padding_rows_out_and_a_bad_multiple_is_refused():
    cfg = registry.get_config("llama-xs", vocab_size=100, vocab_multiple=64)
    flat = {"embed.w": np.zeros((128, 8)), "head.w": np.zeros((8, 128)), "norm_f.scale": np.ones(8)}
    out = cfg.vocab_unpadded(flat)
    assert out["embed.w"].shape == (100, 8) and out["head.w"].shape == (8, 100)
    assert out["norm_f.scale"] is flat["norm_f.scale"]
    with pytest.raises(ZooError, match="vocab_multiple"):
        registry.get_config("llama-xs", vocab_multiple=0)


@pytest.mark.parametrize("multiple", [0, -1, MAX_VOCAB_MULTIPLE + 1, 10**12])
def test_a_vocab_multiple_out_of_range_is_refused_naming_the_bound(multiple):
    """Issue 67, item 5: 10^12 had no bound; it sized a table of 10^12 rows and failed in the
    allocator. The bound is checked with the config, before anything is allocated."""
    with pytest.raises(ZooError, match=r"vocab_multiple must be an int in \[1, 65,536\]"):
        registry.get_config("llama-xs", vocab_multiple=multiple)
    assert registry.get_config("llama-xs", vocab_multiple=MAX_VOCAB_MULTIPLE).table_rows == MAX_VOCAB_MULTIPLE
