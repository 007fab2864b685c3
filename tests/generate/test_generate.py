"""``zoo.generate``: cached decoding gives the full forward's logits at every generated
position (both kinds, both backends, dense and chunked attention, GQA, tied heads, Llama 3
rope scaling), transformers' greedy tokens on the Hugging Face fixtures, each prompt's own
tokens in a padded batch, and a bounded number of compiled programs."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import zoo
from tests.conftest import random_params
from tests.numerics import assert_close, assert_close_bf16
from zoo.generate import Model, generate, loop, stream
from zoo.generate.sampling import Sampling, filtered
from zoo.generate.stops import config_eos
from zoo.lora import LoraSpec
from zoo.models import canonical, decode, hf_io
from zoo.models.llama.config import LlamaConfig
from zoo.models.paths import flat_by_path
from zoo.models.transformer.config import TransformerConfig
from zoo.train.compiles import CompileCounter

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
SMALL = dict(vocab_size=40, d_model=32, num_heads=4, num_layers=2, max_len=64)
CONFIGS = {
    "transformer": TransformerConfig(**SMALL, d_ff=64),
    "transformer-chunked": TransformerConfig(**SMALL, d_ff=64, attention="chunked", attention_chunk=4),
    "transformer-tied": TransformerConfig(**SMALL, d_ff=64, tie_head=True, attn_bias=True),
    "llama-kv1": LlamaConfig(**SMALL, d_ff=64, num_kv_heads=1),
    "llama-kv2": LlamaConfig(**SMALL, d_ff=64, num_kv_heads=2),
    "llama-kv4-chunked": LlamaConfig(
        **SMALL, d_ff=64, num_kv_heads=4, attention="chunked", attention_chunk=8
    ),
    "llama-tied": LlamaConfig(**SMALL, d_ff=64, num_kv_heads=2, tie_head=True),
    # adapters (non-zero in `model`) on q, v and the head: ops.dense adds them
    "llama-lora": LlamaConfig(
        **SMALL, d_ff=64, num_kv_heads=2, lora=LoraSpec(4, 8.0, ("blocks.attn.q", "blocks.attn.v", "head"))
    ),
    # positions past rope_original_max_len take the scaled frequencies
    "llama3-rope": LlamaConfig(
        **SMALL, d_ff=64, num_kv_heads=2, rope_scaling="llama3", rope_theta=500000.0, rope_original_max_len=8
    ),
}
PROMPTS = ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4])


@functools.cache
def model(name: str, backend: str) -> Model:
    """Random params drawn by NumPy (``random_params``: no init program to compile per config),
    every leaf non-zero: a LoRA adapter's B too, which a fresh init leaves at zero."""
    cfg = CONFIGS[name]
    params = random_params(cfg)
    assert all(np.asarray(x).any() for x in flat_by_path(params).values())
    return Model(cfg, backend, params)


def width(cfg) -> int:
    return max(cfg.d_model, cfg.d_ff, cfg.num_heads * cfg.d_head)


@pytest.mark.numerics
@pytest.mark.parametrize("backend", zoo.BACKENDS)
@pytest.mark.parametrize("name", CONFIGS)
def test_cached_logits_equal_the_full_forward_at_every_generated_position(name, backend):
    m = model(name, backend)
    out = generate(m, PROMPTS, max_new_tokens=12, temperature=0, keep_logits=True)
    apply = zoo.apply_fn(m.config, backend)
    for row, prompt in enumerate(PROMPTS):
        new = out.tokens[row]
        assert len(new) == 12 and out.stopped[row] == "length"
        full = np.asarray(apply(m.params, jnp.asarray([list(prompt) + list(new)], jnp.int32)))[0]
        expected = full[len(prompt) - 1 : len(prompt) + len(new) - 1]
        got = out.logits[row, : len(new)]
        assert_close(got, expected, n=max(len(prompt) + len(new), width(m.config)), what=f"{name} row {row}")
        assert list(new) == np.argmax(got, axis=-1).tolist()  # temperature 0 is the argmax


