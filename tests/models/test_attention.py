"""Chunked attention (zoo.models.attention) against dense attention written out in full:
values and gradients, causal or not, with padding masks, at T not divisible by the chunk; and
what its remat rule keeps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_close
from zoo import jaxfeatures
from zoo.dp import ClipRequest, clipped_grad_sum
from zoo.dp.ghost import ghost_clipped_grad_sum
from zoo.errors import ZooError
from zoo.losses import per_example_loss
from zoo.models import attention as attention_module
from zoo.models import registry
from zoo.models.attention import attention
from zoo.residuals.find import find_residuals


def dense_reference(q, k, v, num_heads, num_kv_heads, causal, key_mask):
    """softmax(q k^T / sqrt(d) + mask) v with the [T, T] scores built explicitly; a row with no
    allowed key gives zeros."""
    *lead, seq, width = q.shape
    d = width // num_heads

    def heads(x, n):
        return jnp.swapaxes(x.reshape(*lead, seq, n, d), -3, -2)

    qh, kh, vh = heads(q, num_heads), heads(k, num_kv_heads), heads(v, num_kv_heads)
    kh, vh = (jnp.repeat(a, num_heads // num_kv_heads, axis=-3) for a in (kh, vh))
    s = qh @ jnp.swapaxes(kh, -1, -2) / jnp.sqrt(jnp.float32(d))
    ok = jnp.ones((seq, seq), bool)
    if causal:
        ok = jnp.tril(ok)
    if key_mask is not None:
        ok = ok & key_mask[..., None, None, :]
    s = jnp.where(ok, s, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)
    p = jnp.where(ok, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    out = (p / jnp.where(total > 0, total, 1.0)) @ vh
    return jnp.swapaxes(out, -3, -2).reshape(*lead, seq, width)


def assert_model_matches_dense(preset: str, kind: str) -> None:
    """A model with attention ``kind`` gives the dense model's loss and gradients (NNX)."""
    import dataclasses

    dense_cfg = registry.get_config(preset, attention="dense")
    cfg = dataclasses.replace(dense_cfg, attention=kind)
    params = random_params(dense_cfg)
    x = dense_cfg.example_input(jax.random.key(1), 2, 24)
    y = labels_for(dense_cfg, x)
    got = jax.value_and_grad(loss_of(cfg, "nnx"))(params, x, y)
    want = jax.value_and_grad(loss_of(dense_cfg, "nnx"))(params, x, y)
    assert_close(got[0], want[0], n=24 * dense_cfg.d_model, what="loss")
    assert_close(got[1], want[1], n=2 * 24 * dense_cfg.d_model, what="gradients")


B, T, H, KV, D = 2, 37, 4, 2, 8
CHUNK = 8  # 37 = 4 chunks of 8 + 5: the last chunk is padded


def inputs(seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (B, T, H * D))
    k = jax.random.normal(keys[1], (B, T, KV * D))
    v = jax.random.normal(keys[2], (B, T, KV * D))
    weights = jax.random.normal(keys[3], (B, T, H * D))  # a loss that reads every output
    lengths = jnp.array([T, 23])
    mask = jnp.arange(T)[None, :] < lengths[:, None]
    return q, k, v, weights, mask


@pytest.mark.numerics
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
def test_values_and_gradients_equal_dense_attention(causal, masked):
    q, k, v, weights, mask = inputs()
    key_mask = mask if masked else None

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * weights)

    chunked = fast_jit(
        jax.value_and_grad(
            loss(
                lambda q, k, v: attention(
                    q, k, v, H, KV, kind="chunked", chunk=CHUNK, causal=causal, key_mask=key_mask
                )
            ),
            argnums=(0, 1, 2),
        )
    )
    dense = fast_jit(
        jax.value_and_grad(
            loss(lambda q, k, v: dense_reference(q, k, v, H, KV, causal, key_mask)), argnums=(0, 1, 2)
        )
    )
    out_c = fast_jit(
        lambda q, k, v: attention(
            q, k, v, H, KV, kind="chunked", chunk=CHUNK, causal=causal, key_mask=key_mask
        )
    )(q, k, v)
    assert_close(out_c, dense_reference(q, k, v, H, KV, causal, key_mask), n=T * D, what="output")
    assert_close(chunked(q, k, v), dense(q, k, v), n=B * T * H * D, what="loss and grads")


def test_causal_chunked_attention_is_the_models_dense_attention():
    q, k, v, _, _ = inputs(1)
    out = fast_jit(lambda q, k, v: attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK))(q, k, v)
    assert_close(out, fast_jit(lambda q, k, v: attention(q, k, v, H, KV))(q, k, v), n=T * D)


