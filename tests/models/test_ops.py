"""The MLP over chunks of tokens (``mlp_chunk``, zoo.models.ops.token_chunks): the same values
and gradients as the whole sequence at once, at T not divisible by the chunk; what its remat
rule keeps; what it saves in compiled memory. Ghost clipping through it (the op runs whole
under hooks) is tested with chunked attention, tests/models/test_attention.py."""

import jax
import jax.numpy as jnp
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_close
from zoo import hooks
from zoo.bench.common import memory_stats
from zoo.bench.step import compile_step
from zoo.errors import ZooError
from zoo.models import canonical, ops, registry
from zoo.models.attention import attention
from zoo.models.ops import token_chunks
from zoo.residuals.find import find_residuals
from zoo.scan import layer_body

B, T, D, F = 3, 11, 8, 32  # 11 tokens = chunks of 4, 4 and 3 (+1 padding)


def mlp_params(seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return {
        "up": jax.random.normal(keys[0], (D, F)) / D**0.5,
        "down": jax.random.normal(keys[1], (F, D)) / F**0.5,
        "weights": jax.random.normal(keys[2], (B, T, D)),  # a loss that reads every output
    }


def mlp(p, x):
    return jax.nn.gelu(x @ p["up"]) @ p["down"]


def loss(p, x, chunk):
    return jnp.sum(token_chunks(lambda t: mlp(p, t), x, chunk) * p["weights"])


@pytest.mark.numerics
def test_values_and_gradients_equal_the_whole_sequence_at_once():
    p, x = mlp_params(), jax.random.normal(jax.random.key(1), (B, T, D))
    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(p, x, 0)
    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(p, x, 4)
    assert_close(got, want, n=B * T * F)


def test_chunk_zero_a_chunk_as_long_as_the_sequence_and_active_hooks_run_it_whole():
    p, x = mlp_params(), jnp.ones((B, T, D))

    def scans(chunk):
        eqns = jax.make_jaxpr(lambda x: token_chunks(lambda t: mlp(p, t), x, chunk))(x).eqns
        return sum(e.primitive.name == "scan" for e in eqns)

    assert scans(4) == 1 and scans(0) == scans(T) == 0
    with hooks.active(hooks.Hooks()):
        assert scans(4) == 0


def test_the_chunks_keep_only_their_input_for_the_backward_pass():
    """Differentiated on its own, the chunked MLP's residuals are its input (chunked) and the
    weights; the whole MLP keeps [B, T, d_ff] hidden activations."""
    p, x = mlp_params(), jnp.ones((B, T, D))

    def residual_shapes(chunk):
        found = find_residuals(lambda p, x: token_chunks(lambda t: mlp(p, t), x, chunk), p, x)
        return [f.shape for f in found if f.origin.kind == "activation"]

    assert any(shape[-1] == F for shape in residual_shapes(0))
    assert residual_shapes(4) and not any(shape[-1] == F for shape in residual_shapes(4))


# --- in the models -------------------------------------------------------------------------


def chunked_and_whole(kind):
    whole = zoo.get_config(registry.get_kind(kind).small)
    return zoo.get_config(whole, mlp_chunk=3), whole  # T=8: 3 + 3 + 2


# Both kinds, both backends, a policy that recomputes the block (full), one that would save
# the MLP's named tensors (minimal) and no remat at all.
CELLS = [("transformer", "full", "eqx"), ("llama", "minimal", "nnx"), ("transformer", "none", "nnx")]


@pytest.mark.numerics
@pytest.mark.parametrize("kind, policy, backend", CELLS)
def test_a_model_with_a_chunked_mlp_gives_the_whole_models_loss_and_gradients(kind, policy, backend):
    chunked, whole = chunked_and_whole(kind)
    params = random_params(whole, 1)
    x = zoo.example_batch(whole, 2, seed=2, seq_len=8)
    y = labels_for(whole, x)
    want = fast_jit(jax.value_and_grad(loss_of(whole, backend)))(params, x, y)
    got = fast_jit(jax.value_and_grad(loss_of(chunked, backend, policy)))(params, x, y)
    assert_close(got, want, n=reduction_size(whole, 2))


def test_a_block_with_a_chunked_mlp_keeps_no_hidden_activations():
    """One block under ``none``: the whole MLP keeps [B, T, d_ff] tensors (mlp_hidden, the GELU
    terms); the chunked one keeps none of width d_ff."""
    for mlp_chunk, expect_hidden in ((0, True), (3, False)):
        cfg = zoo.get_config("transformer-xs", mlp_chunk=mlp_chunk)
        params = jax.eval_shape(lambda cfg=cfg: canonical.init_params(cfg, 0))
        layer_fn, stacked = canonical.from_canonical(cfg, "nnx", params).stack()
        layer0 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked)
        h = jax.ShapeDtypeStruct((2, 8, cfg.d_model), jnp.float32)
        found = find_residuals(layer_body(layer_fn, "none"), layer0, h)
        widths = {f.shape[-1] for f in found if f.origin.kind == "activation" and f.shape}
        assert (cfg.d_ff in widths) == expect_hidden, widths


