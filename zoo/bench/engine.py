"""``zoo bench engine``: the zoo train step (:mod:`zoo.train.engine`) against a hand-written
pure-JAX step.

Both steps see the same params, batch and optax optimizer, and run side by side in one
process, taking turns in timed rounds; the ratio is the median over rounds of zoo time over
hand-written time.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import optax

from zoo import recipes
from zoo.bench.common import median_ratio, positive_int, state_stepper, time_in_rounds
from zoo.errors import ZooError
from zoo.train.run import build_run, train_batch
from zoo.train.state import TrainState
from zoo.ui import emit_json, print_table


def _mlp_logits(params, x, cfg):
    act = {"gelu": jax.nn.gelu, "tanh": jnp.tanh, "relu": jax.nn.relu}[cfg.activation]
    h = act(x @ params["in_proj"]["w"] + params["in_proj"]["b"])

    def layer(h, p):
        return act(h @ p["w"] + p["b"]), None

    h, _ = jax.lax.scan(layer, h, params["blocks"]["dense"])
    return h @ params["head"]["w"] + params["head"]["b"]


def _layer_norm(x, p, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["b"]


def _transformer_logits(params, x, cfg):
    if cfg.takes_features:
        h = x @ params["embed"]["w"] + params["embed"]["b"]
    else:
        h = params["embed"]["w"][x]
    seq = x.shape[1]
    h = h + params["pos"]["w"][:seq]
    heads, d_head = cfg.num_heads, cfg.d_model // cfg.num_heads
    mask = jnp.tril(jnp.ones((seq, seq), bool))

    def layer(h, p):
        a = _layer_norm(h, p["ln1"])
        q, k, v = (
            jnp.einsum("btd,de->bte", a, p["attn"][n]["w"]).reshape(*a.shape[:2], heads, d_head)
            for n in "qkv"
        )
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d_head)
        s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(h.shape)
        h = h + ctx @ p["attn"]["o"]["w"]
        m = _layer_norm(h, p["ln2"])
        m = jax.nn.gelu(m @ p["mlp"]["up"]["w"] + p["mlp"]["up"]["b"])
        return h + m @ p["mlp"]["down"]["w"] + p["mlp"]["down"]["b"], None

    h, _ = jax.lax.scan(layer, h, params["blocks"])
    h = _layer_norm(h, params["ln_f"])
    if cfg.is_classifier:
        h = h.mean(1)
    return h @ params["head"]["w"] + params["head"]["b"]


# The reference forward of each model kind, written out by hand on canonical params.
HAND_WRITTEN = {"mlp": _mlp_logits, "transformer": _transformer_logits}


def hand_written_step(cfg, optimizer):
    """A plain-JAX train step: forward written out by hand, no zoo code in the loop."""
    if cfg.kind not in HAND_WRITTEN:
        raise ZooError(
            f"no hand-written reference step for model kind {cfg.kind!r}; have: {', '.join(HAND_WRITTEN)}"
        )
    forward = HAND_WRITTEN[cfg.kind]

    def loss(params, batch):
        logits = forward(params, batch["x"], cfg)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return ce.reshape(ce.shape[0], -1).mean()

    def step(state, batch):
        value, grads = jax.value_and_grad(loss)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return TrainState(
            state.step + 1, optax.apply_updates(state.params, updates), opt_state, state.rng
        ), value

    return jax.jit(step, donate_argnames="state")


def bench_engine(recipe_name: str, backend: str, *, steps: int = 20, repeats: int = 7) -> dict:
    recipe = recipes.override(recipes.load_recipe(recipe_name), {"model": {"backend": backend}})
    run = build_run(recipe)
    batch = jax.device_put(train_batch(run, 0))
    zoo_state, frozen = run.engine.init_state(run.params, 0)
    ref_state = TrainState.create(jax.tree_util.tree_map(jnp.copy, run.params), run.engine.optimizer, 0)
    ref = hand_written_step(run.cfg, run.engine.optimizer)
    runs = {"zoo": {"state": zoo_state}, "hand": {"state": ref_state}}
    times = time_in_rounds(
        {
            "zoo": state_stepper(lambda s: run.engine.train_step(s, frozen, batch), runs["zoo"]),
            "hand": state_stepper(lambda s: ref(s, batch), runs["hand"]),
        },
        repeats,
        steps,
    )
    zoo_ms, ref_ms = statistics.median(times["zoo"]) * 1e3, statistics.median(times["hand"]) * 1e3
    return {
        "recipe": recipe_name,
        "backend": backend,
        "batch": int(batch["x"].shape[0]),
        "zoo_step_ms": zoo_ms,
        "hand_step_ms": ref_ms,
        "ratio": median_ratio(times["zoo"], times["hand"]),
        "repeats": repeats,
        "steps_per_repeat": steps,
    }


def run(args) -> int:
    rows = [
        bench_engine(args.recipe, b, steps=args.steps, repeats=args.repeats) for b in args.backends.split(",")
    ]
    if args.json:
        emit_json({"rows": rows})
    else:
        print_table(
            f"engine overhead: {args.recipe}",
            # Not zoo ms / hand ms: the median of each round's ratio, steadier under load.
            ["backend", "zoo ms", "hand ms", "zoo/hand (median of round ratios)"],
            [
                (r["backend"], f"{r['zoo_step_ms']:.3f}", f"{r['hand_step_ms']:.3f}", f"{r['ratio']:.3f}")
                for r in rows
            ],
        )
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("engine", help="zoo train step vs a hand-written pure-JAX step")
    p.add_argument("recipe", nargs="?", default="digits-mlp")
    p.add_argument("--backends", default="nnx,eqx")
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