def test_a_query_with_no_key_to_attend_to_gives_zeros_and_finite_gradients():
    q, k, v, weights, _ = inputs(2)
    mask = jnp.zeros((B, T), bool).at[:, 5:].set(True)  # bidirectional: rows see keys 5..T
    mask = mask.at[1].set(False)  # example 1 has no key at all

    def loss(q, k, v):
        return jnp.sum(
            attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK, causal=False, key_mask=mask) * weights
        )

    out = fast_jit(
        lambda q, k, v: attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK, causal=False, key_mask=mask)
    )(q, k, v)
    assert np.all(np.asarray(out[1]) == 0)
    grads = fast_jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_the_backward_keeps_no_scores_only_qkv_output_and_log_sum_exp():
    q, k, v, weights, _ = inputs(3)

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK) * weights)

    found = find_residuals(loss, q, k, v)
    sizes = sorted(int(np.prod(f.shape)) * f.count for f in found)
    # q (B H T D), k and v chunked and repeated to H heads (B H 40 D), the output (B H T D)
    # and the log-sum-exp (B H T); never B H T T scores or probabilities.
    assert max(sizes) <= B * H * 40 * D
    assert B * H * T in sizes
    dense = find_residuals(lambda q, k, v: jnp.sum(attention(q, k, v, H, KV) * weights), q, k, v)
    assert any(int(np.prod(f.shape)) * f.count >= B * H * T * T for f in dense)


@pytest.mark.numerics
@pytest.mark.parametrize("rule", [r for r in attention_module.RULES if r != "auto"])
def test_each_remat_rule_the_installed_jax_has_gives_dense_values_gradients_and_the_same_residuals(rule):
    # defremat, the same rule written with jax.custom_gradient(remat=True) (both JAX 0.12), and a
    # plain custom_vjp (any JAX); differentiated as they are and under jax.checkpoint (where a
    # remat rule's rem runs in the backward pass).
    if rule not in attention_module.available_rules():
        pytest.skip(f"the rule {rule!r} needs JAX 0.12; installed: {jax.__version__}")
    q, k, v, weights, mask = inputs(4)

    def loss(rule=None):
        def attend(q, k, v):
            if rule is None:
                return dense_reference(q, k, v, H, KV, True, mask)
            return attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK, key_mask=mask, rule=rule)

        return lambda q, k, v: jnp.sum(attend(q, k, v) * weights)

    grad = functools.partial(jax.value_and_grad, argnums=(0, 1, 2))
    out = fast_jit(
        lambda q, k, v: {
            "dense": grad(loss())(q, k, v),
            "plain": grad(loss(rule))(q, k, v),
            "checkpointed": grad(jax.checkpoint(loss(rule)))(q, k, v),
        }
    )(q, k, v)
    for name in ("plain", "checkpointed"):
        assert_close(out[name], out["dense"], n=B * T * H * D, what=name)
    sizes = sorted(int(np.prod(f.shape)) * f.count for f in find_residuals(loss(rule), q, k, v))
    assert max(sizes) <= B * H * 40 * D and B * H * T in sizes  # as defremat's: no [T, T]


def lacking_the_remat_rules(patch):
    """A JAX without custom_vjp.defremat nor custom_gradient(remat=True), as 0.10.2 and 0.11."""
    for feature in ("custom_vjp.defremat", "custom_gradient(remat=True)"):
        patch.setitem(jaxfeatures.FEATURES, feature, ("JAX >= 0.12.0", lambda: False))


def test_a_rule_the_installed_jax_lacks_is_refused_in_one_line(monkeypatch):
    q, k, v, _, _ = inputs(5)
    valid = "valid: auto, defremat, custom_gradient, custom_vjp"
    with pytest.raises(ValueError, match=f"unknown attention remat rule 'flash'; {valid}"):
        attention(q, k, v, H, KV, kind="chunked", rule="flash")
    new = tuple(int(part) for part in jax.__version__.split(".")[:2]) >= (0, 12)
    installed = attention_module.available_rules()
    assert installed == (("defremat", "custom_gradient") if new else ()) + ("custom_vjp",)
    lacking_the_remat_rules(monkeypatch)
    assert attention_module.available_rules() == ("custom_vjp",)
    for rule in ("defremat", "custom_gradient"):
        with pytest.raises(ValueError) as error:
            attention(q, k, v, H, KV, kind="chunked", chunk=CHUNK, rule=rule)
        assert str(error.value) == (
            f"attention remat rule {rule!r} needs JAX >= 0.12.0 ({attention_module._NEEDS[rule]}); "
            f"installed: JAX {jax.__version__}; available here: custom_vjp"
        )


