"""Generation with the key/value cache (``zoo.generate``) against the path ``zoo sample`` took
before it: tokens per second, cache bytes per sequence, compile times, and greedy agreement
with ``transformers`` on every Hugging Face fixture.

    .venv/bin/python benchmarks/generate/generate.py [--models transformer-s,gpt2-124m] [--batches 1,8]
        [--prompt 512] [--new 256] [--old-tokens 4] [--agreement]

Models: ``transformer-s`` with ``max_len`` raised to prompt + new (its preset has 128
positions), and a random checkpoint of GPT-2 small's shapes (124M parameters, 1024 learned
positions, tied head: ``canonical.init_params``, nothing written to disk). Both float32, NNX.

The old path (``zoo/commands/sample.py`` before issue 39, copied here as :func:`old_next_token`)
runs the whole model over a fixed ``[1, max_len]`` window for every new token, from a Python
loop, one sequence at a time. Its per-token cost does not depend on how far the text has got,
so it is timed over ``--old-tokens`` tokens after two untimed ones (``zoo.bench.common.time_in_rounds``:
the warm-up, which compiles, and the round's untimed step); a batch of B sequences
costs B times one (its tokens per second are those of batch 1). The cached path is timed on a
call after a shorter one in the same buckets (which compiles): prefill plus the decode loop,
all ``--new`` tokens, greedy, no EOS. Compile times are ahead-of-time (``lower().compile()``)
before either runs. One JSON line per row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import zoo
from zoo.bench.common import time_in_rounds
from zoo.generate import Model, generate, loop
from zoo.generate.sampling import Sampling
from zoo.models import canonical, decode
from zoo.models.transformer.config import TransformerConfig

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf"


def config(name: str, prompt: int, new: int) -> TransformerConfig:
    if name == "gpt2-124m":
        return TransformerConfig(
            vocab_size=50257, d_model=768, num_heads=12, num_layers=12, d_ff=3072, max_len=1024,
            attn_bias=True, tie_head=True,
        )  # fmt: skip
    return zoo.get_config(name, max_len=max(zoo.get_config(name).max_len, prompt + new))


def old_next_token(cfg):
    """The per-token step of the old ``zoo sample`` (greedy)."""
    apply = zoo.apply_fn(cfg, "nnx")

    @jax.jit
    def next_token(params, tokens, position):
        return jnp.argmax(apply(params, tokens[None])[0, position])

    return next_token


def old_tokens_per_s(cfg, params, prompt_ids, tokens: int) -> float:
    step = old_next_token(cfg)
    ids, window = list(prompt_ids), cfg.max_len

    def one():
        context = ids[-window:]
        x = np.zeros(window, np.int32)
        x[: len(context)] = context
        ids.append(int(step(params, x, len(context) - 1)))

    def steps(n: int) -> None:
        for _ in range(n):
            one()

    seconds = time_in_rounds({"old": steps}, rounds=1, steps_per_round=tokens)["old"][0]  # compiled first
    return 1 / seconds


def compile_seconds(cfg, params, prompts, new: int) -> dict:
    """Lowering plus XLA compile of the prefill and the decode loop, ahead of time."""
    m = Model(cfg, "nnx", params)
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width = loop.bucket(int(lengths.max()))
    padded = np.zeros((len(prompts), width), np.int32)
    static = dict(length=width + loop.bucket(new), new=loop.bucket(new), keep_logits=False)
    t0 = time.perf_counter()
    pre = loop.prefill.lower(cfg, "nnx", params, padded, lengths, np.uint32(0), **static).compile()
    t1 = time.perf_counter()
    state = pre(params, padded, lengths, np.uint32(0))
    stops = np.full(8, -1, np.int32)
    t2 = time.perf_counter()
    loop.decode_steps.lower(
        cfg, "nnx", Sampling(0.0), params, state, np.int32(new), stops, width=width
    ).compile()
    t3 = time.perf_counter()
    del m
    return {"prefill_compile_s": round(t1 - t0, 2), "decode_compile_s": round(t3 - t2, 2)}


def cached(cfg, params, prompts, new: int) -> dict:
    m = Model(cfg, "nnx", params)
    generate(m, prompts, max_new_tokens=new // 2 + 1, temperature=0)  # same buckets: compiled
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width = loop.bucket(int(lengths.max()))
    padded = np.zeros((len(prompts), width), np.int32)
    static = dict(length=width + loop.bucket(new), new=loop.bucket(new), keep_logits=False)
    start = time.perf_counter()  # the prefill alone, to split the time
    jax.block_until_ready(loop.prefill(cfg, "nnx", params, padded, lengths, np.uint32(0), **static))
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    out = generate(m, prompts, max_new_tokens=new, temperature=0)
    total = time.perf_counter() - start
    made = sum(len(t) for t in out.tokens)
    return {
        "tokens": made,
        "seconds": round(total, 3),
        "tokens_per_s": round(made / total, 2),
        "prefill_s": round(prefill_s, 3),
        "decode_tokens_per_s": round(made / max(total - prefill_s, 1e-9), 2),
    }


def cache_row(cfg, batch: int, prompt: int, new: int) -> dict:
    slots = loop.bucket(prompt) + loop.bucket(new)
    spec = decode.cache_spec(cfg)
    formula = 2 * cfg.num_layers * (prompt + new) * spec.kv_heads(cfg) * spec.head_dim(cfg) * 4
    allocated = decode.init_cache(cfg, batch, slots, jnp.float32)
    return {
        "cache_bytes_per_seq": (allocated.k.nbytes + allocated.v.nbytes) // batch,
        "cache_slots": slots,
        "formula_bytes_T_prompt_plus_new": formula,
        "formula_bytes_T_slots": decode.cache_bytes(cfg, slots, jnp.float32),
    }


def agreement() -> list[dict]:
    from safetensors.numpy import load_file

    from zoo.generate.stops import config_eos
    from zoo.models import hf_io

    rows = []
    for path in sorted(p for p in FIXTURES.iterdir() if (p / "generate.safetensors").is_file()):
        cfg, params = hf_io.load(path)
        ref = load_file(str(path / "generate.safetensors"))
        for which in sorted({k.split(".")[0] for k in ref}):
            for backend in zoo.BACKENDS:
                out = generate(
                    Model(cfg, backend, params),
                    [ref[f"{which}.prompt"].tolist()],
                    max_new_tokens=16,
                    temperature=0,
                    stop_tokens=config_eos(path),
                )
                want = ref[f"{which}.tokens"].tolist()
                got = list(out.tokens[0])
                equal = sum(a == b for a, b in zip(got, want, strict=False))
                rows.append(
                    {"fixture": path.name, "prompt": len(ref[f"{which}.prompt"]), "backend": backend,
                     "equal": equal, "generated": len(want), "same_length": len(got) == len(want)}
                )  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="transformer-s,gpt2-124m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--old-tokens", type=int, default=4)
    ap.add_argument("--agreement", action="store_true", help="only greedy agreement on the HF fixtures")
    args = ap.parse_args()
    if args.agreement:
        for row in agreement():
            print(json.dumps(row), flush=True)
        return
    for name in args.models.split(","):
        cfg = config(name, args.prompt, args.new)
        params = canonical.init_params(cfg, 0)
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, cfg.vocab_size, args.prompt).tolist()
        old = old_tokens_per_s(cfg, params, prompt, args.old_tokens)
        for batch in map(int, args.batches.split(",")):
            prompts = [rng.integers(0, cfg.vocab_size, args.prompt).tolist() for _ in range(batch)]
            row = {"model": name, "params": zoo.param_count(params), "max_len": cfg.max_len, "batch": batch,
                   "prompt": args.prompt, "new": args.new}  # fmt: skip
            row |= {"old_tokens_per_s": round(old, 3), "old_tokens_timed": args.old_tokens}
            compiles = compile_seconds(cfg, params, prompts, args.new)  # first: nothing cached yet
            row |= cached(cfg, params, prompts, args.new)
            row["speedup"] = round(row["tokens_per_s"] / old, 1)
            row |= cache_row(cfg, batch, args.prompt, args.new)
            row |= compiles
            print(json.dumps(row), flush=True)
        del params


if __name__ == "__main__":
    main()
