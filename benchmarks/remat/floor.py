"""How low can per-block remat go at transformer-s's shape? (docs/remat.md, "Why `full` is above 15%")

A plain-JAX stand-in for transformer-s (L=4, batch 16 x seq 128, d_model 128, 4 heads, d_ff 512,
vocab 128) with an AdamW step, compiled (not run) five ways:

* ``none``: no checkpoint;
* ``full``: the scan body under ``nothing_saveable``, as zoo's ``full`` does it;
* ``lean``: as zoo's ``full-lean``: ``full``, and the block's replay keeps only matmul outputs;
* ``sub``: as ``full``, and inside the block the attention half and the MLP half are each
  checkpointed again, so the backward pass of one block replays one half at a time;
* ``sub-lean``: as ``sub``, with each half's replay keeping only matmul outputs.

Prints XLA's compiled temp memory and its ratio to ``none``:

    .venv/bin/python benchmarks/remat/floor.py
"""

import jax
import jax.numpy as jnp
import optax

L, B, T, D, H, F, V = 4, 16, 128, 128, 4, 512, 128
NOTHING = jax.checkpoint_policies.nothing_saveable
DOTS = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def attention_half(p, x):
    h = layer_norm(x)
    heads = lambda t: t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = (heads(h @ p[name]) for name in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / (D // H) ** 0.5
    scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -1e9)
    context = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    return x + context @ p["o"]


def mlp_half(p, x):
    return x + jax.nn.gelu(layer_norm(x) @ p["up"]) @ p["down"]


def make_loss(mode: str):
    attn, mlp = attention_half, mlp_half
    if mode.startswith("sub"):
        inner = DOTS if mode == "sub-lean" else NOTHING
        attn, mlp = jax.checkpoint(attn, policy=inner), jax.checkpoint(mlp, policy=inner)

    def block(x, p):
        return mlp(p, attn(p, x)), None

    if mode == "lean":
        block = jax.checkpoint(block, policy=DOTS)  # prevent_cse=True (the default) matters
    if mode != "none":
        block = jax.checkpoint(block, policy=NOTHING)

    def loss(params, tokens, labels):
        x, _ = jax.lax.scan(block, params["embed"][tokens], params["blocks"])
        logits = layer_norm(x) @ params["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss


def main() -> None:
    shapes = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "up": (D, F), "down": (F, D)}
    params = {
        "embed": jnp.zeros((V, D)),
        "head": jnp.zeros((D, V)),
        "blocks": {name: jnp.zeros((L, *shape)) for name, shape in shapes.items()},
    }
    tokens = jnp.zeros((B, T), jnp.int32)
    optimizer = optax.adamw(1e-3)
    opt_state = optimizer.init(params)
    temp = {}
    for mode in ("none", "full", "lean", "sub", "sub-lean"):
        loss = make_loss(mode)

        def step(p, s, tokens, labels, loss=loss):
            updates, s = optimizer.update(jax.grad(loss)(p, tokens, labels), s, p)
            return optax.apply_updates(p, updates), s

        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, tokens, tokens).compile()
        temp[mode] = compiled.memory_analysis().temp_size_in_bytes
        print(f"{mode:8s} {temp[mode] / 2**20:6.1f} MiB  {temp[mode] / temp['none']:.3f} of none")


if __name__ == "__main__":
    main()