def test_auto_takes_the_first_rule_the_installed_jax_has(monkeypatch):
    q = inputs(5)[0]
    first = attention_module.available_rules()[0]
    calls = []
    for name in ("defremat", "custom_gradient", "custom_vjp"):
        stub = lambda *a, name=name: calls.append((name, *a)) or (lambda *x: x[0])  # noqa: E731
        monkeypatch.setitem(attention_module.RULES, name, stub)
    attention(q, q, q, H, H, kind="chunked", chunk=CHUNK)
    lacking_the_remat_rules(monkeypatch)
    attention(q, q, q, H, H, kind="chunked", chunk=CHUNK, causal=False)
    assert calls == [(first, True, CHUNK), ("custom_vjp", False, CHUNK)]


def test_compiled_temp_memory_is_a_fraction_of_dense_at_long_sequences():
    seq, heads, d = 512, 4, 16
    spec = jax.ShapeDtypeStruct((1, seq, heads * d), jnp.float32)

    def temp(fn):
        grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
        return grad.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes

    chunked = temp(lambda q, k, v: attention(q, k, v, heads, kind="chunked", chunk=64))
    dense = temp(lambda q, k, v: attention(q, k, v, heads))
    assert chunked <= dense / 4, (chunked, dense)


# --- in the models -------------------------------------------------------------------------


def chunked_and_dense(kind):
    dense = zoo.get_config(registry.get_kind(kind).small)
    return zoo.get_config(dense, attention="chunked", attention_chunk=3), dense  # T=8: 3 + 3 + 2


# Both kinds, both backends, a policy that recomputes the attention (full) and one that saves
# its named inputs (save-attn); not every combination: the op is the same in each.
CELLS = [("transformer", "full", "eqx"), ("llama", "save-attn", "nnx")]


@pytest.mark.numerics
@pytest.mark.parametrize("kind, policy, backend", CELLS)
def test_a_model_with_chunked_attention_gives_the_dense_models_loss_and_gradients(kind, policy, backend):
    chunked, dense = chunked_and_dense(kind)
    params = random_params(dense, 1)
    x = zoo.example_batch(dense, 2, seed=2, seq_len=8)
    y = labels_for(dense, x)
    want = fast_jit(jax.value_and_grad(loss_of(dense, backend)))(params, x, y)
    got = fast_jit(jax.value_and_grad(loss_of(chunked, backend, policy)))(params, x, y)
    assert_close(got, want, n=reduction_size(dense, 2))


@pytest.mark.numerics
def test_ghost_clipping_through_chunked_attention_equals_vmap_clipping():
    # and through a chunked MLP (mlp_chunk, zoo.models.ops.token_chunks), which runs whole
    # under the ghost hooks
    chunked, _ = chunked_and_dense("llama")
    chunked = zoo.get_config(chunked, mlp_chunk=3)
    params = random_params(chunked, 3)
    x = zoo.example_batch(chunked, 4, seed=4, seq_len=8)
    y = labels_for(chunked, x)
    apply = zoo.apply_fn(chunked, "nnx")

    def one(p, xi, yi):
        return per_example_loss(apply(p, xi[None]), yi[None])[0]

    want = fast_jit(lambda p: clipped_grad_sum(one, p, x, y, request=ClipRequest(0.5))[:2])(params)
    got = fast_jit(lambda p: ghost_clipped_grad_sum(chunked, p, x, y, ClipRequest(0.5))[:2])(params)
    assert_close(got, want, n=reduction_size(chunked, 4))


def test_the_attention_choice_is_checked():
    with pytest.raises(
        ZooError,
        match=r"unknown TransformerConfig.attention 'flash'.*Valid: auto, chunked, cudnn, dense, splash",
    ):
        zoo.get_config("transformer-xs", attention="flash")
    with pytest.raises(ZooError, match="attention_chunk must be a positive int"):
        zoo.get_config("llama-xs", attention="chunked", attention_chunk=0)