def bf16_run(m: Model):
    """A checkpoint as ``zoo.load_checkpoint`` gives it, of a run trained under bfloat16."""
    train = SimpleNamespace(precision="bfloat16")
    return SimpleNamespace(
        model_config=m.config, backend=m.backend, params=m.params, recipe=SimpleNamespace(train=train)
    )


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["transformer", "llama-kv2"])
def test_a_bf16_run_decodes_in_bf16_with_a_bf16_cache(name):
    """``zoo.generate`` on a checkpoint of a bf16 run applies its policy itself: the cache is
    bf16, the first new token's logits are the bf16 full forward's (``zoo.apply_fn`` under the
    same policy) under the float rule at bf16's epsilon, and every new token's agree with the
    float32 full forward under the bf16 rule (tests/numerics.py)."""
    m = model(name, "nnx")
    ckpt = bf16_run(m)
    # keep_logits as below: the stream runs the two programs the generate call runs
    _, state = next(stream(ckpt, PROMPTS, max_new_tokens=6, temperature=0, every=6, keep_logits=True))
    assert state.cache.k.dtype == state.cache.v.dtype == jnp.bfloat16
    out = generate(ckpt, PROMPTS, max_new_tokens=6, temperature=0, keep_logits=True)
    bf16, f32 = zoo.apply_fn(m.config, "nnx", precision="bfloat16"), zoo.apply_fn(m.config, "nnx")
    for row, prompt in enumerate(PROMPTS):
        new = out.tokens[row]
        n = max(len(prompt) + len(new), width(m.config))
        first = np.asarray(bf16(m.params, jnp.asarray([prompt], jnp.int32)))[0, -1]
        assert_close(out.logits[row, 0], first, n=n, dtype=jnp.bfloat16, what=f"{name} row {row}")
        full = np.asarray(f32(m.params, jnp.asarray([list(prompt) + list(new)], jnp.int32)))[0]
        expected = full[len(prompt) - 1 : len(prompt) + len(new) - 1]
        assert_close_bf16(out.logits[row, : len(new)], expected, n=n, what=f"{name} row {row}")


@pytest.mark.parametrize("name", ["transformer", "llama-kv2"])
def test_a_padded_batch_gives_each_prompt_its_own_tokens(name):
    m = model(name, "nnx")
    prompts = [PROMPTS[1], [5], PROMPTS[0], list(range(1, 30))]
    batch = generate(m, prompts, max_new_tokens=9, temperature=0)
    for row, prompt in enumerate(prompts):
        assert batch.tokens[row] == generate(m, [prompt], max_new_tokens=9, temperature=0).tokens[0]


def test_a_seed_reproduces_a_sample_and_rows_draw_alone():
    m = model("llama-kv2", "nnx")
    kw = dict(max_new_tokens=10, temperature=1.0, seed=3)
    first, again = generate(m, PROMPTS, **kw), generate(m, PROMPTS, **kw)
    assert first == again
    assert generate(m, PROMPTS, **{**kw, "seed": 4}).tokens != first.tokens
    assert generate(m, PROMPTS[:1], **kw).tokens[0] == first.tokens[0]  # row 0, batch or not
    same = generate(m, [PROMPTS[0]] * 2, **kw).tokens  # the batch above's two programs
    assert same[0] != same[1]  # --num-samples: the rows of one prompt draw apart


def test_top_k_1_and_a_tiny_top_p_are_greedy():
    m = model("transformer", "eqx")
    # keep_logits: the prefill and greedy decode programs of the cached-logits test's run
    greedy = generate(m, PROMPTS, max_new_tokens=10, temperature=0, keep_logits=True).tokens
    assert generate(m, PROMPTS, max_new_tokens=10, temperature=1.5, top_k=1, seed=1).tokens == greedy
    assert generate(m, PROMPTS, max_new_tokens=10, temperature=1.5, top_p=1e-6, seed=1).tokens == greedy