def test_full_needs_less_temp_memory_with_a_chunked_mlp():
    """XLA's count for the compiled train step (nothing is run): under ``full`` the replayed
    block's MLP is the largest part of the working space, and chunks of 8 tokens shrink it."""
    temp = {}
    for mlp_chunk in (0, 8):
        cfg = zoo.get_config("transformer-xs", mlp_chunk=mlp_chunk)
        x = zoo.example_batch(cfg, 8, seed=0, seq_len=64)
        step = compile_step(cfg, x, labels_for(cfg, x), remat="full")
        temp[mlp_chunk] = memory_stats(step.compiled)["temp_size_in_bytes"]
    assert temp[8] < 0.85 * temp[0], temp


@pytest.mark.parametrize("bad", [-1, 2.5, True, "16"])
def test_the_mlp_chunk_is_checked(bad):
    with pytest.raises(
        ZooError, match=rf"LlamaConfig.mlp_chunk must be a whole number of tokens .*got {bad!r}"
    ):
        zoo.get_config("llama-xs", mlp_chunk=bad)


# -- float32: the programs the ops were before the precision policy ----------------------------
# Under float32 (zoo.precision's identity) every op must be the program it was: the casts to and
# from float32 are no-ops that JAX does not even trace, and the float32 scopes only name. The
# references are the ops' formulas as they were written before the policy.
def _old_layer_norm(layer, x):
    params, eps = ops._norm_params(layer)
    mean = x.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
    return ops._scale_shift("norm", (x - mean) * jax.lax.rsqrt(var + eps), params)


def _old_rms_norm(layer, x):
    params, eps = ops._norm_params(layer)
    return ops._scale_shift("norm", x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps), params)


def _old_attention(q, k, v, num_heads):
    *lead, seq, width = q.shape
    d_head = width // num_heads

    def heads(x, n):
        return jnp.swapaxes(x.reshape(*lead, seq, n, d_head), -3, -2)

    kh, vh = heads(k, num_heads), heads(v, num_heads)
    scores = heads(q, num_heads) @ jnp.swapaxes(kh, -1, -2) / jnp.sqrt(d_head).astype(q.dtype)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    context = jax.nn.softmax(scores, axis=-1) @ vh
    return jnp.swapaxes(context, -3, -2).reshape(*lead, seq, width)


def _layers():
    from flax import nnx

    rngs = nnx.Rngs(0)
    return {
        "layer_norm": nnx.LayerNorm(D, rngs=rngs),
        "rms_norm": nnx.RMSNorm(D, rngs=rngs),
        "dense": nnx.Linear(D, F, rngs=rngs),
        "table": nnx.Embed(F, D, rngs=rngs),
    }


def _jaxpr(fn, *args) -> str:
    return str(jax.make_jaxpr(fn)(*args))


def test_float32_ops_are_the_programs_they_were():
    layers, x = _layers(), jax.random.normal(jax.random.key(1), (B, T, D))
    same = {
        "layer_norm": (
            lambda x: ops.layer_norm(layers["layer_norm"], x),
            lambda x: _old_layer_norm(layers["layer_norm"], x),
        ),
        "rms_norm": (
            lambda x: ops.rms_norm(layers["rms_norm"], x),
            lambda x: _old_rms_norm(layers["rms_norm"], x),
        ),
        "attention": (lambda x: attention(x, x, x, 2), lambda x: _old_attention(x, x, x, 2)),
        "head": (
            lambda x: ops.head(layers["dense"], x),
            lambda x: x @ layers["dense"].kernel.value + layers["dense"].bias.value,
        ),
        "unembed": (
            lambda x: ops.unembed(layers["table"], x),
            lambda x: x @ layers["table"].embedding.value.T,
        ),
    }
    for name, (new, old) in same.items():
        assert _jaxpr(new, x) == _jaxpr(old, x), name
        assert _jaxpr(jax.grad(lambda x, f=new: f(x).sum()), x) == _jaxpr(
            jax.grad(lambda x, f=old: f(x).sum()), x
        ), name


def test_the_float32_program_check_sees_a_changed_op():
    """Negative test: the comparison above tells a different float32 program apart (the
    statistics taken in another order, equal in exact arithmetic)."""
    layers, x = _layers(), jax.random.normal(jax.random.key(1), (B, T, D))

    def reordered(x):
        params, eps = ops._norm_params(layers["layer_norm"])
        centred = x - x.mean(-1, keepdims=True)
        return ops._scale_shift(
            "norm", centred * jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + eps), params
        )

    assert _jaxpr(lambda x: ops.layer_norm(layers["layer_norm"], x), x) != _jaxpr(reordered, x)