def test_a_chunked_model_compiles_its_step_once():
    # jax_custom_vjp3 flipped during the first trace would change JAX's cache key and compile
    # the step again on later calls (a training run did: compile_count 2); a chunked config
    # turns it on before any trace.
    from zoo.train.compiles import CompileCounter

    before = jax.config.jax_custom_vjp3
    jax.config.update("jax_custom_vjp3", False)
    try:
        cfg = zoo.get_config(registry.get_kind("transformer").small, attention="chunked", attention_chunk=8)
        # on where the rule "auto" picks needs it (JAX 0.12), left off on an older JAX
        assert jax.config.jax_custom_vjp3 == (
            attention_module.available_rules()[0] in attention_module.VJP3_RULES
        )
        params = random_params(cfg, 0)
        x = zoo.example_batch(cfg, 2, seed=1, seq_len=16)
        step = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "full")))
        with CompileCounter() as compiles, compiles.track():
            for _ in range(3):
                jax.block_until_ready(step(params, x, labels_for(cfg, x)))
        assert compiles.count == 1
    finally:
        jax.config.update("jax_custom_vjp3", before)


# --- cached reads: rows of several heads, read as they lie -----------------------------------


def rows_of(x, per_row):
    """A cache of one head to a row [B, KV, T, d] as rows of ``per_row`` heads [B, KV / p, T, p * d]."""
    b, kv, t, d = x.shape
    return jnp.swapaxes(x.reshape(b, kv // per_row, per_row, t, d), 2, 3).reshape(
        b, kv // per_row, t, per_row * d
    )


def cached_inputs(heads, kv_heads, dtype=jnp.float32, new=3, slots=16, d=8):
    keys = jax.random.split(jax.random.key(3), 5)
    q = jax.random.normal(keys[0], (2, new, heads * d), dtype)
    k, v = (jax.random.normal(key, (2, new, kv_heads * d), dtype) for key in keys[1:3])
    ck, cv = (jax.random.normal(key, (2, kv_heads, slots, d), dtype) for key in keys[3:])
    return q, k, v, ck, cv, jnp.array([0, 5]), jnp.int32(10)  # row 1's slots 0-4 are padding


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["dense", "chunked"])
@pytest.mark.parametrize("heads, kv_heads, per_row", [(4, 4, 2), (4, 4, 4), (8, 4, 2), (8, 2, 2)])
def test_a_cached_read_of_rows_of_several_heads_equals_one_head_to_a_row(heads, kv_heads, per_row, kind):
    q, k, v, ck, cv, pad, slot = cached_inputs(heads, kv_heads)

    @fast_jit  # compiled, as decoding runs it: one program a cache layout, not an op at a time
    def read(ck, cv, q, k, v, pad, slot):
        cache = attention_module.CacheSlice(ck, cv, pad, slot)
        return attention(q, k, v, heads, kv_heads, kind=kind, chunk=4, cache=cache)

    one = read(ck, cv, q, k, v, pad, slot)
    rows = read(rows_of(ck, per_row), rows_of(cv, per_row), q, k, v, pad, slot)
    assert_close(rows, one, n=per_row * 8 + 16)  # the terms of a score, and of an output
    # and a head reads its own keys: one head's cached keys changed changes that head alone
    changed = read(rows_of(ck.at[:, 1].add(1.0), per_row), rows_of(cv, per_row), q, k, v, pad, slot)
    moved = np.abs(np.asarray(changed - rows)).reshape(2, 3, heads, -1).max(axis=(0, 1, 3)) > 1e-6
    group = heads // kv_heads
    assert moved.tolist() == [h // group == 1 for h in range(heads)]


def test_a_cached_read_takes_a_bf16_cache_as_it_is_and_accumulates_in_float32():
    from zoo.jaxprs import iter_eqns

    q, k, v, ck, cv, pad, slot = cached_inputs(8, 4, jnp.bfloat16)
    ck, cv = rows_of(ck, 2), rows_of(cv, 2)

    def read(q, k, v, ck, cv):
        return attention(q, k, v, 8, 4, cache=attention_module.CacheSlice(ck, cv, pad, slot))

    eqns = list(iter_eqns(jax.make_jaxpr(read)(q, k, v, ck, cv)))
    reads = [
        e for e in eqns if e.primitive.name == "dot_general" and ck.shape in [x.aval.shape for x in e.invars]
    ]
    assert len(reads) == 2  # the scores and the values
    for eqn in reads:
        assert [str(x.aval.dtype) for x in eqn.invars] == ["bfloat16", "bfloat16"]
        assert str(eqn.outvars[0].aval.dtype) == "float32"
    upcasts = [
        e for e in eqns if e.primitive.name == "convert_element_type" and e.invars[0].aval.shape == ck.shape
    ]
    assert not upcasts