def test_top_k_and_top_p_keep_what_they_say():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 50)), jnp.float32)
    kept = np.isfinite(np.asarray(filtered(logits, Sampling(1.0, top_k=7))))
    assert (kept.sum(-1) == 7).all()
    x = np.asarray(filtered(logits, Sampling(0.5, top_p=0.6)))
    for row, got in zip(np.asarray(logits) / 0.5, x, strict=True):
        p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        order = np.argsort(-p)
        need = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)  # the smallest set reaching 0.6
        assert set(np.flatnonzero(np.isfinite(got))) == set(order[:need].tolist())
    with pytest.raises(ValueError, match="top_p"):
        Sampling(1.0, top_p=0)


def test_generation_stops_at_a_stop_token_and_says_why():
    m = model("llama-kv1", "nnx")
    kw = dict(max_new_tokens=8, temperature=0, keep_logits=True)  # the cached-logits test's programs
    greedy = generate(m, PROMPTS, **kw)
    stop = greedy.tokens[0][2]
    out = generate(m, PROMPTS, stop_tokens=[stop], **kw)
    assert out.tokens[0] == greedy.tokens[0][: greedy.tokens[0].index(stop) + 1]
    assert out.stopped[0] == "eos"
    row1 = greedy.tokens[1]
    assert out.tokens[1] == (row1[: row1.index(stop) + 1] if stop in row1 else row1)


def test_stream_yields_the_tokens_of_generate():
    m = model("transformer", "nnx")
    whole = generate(m, PROMPTS, max_new_tokens=11, temperature=0).tokens
    rows = [[], []]
    for new, _ in stream(m, PROMPTS, max_new_tokens=11, temperature=0, every=3):
        for row, tokens in zip(rows, new, strict=True):
            row += tokens
    assert tuple(map(tuple, rows)) == whole


def test_compiles_one_prefill_and_one_decode_program_per_batch_and_bucket():
    cfg = TransformerConfig(**SMALL, d_ff=48)  # a config no other test compiles
    m = Model(cfg, "nnx", random_params(cfg))
    with CompileCounter() as counter:
        with counter.track():
            generate(m, [[1, 2, 3], [4] * 7, [5] * 12], max_new_tokens=5, temperature=0)
        assert counter.count == 2  # a batch of three prompts: one prefill, one decode loop
        with counter.track():  # other lengths, the same buckets (P 16, new 16)
            generate(m, [[1] * 14, [2], [3] * 9], max_new_tokens=13, temperature=0)
            generate(m, [[1] * 10, [2] * 16, [3] * 2], max_new_tokens=16, temperature=0)
        assert counter.count == 2
        with counter.track():  # a longer prompt: its own bucket
            generate(m, [[1] * 20, [2], [3]], max_new_tokens=5, temperature=0)
        assert counter.count == 4
    assert loop.bucket(1) == loop.bucket(16) == 16 and loop.bucket(17) == 32


@pytest.mark.parametrize("lanes", [1, 128], ids=["a-head-a-row", "tpu-rows"])
def test_the_cache_holds_kv_heads_and_its_bytes_are_the_formula(lanes):
    for name, per_row in (("transformer", 4), ("llama-kv1", 1), ("llama-kv2", 2), ("llama-kv4-chunked", 4)):
        cfg = CONFIGS[name]
        kv = cfg.num_kv_heads if isinstance(cfg, LlamaConfig) else cfg.num_heads
        per_row = per_row if lanes > 1 else 1
        cache = decode.init_cache(cfg, 2, 48, jnp.float32, lanes)
        assert cache.k.shape == (cfg.num_layers, 2, kv // per_row, 48, per_row * cfg.d_head)
        per_sequence = (cache.k.nbytes + cache.v.nbytes) // 2
        assert (
            decode.cache_bytes(cfg, 48, jnp.float32)
            == per_sequence
            == 2 * cfg.num_layers * 48 * kv * cfg.d_head * 4
        )


@pytest.mark.parametrize(
    "kv_heads, head_dim, per_row",
    # GPT-2 small, Llama 3.2 1B, 3B and 8B, Qwen-like 80-wide heads, heads that cannot pair
    [
        (12, 64, 2),
        (8, 64, 2),
        (8, 128, 1),
        (8, 256, 1),
        (8, 80, 1),
        (4, 8, 4),
        (6, 16, 6),
        (5, 64, 1),
        (1, 64, 1),
    ],
)
def test_a_cache_row_holds_the_most_heads_that_divide_kv_and_fit_128_lanes(kv_heads, head_dim, per_row):
    assert decode.heads_per_row(kv_heads, head_dim) == per_row
    assert decode.heads_per_row(kv_heads, head_dim, lanes=head_dim) == 1


def test_on_a_tpu_gpt2_small_and_llama_1b_caches_are_rows_of_128_lanes():
    assert decode.row_lanes("tpu") == 128 and decode.row_lanes("cpu") == decode.row_lanes("gpu") == 1
    tpu = decode.row_lanes("tpu")
    for name, rows in (("gpt2-124m", 6), ("llama-1b", 4)):
        cfg = zoo.get_config(name)
        shape = jax.eval_shape(lambda cfg=cfg: decode.init_cache(cfg, 64, 640, jnp.bfloat16, tpu)).k.shape
        assert shape == (cfg.num_layers, 64, rows, 640, 128)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["transformer", "llama-kv2", "llama-kv4-chunked"])
def test_rows_of_several_heads_decode_what_one_head_to_a_row_decodes(name, monkeypatch):
    """A TPU's cache (rows of 128 lanes: 4, 2 and 4 heads to a row here) through the whole
    prefill and decode loop, on this CPU: the same tokens and, under the float rule, logits."""
    m = model(name, "nnx")
    one = generate(m, PROMPTS, max_new_tokens=6, temperature=0, keep_logits=True)
    monkeypatch.setattr(decode, "row_lanes", lambda platform=None: 128)
    rows = generate(m, PROMPTS, max_new_tokens=6, temperature=0, keep_logits=True)
    assert rows.tokens == one.tokens
    assert_close(rows.logits, one.logits, n=max(max(map(len, PROMPTS)) + 6, width(m.config)))


@pytest.mark.parametrize(
    "name,limit", [("transformer", "max_len=64"), ("llama-kv2", "max_len (max_position_embeddings)=64")]
)
def test_a_prompt_and_new_tokens_beyond_the_positions_are_refused_in_one_line(name, limit):
    m = model(name, "nnx")
    with pytest.raises(ValueError, match="beyond the model's") as error:
        generate(m, [list(range(1, 40)), [1]], max_new_tokens=30)
    text = str(error.value)
    assert "\n" not in text and limit in text and "prompt 0 (39 tokens) + 30 new tokens = 69" in text
    generate(m, [list(range(1, 40))], max_new_tokens=25, temperature=0)  # 64 exactly: allowed


def test_models_that_cannot_generate_say_so():
    with pytest.raises(ValueError, match="classify"):
        decode.cache_spec(zoo.get_config("transformer-digits"))
    with pytest.raises(ValueError, match="registers no decode cache"):
        decode.cache_spec(zoo.get_config("mlp-s"))
    m = model("transformer", "nnx")
    for bad, match in (([[]], "non-empty"), ([[40]], "outside the vocabulary"), ([], "no prompts")):
        with pytest.raises(ValueError, match=match):
            generate(m, bad, max_new_tokens=2)


def _generation_fixtures():
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "generate.safetensors").is_file())


@functools.cache
def _imported(name: str):
    return hf_io.load(FIXTURES / name)


@pytest.mark.parametrize("backend", zoo.BACKENDS)
@pytest.mark.parametrize("name", _generation_fixtures())
def test_greedy_tokens_equal_transformers_generate(name, backend):
    """``generate(do_sample=False, max_new_tokens=16)`` of transformers, recorded by
    make_fixtures.py on a short and (where it fits) a 300-token prompt; EOS from the config."""
    cfg, params = _imported(name)
    ref = load_file(str(FIXTURES / name / "generate.safetensors"))
    prompts = sorted({k.split(".")[0] for k in ref})
    assert "short" in prompts
    for which in prompts:
        out = generate(
            Model(cfg, backend, params),
            [ref[f"{which}.prompt"].tolist()],
            max_new_tokens=16,
            temperature=0,
            stop_tokens=config_eos(FIXTURES / name),
        )
        assert list(out.tokens[0]) == ref[f"{which}.tokens"].tolist(), (name, which)


def test_every_hf_fixture_has_generation_references_and_two_have_long_prompts():
    names = _generation_fixtures()
    assert {"gpt2", "llama-kv1", "llama-kv2", "llama-kv4", "llama3-tied", "llama-bf16"} <= set(names)
    long = [n for n in names if "long.prompt" in load_file(str(FIXTURES / n / "generate.safetensors"))]
    assert {"gpt2-long", "llama-long", "llama3-tied"} <= set(long)


def test_a_chunked_copy_of_a_dense_config_decodes_the_same_tokens():
    m = model("llama-kv2", "eqx")
    chunked = dataclasses.replace(m.config, attention="chunked", attention_chunk=4)
    # keep_logits: the dense run is the cached-logits test's programs
    dense = generate(m, PROMPTS, max_new_tokens=10, temperature=0, keep_logits=True).tokens
    assert (
        generate(Model(chunked, "eqx", m.params), PROMPTS, max_new_tokens=10, temperature=0).tokens == dense
    )


def test_a_new_kind_generates_by_registering_its_cache():
    """A kind (here the transformer's modules under a config class of its own) is refused
    until it registers a cache, and then decodes the full forward's greedy tokens."""
    from zoo.models import registry

    @dataclasses.dataclass(frozen=True)
    class ToyLM(TransformerConfig):
        kind = "toylm"

    cfg = ToyLM(**SMALL, d_ff=32)
    classes = dict(nnx="zoo.models.transformer.nnx:Transformer", eqx="zoo.models.transformer.eqx:Transformer")
    for cache in (None, "zoo.models.transformer.cache:CACHE"):
        registry.register(ToyLM, **classes, presets={}, small=cfg, cache=cache)
        try:
            m = Model(cfg, "eqx", random_params(cfg))
            if cache is None:
                with pytest.raises(ValueError, match="'toylm' registers no decode cache"):
                    generate(m, PROMPTS, max_new_tokens=4)
                continue
            out = generate(m, PROMPTS[:1], max_new_tokens=6, temperature=0)
            # jitted: one program per length (the eager forward compiles each op at each length)
            ids, apply = list(PROMPTS[0]), jax.jit(zoo.apply_fn(cfg, "eqx"))
            for _ in range(6):
                ids.append(int(np.argmax(apply(m.params, jnp.asarray([ids], jnp.int32))[0, -1])))
            assert list(out.tokens[0]) == ids[len(PROMPTS[0]) :]
        finally:
            registry.unregister("toylm")


@pytest.mark.parametrize("temperature", [1e-45, 5e-324, 1e-6])
def test_a_tiny_temperature_samples_greedily(temperature):
    """Under GREEDY_BELOW a draw is the argmax: logits / T would overflow float32 (a denormal
    T gave tokens that had nothing to do with greedy)."""
    m = model("transformer", "nnx")
    greedy = generate(m, PROMPTS, max_new_tokens=8, temperature=0).tokens
    assert generate(m, PROMPTS, max_new_tokens=8, temperature=temperature, seed=2).tokens == greedy


@pytest.mark.parametrize(
    "kw, fragments",
    [
        ({"seed": -1}, ["seed must be a whole number in [0, 4294967295]", "got -1"]),
        ({"seed": 2**32}, ["seed must be", "got 4294967296"]),
        ({"stop_tokens": [2**40]}, ["stop token must be a token id", "[0, 40)", "got 1099511627776"]),
        ({"stop_tokens": [-1]}, ["stop token", "got -1"]),
    ],
)
def test_a_seed_or_stop_token_out_of_range_is_one_value_error(kw, fragments):
    m = model("transformer", "nnx")
    with pytest.raises(ValueError) as error:
        generate(m, PROMPTS, max_new_tokens=2, **kw)
    text = str(error.value)
    assert "\n" not in text and all(f in text for f in fragments), text


def test_stop_tokens_past_the_vocabulary_are_named_in_a_warning_and_stop_nothing():
    m = model("transformer", "nnx")
    greedy = generate(m, PROMPTS, max_new_tokens=6, temperature=0)
    with pytest.warns(UserWarning, match=r"stop token\(s\) 40, 99 lie outside the vocabulary \[0, 40\)"):
        out = generate(m, PROMPTS, max_new_tokens=6, temperature=0, stop_tokens=[99, 40])
    assert out == greedy


def test_generation_is_reached_from_the_top_level_package():
    """``import zoo; zoo.generate.generate(...)``, in a fresh interpreter (here zoo.generate is
    imported already), as ``zoo.load_checkpoint`` is."""
    code = (
        "import zoo\n"
        "from zoo.models.transformer.config import TransformerConfig\n"
        "cfg = TransformerConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=1, max_len=32, d_ff=8)\n"
        "m = zoo.generate.Model(cfg, 'nnx', zoo.models.canonical.init_params(cfg, 0))\n"
        "print(len(zoo.generate.generate(m, [[1, 2]], max_new_tokens=3, temperature=0).tokens[0]))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr[-2000:]


def test_numpy_integers_are_taken_wherever_python_ints_are():
    """Issue 60, item 8: ``max_new_tokens=np.int64(3)`` raised AttributeError (``bit_length``)
    while ``seed=np.int64(3)`` worked; a NumPy seed for fresh params was taken for a key."""
    cfg = TransformerConfig(vocab_size=20, d_model=16, num_heads=2, num_layers=1, d_ff=16, max_len=32)
    params = canonical.init_params(cfg, np.int64(3))
    same = jax.tree.leaves(canonical.init_params(cfg, 3))
    assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(params), same, strict=True))
    m = Model(cfg, "nnx", params)
    ints = dict(max_new_tokens=3, top_k=5, seed=2)
    numpy = dict(max_new_tokens=np.int64(3), top_k=np.int32(5), seed=np.uint32(2))
    assert generate(m, [[1, 2, 3]], **numpy) == generate(m, [[1, 2, 3]], **ints)


@pytest.mark.numerics
@pytest.mark.parametrize("backend", zoo.BACKENDS)
@pytest.mark.parametrize("name", ["transformer", "llama-kv2"])
def test_decoding_runs_the_blocks_own_call(monkeypatch, name, backend):
    """A change planted in the block's forward (its output halved) reaches the decoded logits,
    which still equal the (changed) full forward's: prefill and decode run the block's own
    ``__call__``, not a copy of its math. Last in the file: clearing JAX's caches makes every
    later test trace and compile again what it would have found compiled."""
    m = model(name, backend)
    block = importlib.import_module(f"zoo.models.{m.config.kind}.{backend}").Block
    original = block.__call__

    def halved(self, x, *rest, **kw):
        out = original(self, x, *rest, **kw)
        return (0.5 * out[0], out[1]) if isinstance(out, tuple) else 0.5 * out

    apply = jax.jit(zoo.apply_fn(m.config, backend))  # traced again after each clear_caches
    ids = jnp.asarray([PROMPTS[0]], jnp.int32)
    unchanged = np.asarray(apply(m.params, ids))[0, -1]
    monkeypatch.setattr(block, "__call__", halved)
    jax.clear_caches()  # trace the decode programs again, with the planted block
    try:
        out = generate(m, PROMPTS[:1], max_new_tokens=1, temperature=0, keep_logits=True)
        planted = np.asarray(apply(m.params, ids))[0, -1]
    finally:
        jax.clear_caches()  # nothing compiled with the plant outlives the test
    assert not np.allclose(planted, unchanged, atol=1e-3)  # the plant changes the model
    assert_close(out.logits[0, 0], planted, n=max(len(PROMPTS[0]), width(m.config)), what=name)
